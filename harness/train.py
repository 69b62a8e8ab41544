"""`python -m harness.train`: train a black-box coding agent with async GRPO, end to end.

This is the recipe (torchtune's word): the one place that wires every room, in the order things
start and stop. Nothing here computes; each step is a component from its own room.

    1. settings      flags + --config YAML, all problems reported at once (harness.run.preflight)
    2. services      the model (default: the committed tiny one) -> vLLM engine -> a rollout service pointed at
                     it (`python -m harness.serve`, a child process started while vLLM loads;
                     --rollout-service URL[,URL...] uses running ones instead) (harness.run.stack)
    3. weight sync   gloo here (vLLM plugin), NCCL on GPUs (trainer.weight_sync); each version
                     the engine confirmed reaches every service's capture proxy
                     (POST /v1/weight_version); with --engine-url a,b,... into every engine,
                     and the version is told once all live ones serve it
    4. rollouts      RemoteSessionFactory (harness.client.remote) -> the service's HarborSessionFactory:
                     Harbor task -> sandbox -> agent -> proxy -> verifier; every rollout recorded
                     here under <output-dir>/rollouts (harness.shared.run_records)
    5. training      HarnessAsyncGRPOTrainer: rows from traces, group advantages, TIS loss,
                     checkpoints and metrics under <output-dir>/trainer; --eval-tasks before and
                     after (harness.run.learning), through the same services; the run exits 1
                     if "after" sampled other than the last pushed weight version or "before"
                     other than version 0 (harness.run.eval_weights). Its train_dataset is
                     the --tasks names the services load; it trains them in a fresh order each
                     epoch, seeded by --seed (--no-shuffle-tasks: the split's order)
    6. summary       rollouts by cause, reward per step, tokens trained, time per phase; the
                     rollouts the steps trained, and apart those that finished ahead for a step
                     that never ran (`rollouts_not_trained`)
    7. teardown      every process this command started is stopped (service, then engine), on
                     error and Ctrl-C too

Which process holds what: this one holds the trainer (torch, transformers, the weight sync) and
the HTTP client, and imports neither openenv, harbor nor capture's server
(tests/test_trainer_isolation.py). The rollout service holds tasks, sandboxes, agents, the capture
proxy and the verifiers (it needs harbor and openenv); the engine is vLLM in its own venv. On this
machine (2 CPU cores, no GPU) the trainer runs from the project venv (.venv), beside the service's
imports it never makes: the CPU weight sync needs no vLLM in the trainer (the gloo plugin's vLLM
side lives in the engine). On GPUs the trainer imports vLLM's NCCL weight-transfer engine, and
vLLM cannot share a venv with openenv, so the trainer runs from .trainer-venv
(requirements/trainer-gpu.txt) and the service from .venv (launchers/hf_jobs.py does it all).

The default, `python -m harness.train --harness mini-swe-agent`, is the learning demonstration on a
CPU (issue 32): the tiny model warm-started on the lookup family (harness/warm/lookup.py; read a
word from a file, then write it elsewhere) trains on lookup:train, lookup:test is evaluated before
and after, the verifier's reward alone. opencode and claude-code start from their own lookup warm
starts, codex from its create-file one (launchers/models.py). On GPUs point --model at a real
checkpoint and --engine-url at vLLM.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.run.eval_weights import EvaluationWeightsError
from harness.run.learning import BeforeAfter
from harness.run.preflight import preflight
from harness.run.stack import RunStack
from harness.shared.run_config import (
    RunSettings,
    SettingsError,
    build_parser,
    load_callable,
    parse_reward_funcs,
    settings_from_args,
)
from harness.shared.run_dir import RunDirError, check_run_dir, fresh_run_dir, prepare_run_dir
from harness.shared.run_records import (
    RecordingFactory,
    joins_by_agent,
    split_trained,
    summary_tables,
)

__all__ = ["main", "rendezvous_address", "run_training", "weight_links"]

log = logging.getLogger("harness.train")
HARNESS_NAMES = {"opencode": "opencode", "claude-code": "claude-code", "codex": "codex",
                 "mini-swe-agent": "mini-swe-agent"}


def _factory_fn(settings: RunSettings, pool: Any, run_dir: Path):
    """What the trainer calls with its sampling policy: a recording RemoteSessionFactory.

    `pool` is the run's one ServicePool: every factory (training, eval before/after) shares its
    view of the services' load and the weight version it tells them.
    """
    from harness.client.remote import RemoteSessionFactory

    def make(split: Any, sampling: dict, task_count: int | None = None) -> Any:
        return RemoteSessionFactory(
            [s.url for s in pool.services], pool=pool, split=split, task_count=task_count,
            harness=HARNESS_NAMES[settings.harness], sandbox=settings.sandbox,
            model=settings.served_model_name, sampling=sampling,
            max_concurrent_rollouts=settings.max_concurrent_rollouts,
            agent_timeout_s=settings.agent_timeout_s, max_steps=settings.max_agent_steps,
            reward_key=settings.reward_key)

    def training(sampling: dict) -> RecordingFactory:
        # The split as its spec: the service loads it where the tasks live (and checked it at
        # preflight), so the trainer never touches Harbor.
        return RecordingFactory(make(settings.tasks, sampling, settings.task_count), run_dir)

    return training, make


def _train_task_names(settings: RunSettings, pool: Any) -> list[str]:
    """--tasks as every service loads it: the trainer's train_dataset, which it shuffles per
    epoch (--shuffle-tasks). Services that load different tasks would train a different task
    than the one the trainer chose, so they stop the run."""
    answers = pool.tasks(settings.tasks, settings.task_count)
    problems = [f"--tasks {settings.tasks!r} on the rollout service {url}: {answer}"
                for url, answer in answers.items() if isinstance(answer, str)]
    if problems:
        raise SettingsError(problems)
    url, names = next(iter(answers.items()))
    for other, other_names in answers.items():
        if other_names != names:
            raise SettingsError([f"--tasks {settings.tasks!r} loads {len(names)} tasks on {url} "
                                 f"and {len(other_names)} (or others) on {other}: give every "
                                 "rollout service the same task folders"])
    return names


def _eval_task_names(settings: RunSettings, pool: Any) -> list[str] | None:
    """--eval-tasks as the first service loads it (seed k runs task k % n there)."""
    if settings.eval_tasks is None:
        return None
    url, answer = next(iter(pool.tasks(settings.eval_tasks).items()))
    if isinstance(answer, str):
        raise SettingsError([f"--eval-tasks {settings.eval_tasks!r} on the rollout service "
                             f"{url}: {answer}"])
    return answer


def _reward_choice(settings: RunSettings) -> tuple[str | None, str]:
    """Which rollout_reward_fn this run uses, and why (decided once, printed at start)."""
    if settings.reward_fn:
        return settings.reward_fn, f"--reward-fn {settings.reward_fn}"
    return None, "the verifier's env_reward as is"


def _follow(settings: RunSettings) -> dict:
    """A torchrun rank other than 0: no services, no rollouts; it steps with rank 0's batches."""
    from launchers.models import resolve_model
    from trainer.grpo import HarnessAsyncGRPOTrainer

    if settings.output_dir is None:  # rank 0's preflight says the same, with the fix
        raise SettingsError(check_run_dir(None, "train"))

    # The same resolution as rank 0's (a hub id hits the cache rank 0 filled; pin a commit with
    # org/name@sha, or pass a snapshot directory as launchers/hf_jobs.py does, to rule out a
    # push landing between the ranks' lookups).
    model = str(resolve_model(settings.model, harness=settings.harness, tasks=settings.tasks).path)
    trainer = HarnessAsyncGRPOTrainer(model=model, harness_session_factory=_no_rollouts,
                                      args=settings.trainer_config())
    trainer.train()
    return {}


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _run_dir(settings: RunSettings, kind: str) -> Path:
    """Create this run's folder (harness.shared.run_dir: never over an earlier run's files) and record
    the folder actually used in `settings.output_dir` (a runs/latest link resolved)."""
    try:
        run_dir = prepare_run_dir(settings.output_dir, kind, resume=settings.resume,
                                  overwrite=settings.overwrite)
    except RunDirError as exc:
        raise SettingsError([str(exc)]) from exc
    settings.output_dir = str(run_dir)
    return run_dir


def _no_rollouts(sampling: dict) -> None:
    """Followers never run rollouts: rank 0 owns sessions (trainer.grpo)."""
    return None


def weight_links(engine_url: str, backend: str | None, capture: Any, *,
                 adapter_dir: Path | None = None, served_model_name: str = "tiny"
                 ) -> dict[str, Any]:
    """The trainer's `weight_sync` and `on_version` for this run.

    `capture` is what tells the capture proxies a version: the run's ServicePool (every
    service's proxy, POST /v1/weight_version) or a CaptureClient (one proxy). A proxy stamps
    every engine call with the version it was last told, and the trainer trusts that stamp for
    staleness and the IS correction. So the proxy hears a version only from the weight sync,
    after the engine confirmed it serves it. With --no-weight-sync (backend None)
    the engine keeps serving version 0 and the proxy is never told otherwise: the rows then show
    their true lag, counted under staleness/* and corrected or dropped (trainer/staleness.py).

    Several engines (`engine_url` "a,b,..."): one VLLMWeightSync each behind a FanOutWeightSync,
    which tells the proxies a version only once every live engine serves it, and names the
    engines whose push failed so the proxies take them out first (trainer.weight_sync.fanout).
    """
    if backend is None:
        return {"weight_sync": None, "on_version": None}
    urls = [u.strip() for u in engine_url.split(",") if u.strip()]
    if backend == "lora":
        # Adapter folders the ENGINE reads by path: a remote engine needs `adapter_dir` on a
        # shared filesystem (trainer/weight_sync/lora.py). The proxy hears (version, adapter).
        from trainer.weight_sync import LoRAWeightSync

        if adapter_dir is None:
            raise ValueError("a LoRA weight sync needs adapter_dir (where the engine reads them)")
        if len(urls) != 1:
            raise ValueError(f"--lora-rank with {len(urls)} engines: LoRA pushes into one engine "
                             "only for now; give one --engine-url, or train full weights")
        sync = LoRAWeightSync(urls[0], adapter_dir, base_name=served_model_name,
                              on_version=capture.set_weight_version)
        return {"weight_sync": sync, "on_version": None}
    from trainer.weight_sync import FanOutWeightSync, VLLMWeightSync

    if len(urls) == 1:
        sync = VLLMWeightSync(urls[0], backend, on_version=capture.set_weight_version,
                              master_address=rendezvous_address(urls[0]))
        return {"weight_sync": sync, "on_version": None}
    fanout = FanOutWeightSync([VLLMWeightSync(u, backend, master_address=rendezvous_address(u))
                               for u in urls], on_version=capture.set_weight_version)
    return {"weight_sync": fanout, "on_version": None}


def rendezvous_address(engine_url: str) -> str:
    """Where the trainer hosts the weight-transfer group for the engine at `engine_url`: its own
    address on the route to that engine, which the engine's workers connect back to. The
    default, 127.0.0.1, only ever worked with the engine on this host: an engine elsewhere
    reaches only itself there, and its workers wait out the group timeout (300 s) before the
    push fails. examples/multi_host/rehearse.py runs the layout where that shows."""
    from urllib.parse import urlsplit

    from launchers.net import address_toward

    return address_toward(urlsplit(engine_url).hostname or "127.0.0.1")


def join_ranks(config: Any) -> None:
    """Under torchrun, join every rank to the process groups now (a no-op on one process).

    Called first, before rank 0 starts the engine, the rollout service and the "before"
    evaluation (minutes): the followers then wait for rank 0 in the trainer's start-up barrier
    (control group, `step_wait_timeout_s`), not in the rendezvous, which gives up after
    `dist_timeout_s` (issue 30). `config` is the run's AsyncGRPOConfig."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from trainer.distributed import init_distributed

        init_distributed(config.dist_timeout_s, config.step_wait_timeout_s)


def run_training(settings: RunSettings, console: Console | None = None) -> dict:
    """Run a whole training job; returns the summary dict also written to <output-dir>/summary.json."""
    console = console or Console()
    join_ranks(settings.trainer_config())
    if int(os.environ.get("RANK", "0")) != 0:
        return _follow(settings)
    if settings.output_dir is None and not settings.resume and _world_size() == 1:
        settings.output_dir = str(fresh_run_dir("train"))  # made below, once preflight passes
    problems = preflight(settings, train=True)
    if problems:
        raise SettingsError(problems)
    run_dir = _run_dir(settings, "train")
    (run_dir / "settings.json").write_text(json.dumps(vars(settings), indent=1, default=str))
    console.print(f"[bold]view[/] python -m harness.view {run_dir}  (live while it runs)")
    timings: dict[str, float] = {}
    t_run = time.perf_counter()

    from transformers.utils import logging as transformers_logging

    from harness.client.engine_busy import collect_engine_busy
    from harness.client.remote import ServicePool
    from trainer.grpo import HarnessAsyncGRPOTrainer
    from trainer.rewards import RewardFunc

    # A checkpoint every step would print transformers' load and save bars each time; the
    # console's step table is the progress.
    transformers_logging.disable_progress_bar()

    with RunStack(settings, run_dir, weight_transfer=settings.weight_sync,
                  rollouts="service") as stack:
        timings.update(stack.timings)
        console.print(f"[bold]engine[/] {stack.engine_url}  [bold]rollout service[/] "
                      f"{', '.join(stack.service_urls)}"
                      f"{'' if stack.service is None else ' (started here)'}  "
                      f"[bold]model[/] {stack.model_path}  [bold]weight sync[/] {stack.backend_reason}")
        pool = ServicePool(stack.service_urls, stack.service_key)
        # The engine serves its initial weights: a service that served an earlier run must
        # stamp version 0 again, not the last version it heard.
        pool.set_weight_version(0)
        reward_spec, why = _reward_choice(settings)
        console.print(f"[bold]reward[/] {why}")
        reward_fn = load_callable(reward_spec) if reward_spec else None
        reward_funcs = [RewardFunc(name, fn, weight)
                        for name, fn, weight in parse_reward_funcs(settings.reward_funcs or [])]
        make_training, make_factory = _factory_fn(settings, pool, run_dir)
        made: list[RecordingFactory] = []
        links = weight_links(stack.engine_url, stack.weight_backend, pool,
                             adapter_dir=run_dir / "trainer" / "adapters",
                             served_model_name=settings.served_model_name)
        weight_sync = links["weight_sync"]
        try:
            train_names = _train_task_names(settings, pool)
            learning = BeforeAfter(settings, make_factory, run_dir, console,  # --eval-tasks
                                   eval_tasks=_eval_task_names(settings, pool))
            learning.before()

            def factory(sampling: dict) -> RecordingFactory:
                made.append(make_training(sampling))
                return made[-1]

            t0 = time.perf_counter()
            trainer = HarnessAsyncGRPOTrainer(
                model=str(stack.model_path), harness_session_factory=factory,
                args=settings.trainer_config(), train_dataset=train_names,
                rollout_reward_fn=reward_fn,
                reward_funcs=reward_funcs, **links,
            )
            timings["trainer_setup_s"] = time.perf_counter() - t0
            t0, wall0 = time.perf_counter(), time.time()
            try:
                history = trainer.train()
            finally:
                timings["training_s"] = time.perf_counter() - t0
                for f in made:
                    f.close()
            # Before the "after" evaluation adds calls of its own (harness.client.engine_busy).
            engine_busy = collect_engine_busy(pool, wall0, time.time())
            before_after = learning.after()  # the engine now serves the last pushed weights
            # ...which the after side must have sampled, and the before side version 0.
            weight_problems = [] if weight_sync is None else learning.record_weights(
                weight_sync.version or 0)
        finally:
            if weight_sync is not None:
                weight_sync.close()
            pool.close()
    timings["total_s"] = time.perf_counter() - t_run
    # Groups dispatched ahead of the trainer (max_staleness) can finish after the last step that
    # would have used them: recorded, never trained, so counted apart.
    last_step = int(history[-1].get("step", len(history))) if history else 0
    records, ahead = split_trained([r for f in made for r in f.records], last_step,
                                   settings.groups_per_step)
    for table in summary_tables(records, history, timings):
        console.print(table)
    if ahead:
        console.print(f"{len(ahead)} more rollouts finished for a step that never ran: "
                      "recorded in rollouts.jsonl, not trained, not counted above")
    learning.curve(history)
    console.print("[bold]engine busy[/] (share of training time with a call in flight) " + ", ".join(
        f"{url} {e['busy_fraction']:.0%}" for url, e in engine_busy["engines"].items()
        if e["busy_fraction"] is not None))
    summary = {
        "rollouts": len(records),
        "rollouts_not_trained": len(ahead),
        "causes": {c: sum(r["cause"] == c for r in records) for c in {r["cause"] for r in records}},
        "steps": len(history),
        "reward_mean_per_step": [m.get("reward/mean") for m in history],
        "tokens_trained": sum(m.get("tokens/trained", 0.0) for m in history),
        # how the calls joined their rollout graphs (capture.placement), per agent
        "joins": joins_by_agent(records, settings.harness),
        "timings": timings,
        "engine_busy": engine_busy,
        "before_after": before_after and {k: before_after[k] for k in (
            "before_pass_rate", "after_pass_rate", "change_points")},
        "output_dir": str(run_dir),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if weight_problems:  # after the records: a wrong-weights evaluation still leaves them
        raise EvaluationWeightsError(weight_problems)
    console.print(f"[bold green]done[/]: {summary['steps']} steps, {summary['rollouts']} rollouts; "
                  f"outputs in {run_dir}")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = build_parser("python -m harness.train", __doc__.split("\n\n")[0])
    console = Console(stderr=True)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from_args(parser, argv)
        run_training(settings, Console())
    except SettingsError as exc:
        console.print(f"[bold red]cannot start[/]: {exc}")
        return 2
    except EvaluationWeightsError as exc:
        console.print(f"[bold red]failed[/]: {exc}")
        return 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every process this run started was stopped[/]")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
