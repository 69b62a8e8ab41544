"""The settings of one `python -m harness.train` / `harness.eval` run: flags, YAML, validation.

One typed dataclass holds every setting a run reads; `--config file.yaml` fills it and flags
override the file (a flag the user typed always wins, even when it equals the default; a flag not
typed does not overwrite the file). File values are held to the same types as the flags, read
from the dataclass's annotations: `steps: 2.5` is an error, not a float that reaches the trainer.
`preflight()` (harness/run/preflight.py) returns every problem at once, each naming the flag and the
fix, and `harness.train` calls it before any process starts: vLLM takes ~25-40 s to start on
CPU, and a run that would fail on its reward function should say so before that, not after.

What is checked up front (the torchtune "Raises:" list, STYLE.md section 2):
  - --harness is a registered agent; --sandbox a known backend with what it needs on this host
  - --tasks loads (folder, "bundled", registry:name@version, hf:org/repo), where rollouts run
  - --model exists when it is a path; --engine-url answers /health when given
  - --reward-fn / --reward-funcs import and are callable
  - a remote --sandbox has a way to reach the proxy (--proxy-public-url or --proxy-tunnel)
  - --resume has a checkpoint to resume from
  - --rollout-service: each service answers, the key is accepted, --engine-url is given
  - the trainer's own config (AsyncGRPOConfig.validate) for train runs
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["RunSettings", "SettingsError", "build_parser", "load_callable", "settings_from_args"]

HARNESSES = ("opencode", "claude-code", "codex", "mini-swe-agent")
TRAIN_ONLY = frozenset({"groups_per_step", "steps", "save_steps", "learning_rate", "optimizer", "beta", "resume", "weight_sync",
                        "max_staleness",
                        "reward_fn", "reward_funcs", "report_to", "shuffle_rewards", "shuffle_mode",
                        "flip_rewards",
                        "shuffle_tasks", "eval_tasks", "eval_rollouts_per_task", "rollout_service",
                        "rollout_service_key_file", "lora_rank", "lora_alpha", "lora_dropout",
                        "lora_target_modules"})


# The tiny models (336k parameters) train at ~1e-3 (LEARNING.md: 64 rollouts a step); with the
# default's 32 a step, 1e-3 drifted (held-out -15 points, one seed) and 5e-4 held (+0). Either
# would wreck a pretrained model of billions, so a --model of your own gets a fine-tuning rate.
TINY_LEARNING_RATE = 5e-4
MODEL_LEARNING_RATE = 1e-6
# --optimizer sgd: its step is lr x gradient, so its rate follows the gradient's scale, not
# AdamW's. On the tiny lookup warm start 0.5 learnt as fast as AdamW's 5e-4 (dev, seed 0: 43% ->
# 90%; docs/learning.md). A --model of your own has no such default: give --learning-rate.
TINY_SGD_LEARNING_RATE = 0.5
_TINY_MODELS = Path(__file__).resolve().parents[2] / "models"  # the committed tiny models
# --eval-tasks "auto": the test split of a generated family trained on its train split.
_DEFAULT_EVAL = {"lookup:train": "lookup:test", "family:train": "family:heldout"}


class SettingsError(ValueError):
    """One or more settings are wrong; `.problems` lists each with its fix."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid run settings:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass
class RunSettings:
    """Every setting of a train or eval run. Field names match the flags (dashes -> underscores)."""

    harness: str = "mini-swe-agent"
    model: str | None = None  # None: the tiny default model, warm-started (models/, committed)
    tasks: str = "lookup:train"  # the multi-step family (harness/tasks/lookup.py)
    task_count: int | None = None
    sandbox: str = "local"
    engine_url: str | None = None  # None: launch vLLM here
    engine_port: int | None = None
    # vLLM's own parallelism of the engine launched here (vllm serve -tp / -dp); 1: none.
    engine_tensor_parallel_size: int = 1
    engine_data_parallel_size: int = 1
    served_model_name: str = "tiny"
    # The embedded CPU default (README's main command): 12 steps of 4 groups x 8 rollouts.
    num_generations: int = 8
    groups_per_step: int = 4
    max_concurrent_rollouts: int = 6
    steps: int = 12
    # Steps the rollouts may run ahead of the trainer (trainer/producer.py): 1 overlaps sampling
    # with training, and which version samples a rollout then follows the machine's timing; 0
    # samples every rollout with the newest weights, so what a run samples follows its --seed.
    max_staleness: int = 1
    save_steps: int = 50  # sharded checkpoint every N steps, and after the last one
    # None: 5e-4 for the committed tiny models, 1e-6 for a --model of your own; with --optimizer
    # sgd, 0.5 for the tiny models and none for your own (__post_init__).
    learning_rate: float | None = None
    optimizer: str = "adamw"  # or "sgd" (trainer.config.AsyncGRPOConfig checks it)
    beta: float = 0.0  # KL (k3) to the initial policy, per token; 0: no reference model
    temperature: float = 1.0
    max_tokens: int = 128  # per engine call, enforced by the capture proxy
    # Agent turns per rollout. None (__post_init__): 2 on the lookup family (look, then write:
    # the tiny warm start does not end an episode by itself), 1 on the create-file family (one
    # command solves it), 8 on any other tasks.
    max_agent_steps: int | None = None
    agent_timeout_s: float = 180.0
    output_dir: str | None = None  # None: a fresh runs/<UTC time>-train|eval (harness.shared.run_dir)
    overwrite: bool = False  # delete an existing --output-dir's files instead of refusing it
    ready_timeout_s: float = 600.0  # how long to wait for --engine-url / --rollout-service
    reward_fn: str | None = None  # pkg.module:function
    reward_funcs: list[str] = field(default_factory=list)  # name=pkg.module:function[*weight]
    reward_key: str | None = None
    resume: bool = False
    weight_sync: bool = True
    proxy_public_url: str | None = None
    proxy_tunnel: str | None = None
    proxy_host: str = "127.0.0.1"
    proxy_port: int = 0
    report_to: str = "jsonl"
    seed: int = 0
    rollouts_per_task: int = 2  # eval only
    shuffle_rewards: bool = False  # the control: rewards permuted within each group
    shuffle_mode: str = "balanced"  # or "uniform" (trainer/reward_shuffle.py)
    flip_rewards: bool = False  # the control: each reward r trained as 1 - r
    train_unplaced_calls: bool = False  # capture.placement: calls outside the agent's own chat
    train_summary_calls: bool = False  # capture.aux summarizer: an agent compacting its history
    shuffle_tasks: bool = True  # train tasks in a fresh order each epoch, seeded by --seed
    # Held-out tasks evaluated before and after training. "auto": lookup:test when --tasks is
    # lookup:train, family:heldout when it is family:train, else none; "none": no evaluation
    # (resolved in __post_init__).
    eval_tasks: str | None = "auto"
    # None: 1 on lookup:test (96 tasks), else 8 (family:heldout: 12 tasks); 96 rollouts a side,
    # +-4-5 points of standard error.
    eval_rollouts_per_task: int | None = None
    # Running `python -m harness.serve` services (URL[,URL...]); None: start one here.
    rollout_service: str | None = None
    rollout_service_key_file: str | None = None  # else $HARNESS_SERVICE_KEY
    # LoRA (trainer/lora.py): 0 trains every weight; R > 0 trains rank-R adapters on a frozen
    # base and pushes them hot into vLLM (trainer/weight_sync/lora.py).
    lora_rank: int = 0
    lora_alpha: float | None = None  # None: 2 * lora_rank
    lora_dropout: float = 0.0
    lora_target_modules: str = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"

    def __post_init__(self) -> None:
        if self.learning_rate is None:
            tiny = self.model is None or Path(self.model).resolve().parent == _TINY_MODELS
            if self.optimizer == "sgd":  # None stays for a model of your own: preflight asks
                self.learning_rate = TINY_SGD_LEARNING_RATE if tiny else None
            else:
                self.learning_rate = TINY_LEARNING_RATE if tiny else MODEL_LEARNING_RATE
        if self.max_agent_steps is None:
            self.max_agent_steps = (2 if self.tasks.startswith("lookup:")
                                    else 1 if self.tasks.startswith("family:") else 8)
        if self.eval_tasks == "auto":
            self.eval_tasks = _DEFAULT_EVAL.get(self.tasks)
        elif self.eval_tasks == "none":
            self.eval_tasks = None
        if self.eval_rollouts_per_task is None:
            self.eval_rollouts_per_task = 1 if (self.eval_tasks or "").startswith("lookup:") else 8

    def rollout_service_urls(self) -> list[str]:
        """--rollout-service as a list of URLs ([] when a local service is started)."""
        return [u.strip() for u in (self.rollout_service or "").split(",") if u.strip()]

    def engine_urls(self) -> list[str]:
        """--engine-url as a list of server roots ([] when this command launches vLLM). Several:
        one proxy spreads sessions over them (capture.engines), the trainer pushes weights into
        each (trainer.weight_sync.fanout)."""
        roots = [u.strip().rstrip("/") for u in (self.engine_url or "").split(",") if u.strip()]
        return [u[:-3] if u.endswith("/v1") else u for u in roots]

    def trainer_config(self):  # -> AsyncGRPOConfig, imported lazily (torch)
        from harness.shared.run_dir import fresh_run_dir
        from trainer.config import AsyncGRPOConfig

        # No --output-dir yet (harness.train chooses it before it builds the trainer): a fresh
        # folder's name, never an earlier run's.
        run_dir = self.output_dir or str(fresh_run_dir("train"))
        return AsyncGRPOConfig(
            num_generations=self.num_generations, groups_per_step=self.groups_per_step,
            max_concurrent_rollouts=self.max_concurrent_rollouts,
            temperature=self.temperature,
            max_tokens=self.max_tokens, learning_rate=self.learning_rate, max_steps=self.steps,
            max_staleness=self.max_staleness,
            optimizer=self.optimizer,  # type: ignore[arg-type]  # AsyncGRPOConfig checks it
            beta=self.beta, seed=self.seed, output_dir=str(Path(run_dir) / "trainer"),
            report_to=self.report_to, resume_from_checkpoint=True if self.resume else None,
            save_steps=self.save_steps, shuffle_rewards=self.shuffle_rewards,
            shuffle_mode=self.shuffle_mode,  # type: ignore[arg-type]  # AsyncGRPOConfig checks it
            flip_rewards=self.flip_rewards,
            shuffle_dataset=self.shuffle_tasks,
            train_unplaced_calls=self.train_unplaced_calls,
            train_summary_calls=self.train_summary_calls,
            lora_rank=self.lora_rank, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
            lora_target_modules=tuple(m.strip() for m in self.lora_target_modules.split(",")
                                      if m.strip()),
        )


def load_callable(spec: str) -> Any:
    """Import `pkg.module:function` (a file path `path/to/file.py:function` works too)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise ValueError(f"{spec!r}: expected pkg.module:function")
    if module_name.endswith(".py"):
        spec_obj = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
        if spec_obj is None or spec_obj.loader is None:
            raise ValueError(f"{spec!r}: cannot load {module_name}")
        module = importlib.util.module_from_spec(spec_obj)
        spec_obj.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{spec!r}: {module_name} has no callable {attr!r}")
    return fn


def parse_reward_funcs(specs: list[str]) -> list[tuple[str, Any, float]]:
    """`name=pkg.mod:fn*0.5` -> (name, fn, weight); the name and the weight are optional."""
    parsed = []
    for spec in specs:
        name, _, rest = spec.rpartition("=") if "=" in spec else ("", "", spec)
        target, _, weight = rest.partition("*")
        fn = load_callable(target)
        parsed.append((name or getattr(fn, "__name__", target), fn, float(weight) if weight else 1.0))
    return parsed


def _help(name: str) -> str:
    return {
        "harness": f"agent to train: {', '.join(HARNESSES)}",
        "model": "HF model dir, or hub id org/name[@revision] (downloaded once, same commit for "
                 "engine and trainer; default: a committed tiny model warm-started on the "
                 "family's train tasks: on lookup:* models/tiny-qwen3-lookup for mini-swe-agent, "
                 "models/tiny-qwen3-lookup-HARNESS for opencode and claude-code; else the "
                 "create-file warm start in the agent's own format, "
                 "models/tiny-qwen3-create-file[-HARNESS])",
        "tasks": "Harbor tasks: lookup:train|dev|test (the multi-step lookup family), "
                 "family:train|heldout (the one-step create-file family), 'bundled', a folder, "
                 "registry:name@version, or hf:org/repo",
        "task_count": "use only the first N tasks",
        "sandbox": "where rollouts run: local (bubblewrap), docker, e2b, daytona, modal, podman",
        "engine_url": "use this running vLLM server instead of launching one; several as "
                      "URL,URL,...: the proxy pins each rollout session to one of them (the "
                      "least loaded live one) and the weight sync pushes into all",
        "engine_port": "port for the launched vLLM (default: a free port)",
        "engine_tensor_parallel_size": "GPUs the launched vLLM shards each layer over (its "
                                       "--tensor-parallel-size; default 1)",
        "engine_data_parallel_size": "model replicas inside the launched vLLM (its "
                                     "--data-parallel-size; default 1; GPUs only: on CPU start "
                                     "several engines and give --engine-url URL,URL)",
        "served_model_name": "model name the engine serves and agents ask for",
        "num_generations": "rollouts per task per GRPO group",
        "groups_per_step": "groups consumed by one optimizer step",
        "max_concurrent_rollouts": "rollouts in flight at once",
        "steps": "optimizer steps to train",
        "max_staleness": "steps the rollouts may run ahead of the trainer (default 1: sampling "
                         "overlaps training, and which weights sampled a rollout follows the "
                         "timing); 0: synchronous, every rollout sampled by the newest weights, "
                         "so the same command and --seed sample the same tokens throughout, "
                         "after table included (README: Reproducible runs)",
        "save_steps": "write a sharded checkpoint every N steps (and after the last; 0: only "
                      "the last); the final model is exported to <output-dir>/trainer/model",
        "learning_rate": "the optimizer's learning rate (default: 5e-4 for the committed tiny models, "
                         "1e-6 for any other --model; with --optimizer sgd 0.5 for the tiny "
                         "models, and a --model of your own needs one; 0 is the control that measures "
                         "evaluation noise: every step runs, the weights never move)",
        "optimizer": "adamw (default) or sgd: plain SGD, step = lr x gradient, no optimizer "
                     "state (its shuffled-reward drift on dev matched AdamW's: docs/learning.md)",
        "beta": "KL penalty to the initial policy (TRL's beta): each completion token's loss "
                "gets beta x k3(policy, initial policy); 0 (default) builds no reference model",
        "temperature": "sampling temperature (enforced on every agent call)",
        "max_tokens": "completion token cap per engine call (enforced by the proxy)",
        "max_agent_steps": "agent turns allowed per rollout (default: 2 on lookup:*, 1 on "
                           "family:*, 8 on others)",
        "agent_timeout_s": "seconds an agent may run before the rollout times out",
        "output_dir": "the run folder: checkpoints, metrics, traces and outcomes go here "
                      "(default: a new runs/<UTC time>-train or -eval, linked as runs/latest; "
                      "an existing non-empty folder is refused without --resume or --overwrite)",
        "overwrite": "delete the files an earlier run left in --output-dir before starting",
        "ready_timeout_s": "seconds to wait for --engine-url and --rollout-service to answer "
                           "/health before giving up (they may still be loading a model)",
        "reward_fn": "rollout_reward_fn as pkg.module:function (or file.py:function)",
        "reward_funcs": "extra named reward functions: name=pkg.module:function*weight (repeatable)",
        "reward_key": "which key of a multi-reward reward.json is env_reward",
        "resume": "continue the run in --output-dir from its latest checkpoint (e.g. "
                  "--output-dir runs/latest)",
        "weight_sync": "push new weights into vLLM after each step (--no-weight-sync to skip)",
        "proxy_public_url": "public URL that remote sandboxes use to reach the capture proxy",
        "proxy_tunnel": "command that opens a tunnel to the proxy, with {url} (e.g. cloudflared)",
        "proxy_host": "address the capture proxy binds (0.0.0.0 only behind a public URL you control)",
        "proxy_port": "port of the capture proxy (0: a free port)",
        "report_to": "metrics sinks besides the console: none, jsonl, trackio, wandb",
        "seed": "random seed; also seeds every rollout's sampling (per-request vLLM seeds "
                "derived from it and the rollout), so a rerun samples alike (all of it with "
                "--max-staleness 0; else until the first weight push)",
        "rollouts_per_task": "(eval) rollouts per task",
        "shuffle_rewards": "control run: permute rewards within each group, so they no longer "
                           "follow actions (a loop that still learns has a bug)",
        "shuffle_mode": "how --shuffle-rewards permutes: balanced (each group's permutation "
                        "chosen so the run's rewards carry no net signal toward the earned "
                        "ones) or uniform (a plain random permutation, which at 8 rollouts a "
                        "group still carries a random-signed signal by chance)",
        "flip_rewards": "control run: train each reward r as 1 - r, so the policy is pushed away "
                        "from what the verifier pays (the pass rate must fall)",
        "train_unplaced_calls": "also train engine calls the capture could not place in the "
                                "agent's own conversation (made with the agent's key by a "
                                "command it ran; marked unplaced in the trace)",
        "train_summary_calls": "also train the calls in which the agent summarises its history "
                               "to compact it (aux summarizer), with the rollout's advantage "
                               "(off by default until measured)",
        "shuffle_tasks": "train the tasks in a fresh order each epoch, seeded by --seed "
                         "(--no-shuffle-tasks: the split's order, neighbours in one step)",
        "eval_tasks": "tasks (same forms as --tasks) evaluated before and after training, with a "
                      "before/after pass-rate table; default: lookup:test when --tasks is "
                      "lookup:train, family:heldout when it is family:train, else none "
                      "('none' skips it)",
        "eval_rollouts_per_task": "rollouts per --eval-tasks task, before and after (default: "
                                  "1 on lookup:test, 8 otherwise)",
        "rollout_service": "running rollout services (python -m harness.serve) to use, as "
                           "URL[,URL...], instead of the one this command starts; give "
                           "--engine-url too: the engine the services were started with",
        "rollout_service_key_file": "a file holding the services' key (else "
                                    "$HARNESS_SERVICE_KEY)",
        "lora_rank": "train LoRA adapters of this rank on a frozen base (peft) and push them "
                     "hot into vLLM as a new adapter per version; 0: full fine-tuning",
        "lora_alpha": "LoRA alpha; None (unset): 2 x --lora-rank",
        "lora_dropout": "LoRA dropout on the adapters' input, in [0, 1)",
        "lora_target_modules": "comma-separated module names that get adapters; the default "
                               "is every attention and MLP projection of Qwen/Llama-family "
                               "models",
    }[name]


def _field_kinds() -> dict[str, tuple[type, bool]]:
    """Each setting's (base type, may be None), read from RunSettings' annotations.

    One source for both the flags' `type=` and the YAML check, so a file value and a flag are
    held to the same type. `list[str]` settings are repeatable flags (kind `list`).
    """
    kinds = {}
    for name, hint in typing.get_type_hints(RunSettings).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = type(None) in typing.get_args(hint)
        base = typing.get_origin(hint) or hint
        if optional:
            base = typing.get_origin(args[0]) or args[0]
        kinds[name] = (base, optional)
    return kinds


def build_parser(prog: str, description: str, *, eval_mode: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config", help="YAML file of settings (flags override it)")
    defaults = RunSettings()
    kinds = _field_kinds()
    for f in dataclasses.fields(RunSettings):
        if eval_mode and f.name in TRAIN_ONLY:
            continue
        if not eval_mode and f.name == "rollouts_per_task":
            continue
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        kind, _ = kinds[f.name]
        if f.name == "harness":
            parser.add_argument(flag, choices=HARNESSES, default=default, help=_help(f.name))
        elif kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=_help(f.name))
        elif kind is list:
            parser.add_argument(flag, action="append", default=None, help=_help(f.name))
        else:
            parser.add_argument(flag, type=kind, default=default, help=_help(f.name))
    return parser


class _Untyped:
    """Marks a flag the user did not type (argparse leaves a namespace's existing values alone)."""

    def __repr__(self) -> str:
        return "<untyped>"


_UNTYPED = _Untyped()


def _typed_value(name: str, value: Any, kinds: dict[str, tuple[type, bool]]) -> tuple[Any, str | None]:
    """`value` from the YAML file converted to the setting's type, or a problem naming both.

    A string converts the way the flag would parse it (so `learning_rate: 1e-6`, which YAML 1.1
    reads as a string, is the float 1e-06); other mismatches are errors, not guesses: `steps: 2.5`
    or `steps: true` would otherwise reach the trainer as a float or a bool.
    """
    kind, optional = kinds[name]
    flag = "--" + name.replace("_", "-")
    if value is None:
        return (None, None) if optional else (None, f"{name}: expected {kind.__name__} "
                                                     f"(like {flag}), got null")
    if kind is list:
        items = value if isinstance(value, list) else [value]
        if all(isinstance(v, str) for v in items):
            return list(items), None
        return None, f"{name}: expected a list of strings (like repeated {flag}), got {value!r}"
    if kind is bool:
        if isinstance(value, bool):
            return value, None
        return None, f"{name}: expected true or false (like {flag}/--no-{flag[2:]}), got {value!r}"
    if isinstance(value, bool):  # bool is an int to Python, never to a setting
        return None, f"{name}: expected {kind.__name__} (like {flag}), got the boolean {value!r}"
    if kind is float and isinstance(value, int):
        return float(value), None
    if isinstance(value, kind):
        return value, None
    if isinstance(value, str):
        try:
            return kind(value), None
        except ValueError:
            pass
    return None, f"{name}: expected {kind.__name__} (like {flag}), got {value!r}"


def settings_from_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> RunSettings:
    """Defaults, then the YAML file, then every flag the user typed, even one equal to its default.

    Which flags were typed is read from argparse itself: it only fills a namespace attribute that
    is missing, so a namespace pre-filled with a marker keeps the marker for every untyped flag.
    (Comparing values with the defaults instead loses `--steps 3` against `steps: 5` in a file.)
    """
    kinds = _field_kinds()
    # Repeatable flags append to what the namespace holds, so theirs start empty (None), which
    # only a typed flag changes.
    marked = argparse.Namespace(config=_UNTYPED, **{
        name: None if kind is list else _UNTYPED for name, (kind, _) in kinds.items()})
    args = parser.parse_args(argv, namespace=marked)
    typed = {k: v for k, v in vars(args).items()
             if v is not _UNTYPED and not (v is None and kinds.get(k, (None,))[0] is list)}
    values: dict[str, Any] = {}
    if typed.get("config"):
        path = Path(typed["config"])
        if not path.exists():
            raise SettingsError([f"--config {path}: no such file"])
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise SettingsError([f"--config {path}: not valid YAML ({exc})"]) from exc
        if not isinstance(loaded, dict):
            raise SettingsError([f"--config {path}: expected a mapping of settings"])
        problems = []
        unknown = sorted(str(k) for k in loaded if str(k).replace("-", "_") not in kinds)
        if unknown:
            problems.append(f"unknown settings {', '.join(unknown)} (known: {', '.join(sorted(kinds))})")
        for key, value in loaded.items():
            name = str(key).replace("-", "_")
            if name in kinds:
                converted, problem = _typed_value(name, value, kinds)
                if problem:
                    problems.append(problem)
                else:
                    values[name] = converted
        if problems:
            raise SettingsError([f"--config {path}: {p}" for p in problems])
    typed.pop("config", None)
    values.update(typed)
    settings = RunSettings(**values)
    if settings.reward_funcs is None:
        settings.reward_funcs = []
    return settings
