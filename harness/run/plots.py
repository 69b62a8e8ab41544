"""Charts a person can read: the reward curve and the held-out pass rate before/after training.

Why it exists (issue 32): a PNG is what a reader opens first, and a chart without axes, ticks,
labels or a legend has to be decoded with the JSON beside it. These are drawn with matplotlib's
Agg backend (no display is ever needed), through its object API (a `Figure` of its own, no pyplot
global state), so the figure a test inspects is the one written.

    fig = line_figure([1, 2], {"reward mean": [0.1, 0.4]}, title=..., xlabel=..., ylabel=...)
    save_png(fig, run_dir / "reward_curve.png")
    save_png(before_after_figure(json.loads(before_after_json)), run_dir / "before_after.png")

matplotlib is imported inside the functions: `python -m harness.train --help` never pays for it.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

__all__ = ["DPI", "before_after_figure", "before_after_rows", "line_figure", "save_png"]

DPI = 100
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
LABEL_WIDTH = 32  # task names wrap (never cut) at this many characters on the y axis


def _figure(width_in: float, height_in: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=DPI)
    FigureCanvasAgg(fig)  # attaches itself: savefig renders with Agg, whatever the rcParams say
    return fig


def _nan(values: list[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def line_figure(xs: list[float], series: dict[str, list[float | None]], *, title: str,
                xlabel: str, ylabel: str, ylim: tuple[float, float] | None = None) -> Any:
    """One line with markers per named series over `xs`; None is a gap in the line."""
    fig = _figure(6.4, 3.6)
    ax = fig.add_subplot()
    for (name, values), colour in zip(series.items(), COLOURS * len(series), strict=False):
        if len(values) != len(xs):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(xs)} x values")
        ax.plot(xs, _nan(values), marker="o", color=colour, label=name)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if xs and all(float(x).is_integer() for x in xs):  # steps: integer ticks only
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    return fig


def _rate(row: dict | None) -> float | None:
    if not row or not row.get("scored"):
        return None
    return row["passed"] / row["scored"]


def before_after_rows(data: dict) -> list[tuple[str, float | None, float | None]]:
    """(label, before %, after %) per task, then overall, from before_after.json's data."""
    rows = []
    for task, row in sorted((data.get("per_task") or {}).items()):
        rows.append((task, _pct(_rate(row.get("before"))), _pct(_rate(row.get("after")))))
    rows.append(("overall", _pct(data.get("before_pass_rate")), _pct(data.get("after_pass_rate"))))
    return rows


def _pct(rate: float | None) -> float | None:
    return None if rate is None else 100.0 * rate


def before_after_figure(data: dict, *, title: str = "Held-out pass rate before and after training"
                        ) -> Any:
    """Horizontal bars per task and overall (before, after), the change written beside each pair.

    `data` is before_after.json (harness.run.learning.before_after_table). Horizontal bars keep long
    task names readable (wrapped, never cut); a side with nothing scored has no bar and says so.
    """
    rows = before_after_rows(data)
    labels = [textwrap.fill(name, LABEL_WIDTH, break_on_hyphens=False) for name, _, _ in rows]
    lines = sum(label.count("\n") + 1 for label in labels)
    fig = _figure(8.0, max(3.0, 0.32 * lines + 0.35 * len(rows) + 1.4))
    ax = fig.add_subplot()
    h = 0.38
    ys = list(range(len(rows)))[::-1]  # first task on top, overall at the bottom
    before = [b if b is not None else math.nan for _, b, _ in rows]
    after = [a if a is not None else math.nan for _, _, a in rows]
    for offset, values, colour, label in ((h / 2, before, COLOURS[0], "before training"),
                                          (-h / 2, after, COLOURS[1], "after training")):
        bars = ax.barh([y + offset for y in ys], values, height=h, color=colour, label=label)
        # Each bar's value at its end: a 0% bar has no width, and must still be read as 0%.
        ax.bar_label(bars, labels=["" if math.isnan(v) else f"{v:.0f}%" for v in values],
                     padding=2, fontsize=7)
    for y, (_, b, a) in zip(ys, rows, strict=True):
        text = ("not scored" if b is None or a is None else f"{a - b:+.1f} points")
        ax.text(109, y, text, va="center", fontsize=9, gid="change")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.get_yticklabels()[-1].set_fontweight("bold")  # "overall"
    ax.set_xlim(0, 132)
    ax.set_xticks(range(0, 101, 20))
    ax.set_xlabel("pass rate (% of scored rollouts; the change in points at the right)")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    # Below the axes, where no bar or note can be under it.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def save_png(fig: Any, path: Path) -> Path:
    """Write `fig` as a PNG of exactly its size in pixels (figsize x DPI)."""
    fig.savefig(path, format="png", dpi=DPI)
    return path
