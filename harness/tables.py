"""The terminal tables' one rule: a cell's text wraps, it is never cut (issue 32).

rich's default column overflow is an ellipsis: at 80 columns a task name such as
`family-heldout/read-the-value-then-write-it-into-the-named-file-0007` (one long word) became
`family-heldout/read-the-value-then…`, and two tasks differing only at the end looked the same.
Every table harness prints makes its columns here.

    table = Table(title="Pass rate")
    add_columns(table, "task", "passed", "pass rate", right={"passed", "pass rate"})
"""

from __future__ import annotations

from collections.abc import Collection

from rich.table import Table

__all__ = ["add_columns"]


def add_columns(table: Table, *headers: str, right: Collection[str] = ()) -> Table:
    """Add columns that fold long words onto further lines (no ellipsis); `right`: numbers."""
    for header in headers:
        table.add_column(header, justify="right" if header in right else "left",
                         overflow="fold", no_wrap=False)
    return table
