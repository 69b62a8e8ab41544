"""Check a run's settings before any process starts, and report every problem at once.

`harness.train` and `harness.eval` call `preflight()` first: each check is cheap (imports, a file
lookup, one HTTP GET) next to starting vLLM (~25-40 s on CPU) and building sandboxes, and a list
of every problem beats fixing them one restart at a time (torchtune's ConfigError, STYLE.md).

The checks that need harbor (tasks load, the sandbox backend) are the rollout side's:
harness.service.preflight. This module runs in the trainer's process and never imports them:
harness.train has the rollout service's interpreter run `python -m harness.service.preflight` in
a child process, and harness.eval, whose own process runs rollouts, passes them in
(`preflight(settings, train=False, rollout_problems=...)`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx

from harness.shared.run_config import HARNESSES, RunSettings, load_callable, parse_reward_funcs

__all__ = ["preflight"]


def _engine_parallel_problems(settings: RunSettings) -> list[str]:
    """--engine-tensor/data-parallel-size: whole numbers >= 1, for an engine launched here."""
    problems = []
    for flag, size in (("--engine-tensor-parallel-size", settings.engine_tensor_parallel_size),
                       ("--engine-data-parallel-size", settings.engine_data_parallel_size)):
        if size < 1:
            problems.append(f"{flag} {size}: must be >= 1")
        elif size > 1 and settings.engine_url:
            problems.append(f"{flag} {size} with --engine-url: it sizes the engine launched "
                            "here; start yours with vLLM's own flag instead")
    engines = len(settings.engine_urls()) if settings.engine_url else 1
    if settings.lora_rank and engines > 1 and settings.weight_sync:
        # trainer/weight_sync/lora.py pushes into one engine; the fan-out wraps full-weight syncs
        problems.append(f"--lora-rank {settings.lora_rank} with {engines} engines in "
                        "--engine-url: LoRA pushes reach one engine only for now; give one "
                        "--engine-url, or train full weights (no --lora-rank)")
    return problems


def _check_engine(settings: RunSettings) -> list[str]:
    parallel = _engine_parallel_problems(settings)
    if parallel:
        return parallel
    if settings.engine_url:
        problems = []
        for url in settings.engine_urls():  # every one of several: a run starts on all
            try:
                httpx.get(url + "/health", timeout=5).raise_for_status()
            except httpx.HTTPError as exc:
                problems.append(f"--engine-url {url}: not a healthy vLLM server ({exc}); start "
                                "one (python -m launchers.engine) or drop the flag to launch "
                                "one here")
        return problems
    try:
        from launchers.paths import engine_python

        engine_python()
    except FileNotFoundError as exc:
        return [f"launching vLLM: {exc}"]
    return []


def _check_rollout_services(settings: RunSettings) -> list[str]:
    """--rollout-service: an --engine-url, a key, and each service answering with that key."""
    from harness.client.remote import KEY_ENV
    from harness.run.stack import service_key

    urls = settings.rollout_service_urls()
    problems = []
    if not settings.engine_url:
        problems.append("--rollout-service without --engine-url: the services proxy the engine "
                        "they were started with (harness.serve --engine-url); start it first "
                        "(python -m launchers.engine) and pass the same URL as --engine-url")
    try:
        key = service_key(settings)
    except OSError as exc:
        return [*problems, f"--rollout-service-key-file {settings.rollout_service_key_file}: "
                f"{exc}; give the file python -m harness.serve's key was read from"]
    if not key:
        return [*problems, f"--rollout-service: the services' key is missing; export {KEY_ENV} "
                "or pass --rollout-service-key-file FILE (python -m harness.serve prints it)"]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            problems.append(f"--rollout-service {url!r}: not an http(s) URL")
            continue
        try:
            reply = httpx.get(url.rstrip("/") + "/metrics", timeout=5,
                              headers={"Authorization": f"Bearer {key}"})
        except httpx.HTTPError as exc:
            problems.append(f"--rollout-service {url}: not answering ({exc}); start it "
                            "(python -m harness.serve --engine-url ...) or drop it from the list")
            continue
        if reply.status_code == 401:
            problems.append(f"--rollout-service {url}: the key was refused; give the key that "
                            f"service was started with ({KEY_ENV} or --rollout-service-key-file)")
        elif reply.status_code != 200 or "max_sessions" not in reply.text:
            problems.append(f"--rollout-service {url}: not a rollout service (GET /metrics: "
                            f"HTTP {reply.status_code})")
    if problems:
        return problems
    from harness.client.remote import ServicePool

    pool = ServicePool(urls, key)
    try:
        for flag, split, count in (("--tasks", settings.tasks, settings.task_count),
                                   ("--eval-tasks", settings.eval_tasks, None)):
            if split is None:
                continue
            for url, answer in pool.tasks(split, count).items():
                if isinstance(answer, str):
                    problems.append(f"{flag} {split!r} on the rollout service {url}: {answer}")
    finally:
        pool.close()
    return problems


def _check_run_dir(settings: RunSettings, *, kind: str) -> list[str]:
    from harness.shared.run_dir import check_run_dir

    return check_run_dir(settings.output_dir, kind, resume=settings.resume and kind == "train",
                         overwrite=settings.overwrite)


def _wait_for_ready(settings: RunSettings, remote: bool) -> list[str]:
    from harness.run.ready import Target, wait_ready

    targets = []
    if settings.engine_url:
        targets += [Target("--engine-url", url, "the vLLM engine")
                    for url in settings.engine_urls()]
    if remote:
        targets += [Target("--rollout-service", url, "the rollout service")
                    for url in settings.rollout_service_urls()
                    if url.startswith(("http://", "https://"))]
    if settings.ready_timeout_s <= 0:
        return [f"--ready-timeout-s {settings.ready_timeout_s}: must be > 0"]
    return wait_ready(targets, settings.ready_timeout_s) if targets else []


def _check_model(settings: RunSettings) -> list[str]:
    if settings.model is None:
        return []
    path = Path(settings.model)
    looks_like_path = settings.model.startswith((".", "/", "~")) or path.exists()
    adapter = path.expanduser() / "adapter_config.json"
    if adapter.exists():  # a LoRA run's export: merged into its base at start (harness.run.stack)
        try:
            base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        except ValueError as exc:
            return [f"--model {settings.model}: adapter_config.json does not parse ({exc})"]
        if not base or not (Path(base).exists() or "/" in base):
            return [f"--model {settings.model}: a LoRA adapter whose base "
                    f"({base!r}) is no model directory or hub id; merge it yourself with "
                    "python -m trainer.lora ADAPTER OUT --base BASE and pass OUT"]
        return []
    if looks_like_path and not (path.expanduser() / "config.json").exists():
        return [f"--model {settings.model}: no config.json there; give an HF model directory "
                "or a LoRA adapter folder (adapter_config.json)"]
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
    if not settings.resume or settings.output_dir is None:
        return []  # no --output-dir with --resume: _check_run_dir names it
    from trainer.checkpoint import find_latest

    if find_latest(str(Path(settings.output_dir) / "trainer")) is None:
        return [f"--resume: no checkpoint under {settings.output_dir}/trainer; drop --resume to "
                "start fresh, or point --output-dir at the run to resume"]
    return []


class _RolloutCheck:
    """harness.service.preflight in a child process of the service's interpreter, started first
    so it runs while this process checks the rest (the trainer's config imports torch)."""

    def __init__(self, settings: RunSettings) -> None:
        import dataclasses
        import json
        import subprocess

        from harness.run.stack import service_python
        from launchers.paths import REPO_ROOT

        self.process = subprocess.Popen(
            [service_python(), "-m", "harness.service.preflight"], cwd=REPO_ROOT, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.payload = json.dumps(dataclasses.asdict(settings))

    def problems(self) -> list[str]:
        import json

        out, err = self.process.communicate(self.payload, timeout=300)
        if self.process.returncode != 0:
            return [f"checking the tasks and the sandbox failed (python -m harness.service.preflight "
                    f"exited {self.process.returncode}): {err.strip()[-2000:]}"]
        return list(json.loads(out.strip().splitlines()[-1]))


def preflight(settings: RunSettings, *, train: bool,
              rollout_problems: Callable[[RunSettings], list[str]] | None = None) -> list[str]:
    """Every problem with `settings`, each naming the flag and the fix; [] when the run can start.

    The rollout side is checked where it runs. harness.train (train=True): a --rollout-service
    is asked (it answers, takes the key, loads --tasks and --eval-tasks), else the local
    service's interpreter checks tasks and sandbox in a child process
    (harness.service.preflight). harness.eval runs rollouts in its own process and passes
    `rollout_problems` (harness.service.preflight's, for train=False), called here.
    """
    problems: list[str] = []
    remote = train and bool(settings.rollout_service_urls())
    child = _RolloutCheck(settings) if train and not remote else None
    if settings.harness not in HARNESSES:
        problems.append(f"--harness {settings.harness!r}: choose one of {', '.join(HARNESSES)}")
    problems += _check_run_dir(settings, kind="train" if train else "eval")
    # Processes started beside this one (the GPU quick start) may still be loading: wait for
    # them with a deadline before asking them anything (harness.run.ready).
    not_ready = _wait_for_ready(settings, remote)
    problems += not_ready  # what never answered is not asked anything else below
    if settings.weight_sync and settings.engine_url and train and not not_ready:
        # A running engine was started by someone else; it must expose the weight-transfer routes.
        for url in settings.engine_urls():
            problems += _check_weight_transfer_routes(url)
    problems += _check_model(settings)
    if remote and not not_ready:
        # The services load the tasks, run the sandboxes and expose their own proxies.
        problems += _check_rollout_services(settings)
    elif rollout_problems is not None:
        problems += rollout_problems(settings)
    if not (settings.engine_url and not_ready):
        problems += _check_engine(settings)
    if train:
        problems += _check_rewards(settings)
        problems += _check_resume(settings)
        if settings.learning_rate is None:  # --optimizer sgd on a --model of your own
            problems.append(f"--optimizer sgd with --model {settings.model}: give --learning-rate "
                            "(SGD's step is lr x gradient, so its rate follows your model's "
                            "gradient scale; AdamW's 1e-6 default would not move it)")
        else:
            problems += [f"trainer: {_as_flags(p)}" for p in settings.trainer_config().validate()]
        from harness.run.learning import before_after_problems

        problems += before_after_problems(settings)
    if settings.max_concurrent_rollouts < 1:
        problems.append("--max-concurrent-rollouts must be >= 1")
    if child is not None:
        problems += child.problems()
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

