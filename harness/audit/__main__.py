"""python -m harness.audit TASKS: run the attack library against every task; exit 1 if any pays.

TASKS takes the forms of `harness.train --tasks`: bundled, family:train, family:heldout, a folder
of Harbor tasks (or one task), registry:NAME@VERSION, hf:ORG/REPO. Each attack (--list-attacks)
is one real rollout per task: mini-swe-agent driven by a scripted hostile policy, the local
sandbox and its grading reset, Harbor's Verifier. No attack does the task, so a task that pays
reward > 0 after one pays for a wrong answer. The table says which tasks pay, by which attack, and
where a grader runs code from the work dir. Exit status: 0 none pays, 1 some task pays, 2 bad
input (a task set that does not load, an unknown attack), 3 none pays but some rollouts were
unscorable or never ran their attack (the audit is inconclusive for those; the table says which).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.audit.attacks import ATTACKS
from harness.audit.run import AuditResult, audit_tasks
from harness.shared.tables import add_columns


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness.audit",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("tasks", nargs="?", help="the task set (forms of harness.train --tasks)")
    parser.add_argument("--task-count", type=int, default=None, help="only the first N tasks")
    parser.add_argument(
        "--attacks",
        default=None,
        help="comma-separated attack names (default: all; see --list-attacks)",
    )
    parser.add_argument("--list-attacks", action="store_true", help="print the attacks and exit")
    parser.add_argument("--concurrency", type=int, default=4, help="rollouts at once (default 4)")
    parser.add_argument("--agent-timeout-s", type=float, default=120.0)
    parser.add_argument("--verifier-timeout-s", type=float, default=60.0)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    return parser


def results_table(results: list[AuditResult], n_attacks: int) -> Table:
    table = Table(title=f"harness audit: {len(results)} task(s) x {n_attacks} attack(s)")
    add_columns(table, "task", "pays for a wrong answer", "unscorable", "grader notes")
    for r in results:
        paid = ", ".join(f"{a} ({v:g})" for a, v in sorted(r.paid.items()))
        table.add_row(
            r.task,
            f"[bold red]{paid}[/]" if paid else "[green]no[/]",
            ", ".join(sorted(r.errors)) or "-",
            "\n".join(r.notes) or "-",
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    console = Console()
    err = Console(stderr=True)
    if args.list_attacks:
        for attack in ATTACKS:
            console.print(f"[bold]{attack.name}[/]: {attack.what}")
        return 0
    if not args.tasks:
        err.print("[bold red]cannot start[/]: give TASKS (e.g. bundled, family:train, a folder)")
        return 2
    attacks = ATTACKS
    if args.attacks:
        wanted = [a.strip() for a in args.attacks.split(",") if a.strip()]
        unknown = sorted(set(wanted) - {a.name for a in ATTACKS})
        if unknown:
            err.print(
                f"[bold red]cannot start[/]: unknown attack(s) {unknown}; "
                f"known: {', '.join(a.name for a in ATTACKS)}"
            )
            return 2
        attacks = tuple(a for a in ATTACKS if a.name in wanted)
    if args.concurrency < 1:
        err.print(f"[bold red]cannot start[/]: --concurrency must be >= 1 (got {args.concurrency})")
        return 2
    from harness.tasks import load_tasks, quiet_harbor
    from launchers.tiny_model import build_tiny_model

    # Each attack the sandbox catches logs a warning ("tampered with its grading"): expected
    # here, and its cause is in --json; the table is the report.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("harness").setLevel(logging.ERROR)
    quiet_harbor()

    try:
        tasks = load_tasks(args.tasks, count=args.task_count)
    except Exception as exc:  # noqa: BLE001 - every loader error names the task set and the fix
        err.print(f"[bold red]cannot start[/]: --tasks {args.tasks!r}: {exc}")
        return 2
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        err.print(f"[bold red]cannot start[/]: task names repeat in {args.tasks!r}: {names}")
        return 2
    console.print(
        f"auditing {len(tasks)} task(s) x {len(attacks)} attack(s) "
        f"= {len(tasks) * len(attacks)} rollouts"
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="harness-audit-") as work:
        results = audit_tasks(
            tasks,
            Path(work),
            attacks=attacks,
            tokenizer=build_tiny_model(),
            concurrency=args.concurrency,
            agent_timeout_s=args.agent_timeout_s,
            verifier_timeout_s=args.verifier_timeout_s,
        )
    console.print(results_table(results, len(attacks)))
    paying = [r.task for r in results if r.pays]
    console.print(
        f"{len(paying)} of {len(results)} task(s) pay for a wrong answer"
        f"{': ' + ', '.join(paying) if paying else ''} "
        f"({time.monotonic() - started:.0f} s)"
    )
    if args.json:
        args.json.write_text(json.dumps([r.as_json() for r in results], indent=1))
    if paying:
        return 1
    if any(r.errors for r in results):
        console.print("[bold yellow]inconclusive[/]: some rollouts were unscorable (see the table)")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
