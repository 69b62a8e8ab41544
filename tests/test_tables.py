"""Every table harness prints keeps its cells whole at 80 columns: long task names wrap, never cut.

Run: .venv/bin/python -m pytest tests/test_tables.py -q

Each table is rendered by rich as a terminal 80 columns wide shows it, and read back from the
text: the first column's pieces, joined, must give every name whole, with no ellipsis anywhere,
and the other cells must say what the records say.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from harness.eval import pass_rate_table
from harness.run.learning import before_after_table
from harness.shared.run_records import summary_tables

LONG = "family-heldout/read-the-value-from-the-sandbox-then-write-it-into-the-named-file-0007"
LONG_2 = "family-heldout/read-the-value-from-the-sandbox-then-write-it-into-the-named-file-0008"


def render(table: Table) -> list[list[str]]:
    """The table's body as printed at 80 columns: a list of rows, each a list of its cells'
    text, a wrapped cell's lines joined. A line is drawn between rows (show_lines, which changes
    no width) so that a wrapped row's lines are told from the next row's."""
    table.show_lines = True
    console = Console(width=80, record=True, color_system=None)
    console.print(table)
    text = console.export_text()
    assert "…" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    rows: list[list[str]] = [[]]
    for line in text.split("┡", 1)[1].splitlines()[1:]:  # below the header
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip().strip("│").split("│")]
            rows[-1] = [a + b for a, b in zip(rows[-1], cells, strict=True)] if rows[-1] \
                else cells
        elif rows[-1]:  # a line between rows, or the bottom
            rows.append([])
    return rows[:-1]


def test_the_pass_rate_table_keeps_long_task_names_whole() -> None:
    records = [{"task_id": LONG, "env_reward": 1.0}, {"task_id": LONG, "env_reward": 0.0},
               {"task_id": LONG_2, "env_reward": None}, {"task_id": "short", "env_reward": 1.0}]
    table, _ = pass_rate_table(records)
    rows = render(table)
    assert rows == [[LONG, "1", "2", "0", "50%"], [LONG_2, "0", "0", "1", "-"],
                    ["short", "1", "1", "0", "100%"], ["overall", "2", "3", "1", "67%"]]


def test_the_before_after_table_keeps_long_task_names_whole() -> None:
    before = {"per_task": {LONG: {"passed": 1, "scored": 4, "unscored": 0},
                           LONG_2: {"passed": 0, "scored": 4, "unscored": 0}},
              "passed": 1, "scored": 8, "unscored": 0}
    after = {"per_task": {LONG: {"passed": 3, "scored": 4, "unscored": 0},
                          LONG_2: {"passed": 4, "scored": 4, "unscored": 0}},
             "passed": 7, "scored": 8, "unscored": 0}
    table, _ = before_after_table(before, after)
    rows = render(table)
    assert [r[0] for r in rows] == [LONG, LONG_2, "overall"]
    assert rows[0][1:] == ["1/4", "3/4", "+50"] and rows[1][1:] == ["0/4", "4/4", "+100"]
    # "1/8 (12%)" may wrap at its space: compared without the spaces the wrap removed
    assert [c.replace(" ", "") for c in rows[2][1:]] == ["1/8(12%)", "7/8(88%)", "+75.0points"]


def test_the_summary_tables_keep_long_causes_and_phases_whole() -> None:
    phase = "sandbox_start_and_agent_install_and_verifier_upload_" * 2 + "s"
    records = [{"cause": "ok", "timings": {phase: 2.0}},
               {"cause": "a_cause_no_one_has_named_yet_" * 3, "timings": {phase: 4.0}}]
    history = [{"reward/mean": 0.5, "loss": 0.1, "tokens/trained": 40,
                "groups/skipped/zero_variance": 1, "time/weight_sync_s": 1.25}]
    causes, steps, phases = (render(t) for t in summary_tables(records, history,
                                                                {"engine_start_s": 30.0}))
    counted = {r[0]: r[1] for r in causes}
    assert counted["a_cause_no_one_has_named_yet_" * 3] == "1" and counted["total"] == "2"
    assert steps == [["1", "0.500", "0.1000", "40", "1", "1.25"]]
    # "rollout <phase> (mean)" wraps at its spaces first: compared without them
    assert [[c.replace(" ", "") for c in r] for r in phases] == [
        ["engine_start_s", "30.0"], [f"rollout{phase}(mean)", "3.0"]]


def test_no_table_harness_prints_has_a_column_that_cuts() -> None:
    """Every column of every table is set to fold (the default, ellipsis, cuts)."""
    tables = [pass_rate_table([{"task_id": "a", "env_reward": 1.0}])[0],
              before_after_table({"per_task": {}, "passed": 0, "scored": 0},
                                 {"per_task": {}, "passed": 0, "scored": 0})[0],
              *summary_tables([], [{"loss": 0.0}], {})]
    for table in tables:
        assert all(c.overflow == "fold" and not c.no_wrap for c in table.columns), table.title
