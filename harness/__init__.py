"""Harness rollouts: Harbor tasks, sandboxes, agents, sessions, the session factory, and the
`train` / `eval` commands that wire every room.

Importing `harness` imports nothing heavy (no harbor, torch or httpx): subpackages are imported
where they are used, so `python -m harness.train --help` and the capture service stay fast.

The folders are laid out by the process their code runs in (tests/test_import_graph.py checks
that the trainer's process never imports the service's):

    harness/            the commands: train, eval, serve, view/, audit/ (`python -m harness.X`)
    harness/shared/     every process: errors, the rollout and outcome types, tables, run config,
                        run folders and records, sampling seeds, per_loop
    harness/service/    the rollout service's process (`python -m harness.serve`, or eval's
                        in-process stack): state, routes, factory, session (with session_config,
                        session_grading, session_steps, session_loop), proxy_link, sandboxes/
                        (bubblewrap, grading), agents/ (opencode, claude-code, codex,
                        mini-swe-agent)
    harness/client/     the trainer's process: remote (RemoteSessionFactory, no openenv or harbor;
                        with service_pool, remote_session, remote_results, remote_errors), spawn
                        (starts `python -m harness.serve` as a child process)
    harness/run/        the process a train/eval command runs in, around the rollouts: stack
                        (engine, proxy, service), preflight, ready, learning, plots, eval_weights
    harness/tasks/      task specs and loaders (local folder, registry dataset, HF dataset repo)
    harness/warm/       the warm-start builders, run by hand (`python -m harness.warm.X --commit`):
                        SFT on scripted rollouts captured through the real agent and proxy into
                        the committed models/; offline, minutes; never imported by train or serve
"""

__all__: list[str] = []
