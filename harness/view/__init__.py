"""The run viewer: every rollout of a run directory, in the browser.

    python -m harness.view RUN_DIR                  # a finished or a running run
    python -m harness.view RUN_A --compare RUN_B    # the same tasks before / after

Training an agent is mostly asking what happened: what did the agent do in this rollout, which
tokens were trained and with what advantage, what did the verifier print, why was a group
skipped, is staleness climbing. The run directory holds every answer (harness/shared/run_records.py,
trainer metrics and group records); this package puts them on one page:

    the run         its own held-out before/after (before_after.json: per task, overall, the
                    change); settings; reward and pass rate per step; rollouts by cause and per
                    minute; staleness; time per phase; tokens trained; groups skipped by reason
    the rollouts    a table to filter and sort by side (the training rollouts, or the held-out
                    evaluation's eval-before / eval-after), task, step, cause and reward
    one rollout     the conversation turn by turn (messages, tool calls, tool results), each
                    engine turn's tokens coloured by loss mask and logprob, rewritten histories
                    as branches, aux calls marked, the verifier's rewards and output, the reward
                    functions' parts and the advantage
    before / after  two runs' rollouts of the same task side by side (--compare)

Stack: one static page of plain JavaScript (no front-end framework), uPlot for the plots
(vendored from npm, MIT, 50 kB), served with the stdlib's HTTP server on 127.0.0.1, with the run's
JSON computed on request from the files (harness/view/data.py). It reads the run directory
only: the proxy, engine and trainer need not be alive.
"""

from __future__ import annotations

import shlex
from pathlib import Path

__all__ = ["view_command"]


def view_command(run_dir: str | Path) -> str:
    """The shell command that opens the viewer on `run_dir` (train and eval print it at start)."""
    return f"python -m harness.view {shlex.quote(str(run_dir))}"
