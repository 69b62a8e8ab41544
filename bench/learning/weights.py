"""Which weights carry a trained model's change? Swap groups of tensors with the warm start.

    .venv/bin/python bench/learning/weights.py RUN [RUN ...] [--base MODEL] [--samples 16]
                                               [--changes-only] [--out FILE.json]

Why: a run's pass rate says how far the policy moved, not where. Under shuffled rewards the
lookup warm start's copy falls by up to 27 points (docs/learning.md); whether that lives in the
tied embeddings (a word's logit raised in every context, which freezing them or LoRA would stop)
or in the layers (the copy itself damaged) decides what could hold it. Per group of tensors
(the embeddings, each layer's attention, each layer's MLP, the norms) this prints the relative
change ||run - base|| / ||base||, the probe of the run with that group put back to the base's,
and of the base with that group taken from the run. A group that carries the change moves
both: putting it back undoes the run, taking it alone reproduces it. `--changes-only` prints the
relative changes alone (the whole model's too) in seconds, without probing: how far a shuffled
run moved against a real one is the figure docs/learning.md's rollout arithmetic rests on.

RUN is a harness.train output folder (its trainer/model) or an HF model folder; `--base` is the
model the run started from (default: the committed lookup warm start). The probe is
harness.warm.lookup's (T=1 samples on the dev prompts; "value": the word the file showed was
written, after a right first step), every model from the same torch seed, so two models with
the same weights draw the same samples and the differences are the weights'. The tiny models tie
the output head to the embeddings: "embeddings" moves both. Dev only, so it decides nothing about
the test split.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo's rooms

RATES = ("first", "value")  # the probe's rates shown: read the named file; wrote the shown word


def tensor_group(name: str) -> str:
    """The group a parameter belongs to, by its Qwen/Llama-family name."""
    layer = re.match(r"model\.layers\.(\d+)\.(self_attn|mlp)\.", name)
    if layer:
        return f"layer {layer[1]} {'attention' if layer[2] == 'self_attn' else 'mlp'}"
    if "embed_tokens" in name or name.startswith("lm_head"):
        return "embeddings"
    if "norm" in name:
        return "norms"
    raise ValueError(f"{name}: not a Qwen/Llama-family parameter name; this tool reads the "
                     "tiny lookup models (models/tiny-qwen3-lookup*)")


def groups(model: Any) -> dict[str, list[str]]:
    """Every trainable tensor's name under its group, in the model's order."""
    out: dict[str, list[str]] = {}
    for name, _ in model.named_parameters():
        out.setdefault(tensor_group(name), []).append(name)
    return out


def relative_change(base: Any, run: Any, names: list[str]) -> float:
    """||run - base|| / ||base|| over the named tensors together."""
    import torch

    b, r = dict(base.named_parameters()), dict(run.named_parameters())
    with torch.no_grad():
        diff = torch.sqrt(sum(((r[n] - b[n]) ** 2).sum() for n in names))
        norm = torch.sqrt(sum((b[n] ** 2).sum() for n in names))
    return float(diff / norm)


def with_tensors(into: Any, source: Any, names: list[str]) -> Any:
    """A copy of `into` whose named tensors are `source`'s; neither model is changed."""
    import torch

    out = copy.deepcopy(into)
    params, taken = dict(out.named_parameters()), dict(source.named_parameters())
    with torch.no_grad():
        for name in names:
            params[name].copy_(taken[name])
    return out


def load_runs(base_dir: Path, run_dirs: list[Path]) -> tuple[Any, dict[Path, Any]]:
    """The base and each run's model; a run whose tensors are not the base's is refused."""
    import torch
    from transformers import AutoModelForCausalLM

    load = lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32)  # noqa: E731
    shapes = lambda m: {n: tuple(t.shape) for n, t in m.named_parameters()}  # noqa: E731
    base, runs = load(base_dir), {}
    for run_dir in run_dirs:
        runs[run_dir] = load(model_dir(run_dir))
        if shapes(runs[run_dir]) != shapes(base):
            raise SystemExit(f"{run_dir}: its tensors are not {base_dir}'s; give --base the "
                             "model the run started from")
    return base, runs


def changes(base_dir: Path, run_dirs: list[Path]) -> dict[str, dict[str, float]]:
    """Per run: the whole model's relative change ("all") and each group's; nothing probed."""
    base, runs = load_runs(base_dir, run_dirs)
    by_group = groups(base)
    every = [name for names in by_group.values() for name in names]
    return {str(run_dir): {"all": relative_change(base, run, every),
                           **{group: relative_change(base, run, names)
                              for group, names in by_group.items()}}
            for run_dir, run in runs.items()}


def model_dir(path: Path) -> Path:
    for candidate in (path / "trainer" / "model", path):
        if (candidate / "config.json").is_file():
            return candidate
    raise SystemExit(f"{path}: neither a harness.train output folder with trainer/model nor an "
                     "HF model folder (no config.json)")


def _log(message: str) -> None:
    print(message, flush=True)  # progress shows in a log file as it happens


def ablate(base_dir: Path, run_dirs: list[Path], samples: int,
           log: Any = _log) -> dict[str, dict]:
    """Per run: each group's relative change and the probes of the two hybrids per group."""
    from transformers import AutoTokenizer

    from harness.warm.lookup import probe_models

    base, runs = load_runs(base_dir, run_dirs)
    tok = AutoTokenizer.from_pretrained(base_dir)
    by_group = groups(base)
    models, moved = {"base": base}, {}
    for run_dir, run in runs.items():  # every model probed on one capture, the base once
        models[f"{run_dir}: run"] = run
        for group, names in by_group.items():
            moved[run_dir, group] = relative_change(base, run, names)
            models[f"{run_dir}: {group} put back"] = with_tensors(run, base, names)
            models[f"{run_dir}: {group} from the run"] = with_tensors(base, run, names)
    log(f"{len(models)} models to probe")
    rates = probe_models(models, tok, samples=samples, log=log)
    report: dict[str, dict] = {}
    for run_dir in run_dirs:
        report[str(run_dir)] = {
            "base": rates["base"], "run": rates[f"{run_dir}: run"],
            "groups": {group: {"change": moved[run_dir, group],
                               "put_back": rates[f"{run_dir}: {group} put back"],
                               "taken_alone": rates[f"{run_dir}: {group} from the run"]}
                       for group in by_group}}
    return report


def print_report(report: dict[str, dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    pct = lambda r: " / ".join(f"{100 * r[k]:.0f}%" for k in RATES)  # noqa: E731
    for run, data in report.items():
        table = Table(title=f"{run}: base {pct(data['base'])}, run {pct(data['run'])} "
                            "(read the named file first / wrote the shown word)")
        table.add_column("tensors", overflow="fold")
        table.add_column("relative change", justify="right")
        table.add_column("run, these put back", justify="right")
        table.add_column("base, these from the run", justify="right")
        for group, row in data["groups"].items():
            table.add_row(group, f"{row['change']:.4f}", pct(row["put_back"]),
                          pct(row["taken_alone"]))
        console.print(table)


def print_changes(moved: dict[str, dict[str, float]]) -> None:
    """A row per tensor group, a column per run (its folder's last two parts: 80 columns hold
    several runs, where a row per run would cut the group names)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="relative change ||run - base|| / ||base||, nothing probed")
    table.add_column("tensors", overflow="fold")
    for run in moved:
        table.add_column("/".join(Path(run).parts[-2:]), justify="right", overflow="fold")
    for group in next(iter(moved.values())):
        table.add_row("whole model" if group == "all" else group,
                      *(f"{row[group]:.4f}" for row in moved.values()))
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/learning/weights.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path,
                        help="harness.train output folders (or HF model folders)")
    parser.add_argument("--base", type=Path, default=None,
                        help="the model the runs started from (default: the committed lookup "
                             "warm start, models/tiny-qwen3-lookup)")
    parser.add_argument("--samples", type=int, default=16,
                        help="T=1 samples per dev instruction and turn, per model (default 16)")
    parser.add_argument("--changes-only", action="store_true",
                        help="print each run's relative change (whole model and per group) "
                             "without probing any model: seconds, not minutes")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    if args.base is None:
        from launchers.warm_models import committed_lookup_model

        args.base = committed_lookup_model()
    if args.changes_only:
        report: dict = changes(args.base, args.runs)
        print_changes(report)
    else:
        report = ablate(args.base, args.runs, args.samples)
        print_report(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
