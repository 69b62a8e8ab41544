"""The terminal tables' one rule: a cell's text wraps, it is never cut (issue 32).

rich's default column overflow is an ellipsis: at 80 columns a task name such as
`family-heldout/read-the-value-then-write-it-into-the-named-file-0007` (one long word) became
`family-heldout/read-the-value-then…`, and two tasks differing only at the end looked the same.
Every table harness prints makes its columns here. The pass-rate table lives here too, so that
harness.eval and harness.run.learning both import it from a module that imports neither of them.

    table = Table(title="Pass rate")
    add_columns(table, "task", "passed", "pass rate", right={"passed", "pass rate"})
"""

from __future__ import annotations

from collections.abc import Collection

from rich.table import Table

__all__ = ["PASS_THRESHOLD", "add_columns", "pass_rate_table"]


def add_columns(table: Table, *headers: str, right: Collection[str] = ()) -> Table:
    """Add columns that fold long words onto further lines (no ellipsis); `right`: numbers."""
    for header in headers:
        table.add_column(header, justify="right" if header in right else "left",
                         overflow="fold", no_wrap=False)
    return table


PASS_THRESHOLD = 1.0


def pass_rate_table(records: list[dict]) -> tuple[Table, dict]:
    """Per-task and overall pass rates from rollout records (see harness.shared.run_records)."""
    per_task: dict[str, dict[str, int]] = {}
    for r in records:
        row = per_task.setdefault(r["task_id"], {"passed": 0, "scored": 0, "unscored": 0})
        if r["env_reward"] is None:
            row["unscored"] += 1
        else:
            row["scored"] += 1
            row["passed"] += int(r["env_reward"] >= PASS_THRESHOLD)
    table = Table(title="Pass rate")
    add_columns(table, "task", "passed", "scored", "unscored", "pass rate",
                right={"passed", "scored", "unscored", "pass rate"})
    totals = {"passed": 0, "scored": 0, "unscored": 0}
    for task, row in sorted(per_task.items()):
        rate = row["passed"] / row["scored"] if row["scored"] else None
        table.add_row(task, str(row["passed"]), str(row["scored"]), str(row["unscored"]),
                      "-" if rate is None else f"{rate:.0%}")
        for k in totals:
            totals[k] += row[k]
    overall = totals["passed"] / totals["scored"] if totals["scored"] else None
    table.add_row("overall", str(totals["passed"]), str(totals["scored"]), str(totals["unscored"]),
                  "-" if overall is None else f"{overall:.0%}", style="bold")
    return table, {"per_task": per_task, "overall_pass_rate": overall, **totals}
