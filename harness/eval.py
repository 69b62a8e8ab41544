"""`python -m harness.eval`: run rollouts without training and print the pass rate per task.

The same services and rollouts as `harness.train` (engine, capture proxy, Harbor sessions, real
agents, the task verifiers), minus the trainer: every task gets --rollouts-per-task rollouts, and
the table shows passes / scored rollouts per task and overall, with failures counted by cause.
So a before/after table is two commands: eval the base model, train, eval the checkpoint
(`--model <output-dir>/trainer/model`, the HF export written when training ends; a LoRA run's
export there is its adapter folder, merged into its base in the run folder before the engine
starts: launchers.adapters, harness.run.stack).

A rollout "passes" when its env_reward is >= 1.0 (what the bundled verifiers write on success);
unscored rollouts (infra or verifier failures) are shown apart and left out of the rate, never
counted as fails.

Unlike harness.train, this command runs its rollouts in its own process: the session factory,
the capture proxy (harness.service.local_proxy) and the task and sandbox checks
(harness.service.preflight). So its process is a rollout process, on the service's side of the
import contract (tests/test_import_graph.py); it takes only the engine from harness.run.stack.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from rich.console import Console

from harness.run.preflight import preflight
from harness.run.stack import RunStack
from harness.service.preflight import rollout_problems
from harness.shared.lookup_names import instruction_of
from harness.shared.lookup_rates import step_rates_of_folder
from harness.shared.run_config import RunSettings, SettingsError, build_parser, settings_from_args
from harness.shared.run_dir import RunDirError, fresh_run_dir, prepare_run_dir
from harness.shared.run_records import RecordingFactory, joins_by_agent
from harness.shared.tables import PASS_THRESHOLD, pass_rate_table

__all__ = ["main", "pass_rate_table", "run_eval"]

async def _rollouts(factory: RecordingFactory, n_tasks: int, per_task: int) -> None:
    from harness.shared.seeds import eval_rollouts

    # One seed and name per (task, repeat): the rollout's sampling seed is derived from both.
    await asyncio.gather(*(factory.rollout(seed=seed, episode_id=episode_id)
                           for seed, episode_id in eval_rollouts(n_tasks, per_task)))


def run_eval(settings: RunSettings, console: Console | None = None) -> dict:
    console = console or Console()
    if settings.output_dir is None:
        settings.output_dir = str(fresh_run_dir("eval"))  # made below, once preflight passes
    problems = preflight(settings, train=False,
                         rollout_problems=lambda s: rollout_problems(s, train=False))
    if problems:
        raise SettingsError(problems)
    from harness.service.factory import HarborSessionFactory
    from harness.service.local_proxy import start_local_proxy
    from harness.tasks import load_tasks

    try:
        run_dir = prepare_run_dir(settings.output_dir, "eval", overwrite=settings.overwrite)
    except RunDirError as exc:
        raise SettingsError([str(exc)]) from exc
    settings.output_dir = str(run_dir)
    console.print(f"[bold]view[/] python -m harness.view {run_dir}  (live while it runs)")
    tasks = load_tasks(settings.tasks, count=settings.task_count)
    sampling = {"temperature": settings.temperature, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                "max_tokens": settings.max_tokens, "seed": settings.seed}
    # Stopped in reverse: the proxy (and its exposure), then the engine.
    with RunStack(settings, run_dir, weight_transfer=False) as stack, start_local_proxy(
            stack.engine_url, sandbox=settings.sandbox, data_dir=run_dir / "capture",
            host=settings.proxy_host, port=settings.proxy_port,
            public_url=settings.proxy_public_url, tunnel=settings.proxy_tunnel) as proxy:
        factory = RecordingFactory(HarborSessionFactory(
            proxy.server.admin_url, admin_key=proxy.server.admin_key, split=tasks,
            harness=settings.harness,
            sandbox=settings.sandbox, llm_url=stack.engine_url, model=settings.served_model_name,
            sampling=sampling, max_concurrent_rollouts=settings.max_concurrent_rollouts,
            agent_timeout_s=settings.agent_timeout_s, max_steps=settings.max_agent_steps,
            reward_key=settings.reward_key), run_dir)
        try:
            asyncio.run(_rollouts(factory, len(tasks), settings.rollouts_per_task))
        finally:
            factory.close()
    # Lookup-family tasks are summed per instruction text (its 8 words): 12 rows, not 96.
    table, summary = pass_rate_table([{**r, "task_id": instruction_of(r["task_id"])}
                                      for r in factory.records])
    console.print(table)
    summary["step_rates"] = step_rates_of_folder(run_dir, pass_threshold=PASS_THRESHOLD)
    if summary["step_rates"]:
        rates = summary["step_rates"]
        console.print("[bold]per step[/] (lookup family, scored rollouts: "
                      f"{rates['n']}): looked at the source file first {_pct(rates['looked'])}, "
                      f"wrote the word the file showed {_pct(rates['used_observation'])}, "
                      f"passed {_pct(rates['passed'])}")
    summary["causes"] = {c: sum(r["cause"] == c for r in factory.records)
                         for c in {r["cause"] for r in factory.records}}
    summary["joins"] = joins_by_agent(factory.records, settings.harness)
    # completion tokens the engine's reasoning parser counted as thinking (0 for a model that
    # does not think): what a thinking model spends before it acts
    summary["reasoning_tokens"] = sum(r.get("reasoning_tokens") or 0 for r in factory.records)
    if summary["reasoning_tokens"]:
        console.print(f"[bold]reasoning[/]: {summary['reasoning_tokens']} completion tokens "
                      f"over {len(factory.records)} rollouts")
    (run_dir / "eval_summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0%}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser("python -m harness.eval", __doc__.split("\n\n")[0], eval_mode=True)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from harness.tasks import quiet_harbor

    quiet_harbor()
    try:
        run_eval(settings_from_args(parser, argv))
    except SettingsError as exc:
        Console(stderr=True).print(f"[bold red]cannot start[/]: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
