"""Check a run's settings before any process starts, and report every problem at once.

`harness.train` and `harness.eval` call `preflight()` first: each check is cheap (imports, a file
lookup, one HTTP GET) next to starting vLLM (~25-40 s on CPU) and building sandboxes, and a list
of every problem beats fixing them one restart at a time (torchtune's ConfigError, STYLE.md).
"""

from __future__ import annotations

from pathlib import Path

import httpx

from harness.run_config import HARNESSES, RunSettings, load_callable, parse_reward_funcs

__all__ = ["preflight"]


def _check_tasks(settings: RunSettings) -> list[str]:
    from harness.tasks import load_tasks

    try:
        tasks = load_tasks(settings.tasks, count=settings.task_count)
    except Exception as exc:  # every loader error names its fix; report it, do not crash
        return [f"--tasks {settings.tasks!r}: {exc}"]
    return [] if tasks else [f"--tasks {settings.tasks!r}: no tasks found"]


def _check_sandbox(settings: RunSettings) -> list[str]:
    from harness.sandboxes.expose import SANDBOX_BACKENDS, backend_problems

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


def _check_engine(settings: RunSettings) -> list[str]:
    if settings.engine_url:
        try:
            httpx.get(settings.engine_url.rstrip("/") + "/health", timeout=5).raise_for_status()
        except httpx.HTTPError as exc:
            return [f"--engine-url {settings.engine_url}: not a healthy vLLM server ({exc}); "
                    "start one (python -m launchers.engine) or drop the flag to launch one here"]
        return []
    try:
        from launchers.paths import engine_python

        engine_python()
    except FileNotFoundError as exc:
        return [f"launching vLLM: {exc}"]
    return []


def _check_model(settings: RunSettings) -> list[str]:
    if settings.model is None:
        return []
    path = Path(settings.model)
    looks_like_path = settings.model.startswith((".", "/", "~")) or path.exists()
    if looks_like_path and not (path.expanduser() / "config.json").exists():
        return [f"--model {settings.model}: no config.json there; give an HF model directory"]
    return []


def _check_rewards(settings: RunSettings) -> list[str]:
    problems = []
    if settings.reward_fn:
        try:
            load_callable(settings.reward_fn)
        except Exception as exc:
            problems.append(f"--reward-fn {settings.reward_fn}: {exc}")
    try:
        names = [name for name, _, _ in parse_reward_funcs(settings.reward_funcs or [])]
        if len(set(names)) != len(names):
            problems.append(f"--reward-funcs: names must be unique, got {names}")
    except Exception as exc:
        problems.append(f"--reward-funcs {exc}")
    return problems


def _check_resume(settings: RunSettings) -> list[str]:
    if not settings.resume:
        return []
    from trainer.checkpoint import find_latest

    if find_latest(str(Path(settings.output_dir) / "trainer")) is None:
        return [f"--resume: no checkpoint under {settings.output_dir}/trainer; drop --resume to "
                "start fresh, or point --output-dir at the run to resume"]
    return []


def preflight(settings: RunSettings, *, train: bool) -> list[str]:
    """Every problem with `settings`, each naming the flag and the fix; [] when the run can start."""
    problems: list[str] = []
    if settings.harness not in HARNESSES:
        problems.append(f"--harness {settings.harness!r}: choose one of {', '.join(HARNESSES)}")
    if settings.weight_sync and settings.engine_url and train:
        # A running engine was started by someone else; it must expose the weight-transfer routes.
        problems += _check_weight_transfer_routes(settings.engine_url)
    problems += _check_model(settings)
    problems += _check_tasks(settings)
    problems += _check_sandbox(settings)
    problems += _check_engine(settings)
    if train:
        problems += _check_rewards(settings)
        problems += _check_resume(settings)
        problems += [f"trainer: {_as_flags(p)}" for p in settings.trainer_config().validate()]
        from harness.learning import before_after_problems  # it imports harness.eval (us)

        problems += before_after_problems(settings)
    if settings.max_concurrent_rollouts < 1:
        problems.append("--max-concurrent-rollouts must be >= 1")
    return problems


# Trainer config fields whose flag has another name here.
_FLAG_NAMES = {"max_steps": "--steps", "num_generations": "--num-generations",
               "max_concurrent_rollouts": "--max-concurrent-rollouts",
               "learning_rate": "--learning-rate", "max_tokens": "--max-tokens",
               "groups_per_step": "--groups-per-step", "temperature": "--temperature"}


def _as_flags(problem: str) -> str:
    field = problem.split("=", 1)[0]
    return problem.replace(field, _FLAG_NAMES[field], 1) if field in _FLAG_NAMES else problem


def _check_weight_transfer_routes(engine_url: str) -> list[str]:
    try:
        response = httpx.get(engine_url.rstrip("/") + "/openapi.json", timeout=5)
        paths = response.json().get("paths", {}) if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return []  # unreachable engines are reported by _check_engine
    if "/update_weights" not in paths:
        return [f"--engine-url {engine_url}: the engine has no weight-transfer routes; restart it "
                "with VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config '{\"backend\": \"nccl\"}' "
                "(GPU) or '{\"backend\": \"harness_gloo\"}' (CPU), or pass --no-weight-sync"]
    return []
