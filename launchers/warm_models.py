"""The committed warm starts: where they are, and their files checked against BUILD.json.

`--model`'s default (launchers/models.py) and setup.sh need only this: the folders under models/
and the sha256 check, never the builders. The builders (capture through the real agent and the
proxy, then SFT) run rollouts, so they live with what they use, in harness/warm/; this module
imports no harness (tests/test_import_graph.py), and a BUILD.json's `built_by` is the command
below that rebuilds it.

- models/tiny-qwen3-create-file: the default (mini-swe-agent, or no --harness), `REBUILD`.
- models/tiny-qwen3-create-file-{codex,opencode,claude-code}: that --harness's default,
  `rebuild_command(harness)`.
- models/tiny-qwen3-lookup: the default of mini-swe-agent on lookup:*, `LOOKUP_REBUILD`.
"""

from __future__ import annotations

from pathlib import Path

from launchers.paths import REPO_ROOT
from launchers.tiny_model import TinyModelError, check_build_hashes

__all__ = ["AGENTS", "AGENT_WARM_MODELS", "LOOKUP_MODEL", "LOOKUP_REBUILD", "REBUILD",
           "WARM_MODEL", "committed_agent_warm_model", "committed_lookup_model",
           "committed_warm_model", "rebuild_command"]

WARM_MODEL = REPO_ROOT / "models" / "tiny-qwen3-create-file"
REBUILD = "python -m harness.warm.create_file --commit"
# The agents with their own build committed (the default model of that --harness).
AGENTS = ("codex", "claude-code", "opencode")
AGENT_WARM_MODELS = {h: REPO_ROOT / "models" / f"tiny-qwen3-create-file-{h}" for h in AGENTS}
LOOKUP_MODEL = REPO_ROOT / "models" / "tiny-qwen3-lookup"
LOOKUP_REBUILD = "python -m harness.warm.lookup --commit"


def rebuild_command(harness: str) -> str:
    return f"python -m harness.warm.agents --harness {harness} --commit"


def _checked(directory: Path, rebuild: str) -> Path:
    if not (directory / "BUILD.json").exists():
        raise TinyModelError(f"{directory} has no BUILD.json: restore it (git checkout -- "
                             f"{directory}) or rebuild it with `{rebuild}`")
    check_build_hashes(directory, rebuild=rebuild)
    return directory


def committed_warm_model(directory: Path = WARM_MODEL) -> Path:
    """The committed warm-started model, every file checked against its BUILD.json sha256."""
    return _checked(directory, REBUILD)


def committed_agent_warm_model(harness: str, directory: Path | None = None) -> Path:
    """The committed warm start for `harness` (or the build in `directory`), every file checked
    against its BUILD.json."""
    if harness not in AGENT_WARM_MODELS:
        raise ValueError(f"no agent warm start for {harness!r}; there are "
                         f"{sorted(AGENT_WARM_MODELS)} (mini-swe-agent's is {WARM_MODEL.name})")
    return _checked(directory or AGENT_WARM_MODELS[harness], rebuild_command(harness))


def committed_lookup_model(directory: Path = LOOKUP_MODEL) -> Path:
    """The committed lookup warm start, every file checked against its BUILD.json sha256."""
    return _checked(directory, LOOKUP_REBUILD)
