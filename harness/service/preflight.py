"""The checks of a run's settings that need the rollout side: tasks load, the sandbox backend works.

Why they live here, apart from harness.run.preflight: tasks load through Harbor's Task and
sandboxes are its environments, so these checks import harbor, and the trainer's process must
not (tests/test_import_graph.py). They run where rollouts run:

- `harness.eval` runs rollouts in its own process and calls `rollout_problems()` beside
  `harness.run.preflight.preflight()`;
- `harness.train` starts `python -m harness.service.preflight` (settings as JSON on stdin, one
  JSON line of problems out) with the rollout service's interpreter, while its own process checks
  the rest; with --rollout-service the running services answer for themselves instead.
"""

from __future__ import annotations

import json
import sys

from harness.shared.run_config import RunSettings

__all__ = ["eval_task_problems", "rollout_problems"]


def _check_tasks(settings: RunSettings) -> list[str]:
    from harness.tasks import load_tasks

    try:
        tasks = load_tasks(settings.tasks, count=settings.task_count)
    except Exception as exc:  # every loader error names its fix; report it, do not crash
        return [f"--tasks {settings.tasks!r}: {exc}"]
    return [] if tasks else [f"--tasks {settings.tasks!r}: no tasks found"]


def _check_sandbox(settings: RunSettings) -> list[str]:
    from harness.service.sandboxes.expose import SANDBOX_BACKENDS, backend_problems

    if settings.sandbox not in SANDBOX_BACKENDS:
        return [f"--sandbox {settings.sandbox!r}: choose one of {', '.join(SANDBOX_BACKENDS)}"]
    problems = [f"--sandbox {settings.sandbox}: {p}" for p in backend_problems(settings.sandbox)]
    if SANDBOX_BACKENDS[settings.sandbox].remote and not (settings.proxy_public_url or settings.proxy_tunnel):
        problems.append(
            f"--sandbox {settings.sandbox} runs agents off this host, so they cannot reach the "
            "capture proxy on 127.0.0.1: give --proxy-public-url URL (a URL that forwards to the "
            "proxy) or --proxy-tunnel 'COMMAND {url}' (e.g. cloudflared tunnel --url {url})"
        )
    return problems


def eval_task_problems(settings: RunSettings) -> list[str]:
    """--eval-tasks loads here (harness.train's before/after evaluation: harness.run.learning)."""
    if settings.eval_tasks is None:
        return []
    from harness.tasks import load_tasks

    try:
        load_tasks(settings.eval_tasks)
    except Exception as exc:  # every loader error names its fix
        return [f"--eval-tasks {settings.eval_tasks!r}: {exc}"]
    return []


def rollout_problems(settings: RunSettings, *, train: bool) -> list[str]:
    """Every problem with --tasks and --sandbox, and --eval-tasks for a training run."""
    problems = _check_tasks(settings) + _check_sandbox(settings)
    if train:
        problems += eval_task_problems(settings)
    return problems


def _main() -> int:
    """`python -m harness.service.preflight` < settings JSON: rollout_problems as one JSON line."""
    from harness.tasks import quiet_harbor

    quiet_harbor()
    settings = RunSettings(**json.loads(sys.stdin.read()))
    print(json.dumps(rollout_problems(settings, train=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
