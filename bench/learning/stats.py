"""The statistics of the learning bench: per-instruction changes, a clustered interval, the bar.

Why a module of its own: the bench's verdict is a claim the README repeats, so the arithmetic
is tested apart from the hours of training it summarises (tests/test_bench_learning.py).

The unit of evidence is an instruction text of the test split (12 of them, 8 words each): the
rollouts of one instruction share everything but the word, so they are not independent draws.
A seed's change is the mean over instructions of (after - before) pass rate; the interval is a
two-way cluster bootstrap that resamples seeds and instructions (percentile, 95%), so both the
seed-to-seed spread and which instructions happen to be easy widen it. With 4 seeds it is wide:
that is the honest width of 4 seeds.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

RISE_POINTS = 20.0  # issue 32: mean rise >= +20 points ...
RISE_LOWER_POINTS = 10.0  # ... with the interval's lower end >= +10
NOISE_POINTS = 5.0  # shuffled rewards and lr 0 stay within +-5 points of zero
FOLLOW_SHARE = 0.70  # the swap test: answers follow the observed word in >= 70% of answers
CONTROLS = {"shuffle": ["--shuffle-rewards"], "lr0": ["--learning-rate", "0"],
            "flip": ["--flip-rewards"]}
# Seeds each control needs before its check can pass. The shuffled control's change is mostly
# training noise: 12 steps on rewards that carry no information still move the policy, with a
# per-seed SD of 11-15 points on test (docs/learning.md: AdamW at 4 groups a step, -27 to +17 over
# 16 balanced runs; SGD at 0.5 with 8 groups, SD 12; SGD at 0.25 with 8, SD 3.4 over 10 seeds),
# so one run of it is a draw from that spread. "Stays within +-5 of zero" is
# therefore judged as an equivalence test: the clustered 95% interval of its mean over at least 8
# seeds must lie inside +-5. A mean that lands inside +-5 by luck is not enough (8 seeds at an SD
# of 15 gave -4.8 with an interval of [-15.4, +5.9]: that shows no bias, and no absence of one
# either). lr 0 never moves the weights (its change is evaluation noise, 0.0 with per-request
# seeds) and a flipped run falls by tens of points, so one seed answers each.
CONTROL_MIN_SEEDS = {"shuffle": 8, "lr0": 1, "flip": 1}


def per_instruction_change(before_after: dict) -> dict[str, float]:
    """{instruction: (after - before) pass rate in points} from a run's before_after.json
    (its per_task rows are already summed per instruction by harness.run.learning)."""
    out = {}
    for name, row in before_after.get("per_task", {}).items():
        b, a = row["before"], row["after"]
        if b.get("scored") and a.get("scored"):
            out[name] = 100.0 * (a["passed"] / a["scored"] - b["passed"] / b["scored"])
    return out


def seed_mean(changes: dict[str, float]) -> float | None:
    return sum(changes.values()) / len(changes) if changes else None


def clustered_interval(per_seed: list[dict[str, float]], *, draws: int = 4000,
                       level: float = 0.95, seed: int = 0) -> tuple[float, float] | None:
    """The percentile interval of the mean change under a two-way bootstrap over seeds and
    instructions. None with fewer than 2 seeds or no instruction shared by every seed."""
    shared = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
    if len(per_seed) < 2 or not shared:
        return None
    rng = random.Random(seed)
    means = []
    for _ in range(draws):
        seeds = [rng.randrange(len(per_seed)) for _ in per_seed]
        names = [rng.choice(shared) for _ in shared]
        means.append(sum(per_seed[s][n] for s in seeds for n in names)
                     / (len(seeds) * len(names)))
    means.sort()
    lo = means[int((1 - level) / 2 * draws)]
    hi = means[min(draws - 1, int((1 + level) / 2 * draws))]
    return lo, hi


def answers(records: list[dict]) -> list[tuple[str | None, str, str]]:
    """(word written to the target, or None; the word the file showed; the instance's own word)
    for each scored lookup rollout, from its recorded calls: the last `echo W > TARGET`."""
    from harness.shared.lookup_names import instance_of

    out = []
    for record in records:
        inst = instance_of(record.get("task_id", ""))
        if inst is None or record.get("env_reward") is None:
            continue
        text = " ".join(str(t.get("response")) for t in (record.get("trace") or {})
                        .get("turns", []))
        target = re.escape(inst.target)
        written = re.findall(rf"echo ([A-Za-z0-9_]+) > (?:/app/)?{target}", text)
        out.append((written[-1] if written else None, inst.observed, inst.value))
    return out


def swap_summary(records: list[dict]) -> dict:
    """The swap test: of the rollouts that wrote a word to the target, the share that wrote
    the word the file showed (`follows`) and the share that wrote the instance's original word
    (`original`, which nothing in the sandbox or the instruction shows)."""
    written = [(w, seen, own) for w, seen, own in answers(records) if w is not None]
    n = len(written)
    return {"answered": n, "rollouts": len(answers(records)),
            "follows": round(sum(w == seen for w, seen, _ in written) / n, 4) if n else None,
            "original": round(sum(w == own for w, _, own in written) / n, 4) if n else None}


def pass_rate(records: list[dict]) -> float | None:
    scored = [r for r in records if r.get("env_reward") is not None]
    return round(sum(r["env_reward"] >= 1 for r in scored) / len(scored), 4) if scored else None


def control_summary(runs: list[dict[str, float]]) -> dict:
    """One control over its seeds: each run's change, their mean and its clustered interval
    (runs that failed or were not run are left out before this)."""
    means = [m for m in (seed_mean(c) for c in runs) if m is not None]
    return {"per_seed": means, "mean": sum(means) / len(means) if means else None,
            "interval": clustered_interval(runs)}


def _control_within(summary: dict | None, name: str) -> bool:
    """A control run at one seed is judged on its change; one that needs several seeds on its
    interval, which must lie inside +-NOISE_POINTS (an equivalence test, not a mean that happens
    to land there)."""
    if (summary is None or summary["mean"] is None
            or len(summary["per_seed"]) < CONTROL_MIN_SEEDS[name]):
        return False
    if CONTROL_MIN_SEEDS[name] == 1:
        return abs(summary["mean"]) <= NOISE_POINTS
    interval = summary["interval"]
    return interval is not None and interval[0] >= -NOISE_POINTS and interval[1] <= NOISE_POINTS


def verdict(seeds: list[dict[str, float]], controls: dict[str, dict | None],
            swap: dict | None, blind_pass: float | None) -> dict:
    """Issue 32's bar: the mean rise, its interval's lower end, the controls (each a
    `control_summary`), the diagnostics."""
    means = [m for m in (seed_mean(c) for c in seeds) if m is not None]
    mean = sum(means) / len(means) if means else None
    interval = clustered_interval(seeds)
    flip = controls.get("flip")
    checks = {
        "seeds >= 4": len(means) >= 4,
        f"mean rise >= {RISE_POINTS:.0f}": mean is not None and mean >= RISE_POINTS,
        f"interval lower end >= {RISE_LOWER_POINTS:.0f}":
            interval is not None and interval[0] >= RISE_LOWER_POINTS,
        f"shuffle's 95% interval over >= {CONTROL_MIN_SEEDS['shuffle']} seeds within "
        f"+-{NOISE_POINTS:.0f}": _control_within(controls.get("shuffle"), "shuffle"),
        f"lr0 within +-{NOISE_POINTS:.0f}": _control_within(controls.get("lr0"), "lr0"),
        "flip falls": flip is not None and flip["mean"] is not None and flip["mean"] < 0,
        f"swap follows >= {FOLLOW_SHARE:.0%}":
            bool(swap) and swap.get("follows") is not None and swap["follows"] >= FOLLOW_SHARE,
        "blind at chance (<= 1/8 + 5 points)":
            blind_pass is not None and blind_pass <= 0.125 + NOISE_POINTS / 100,
    }
    return {"mean_rise": mean, "interval": interval, "per_seed": means, "checks": checks,
            "meets_bar": all(checks.values())}


def read_records(folder: Path) -> list[dict]:
    import json

    return [json.loads(p.read_text()) for p in sorted((folder / "rollouts").glob("*.json"))]
