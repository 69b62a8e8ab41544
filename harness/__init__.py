"""Harness rollouts: Harbor tasks, sandboxes, agents, sessions, the session factory, and the
`train` / `eval` commands that wire every room.

Importing `harness` imports nothing heavy (no harbor, torch or httpx): subpackages are imported
where they are used, so `python -m harness.train --help` and the capture service stay fast.

The folders are laid out by the process their code runs in. tests/test_import_graph.py checks,
on the source, that nothing the trainer's process loads imports the service side (harbor,
openenv, capture, harness/service/, harness/tasks/, serve, eval, audit), not even lazily:

    harness/            the commands (`python -m harness.X`): train (the trainer's process), serve
                        and eval (rollout processes: eval runs its rollouts in-process), view/,
                        audit/ (rollouts against attacks), warm/ (offline builders)
    harness/shared/     both sides: errors, the rollout and outcome types, tables, run config,
                        run folders and records, sampling seeds, per_loop, backoff, the lookup
                        family's names and per-step rates (read from rollout records)
    harness/client/     the trainer's side of the rollout service: remote (RemoteSessionFactory;
                        with service_pool, remote_session, remote_results, remote_errors), spawn
                        (starts `python -m harness.serve` as a child process)
    harness/run/        what a train or eval command runs around the rollouts, on the trainer's
                        side of the contract: stack (model, engine, rollout services), preflight
                        (the checks that need no harbor), ready, learning, plots, eval_weights
    harness/service/    the rollout service's process (`python -m harness.serve`, or eval's):
                        state and routes, factory, session (with session_config,
                        session_grading, session_steps, session_loop), proxy_link, local_proxy
                        (its capture proxy, exposed), preflight (tasks and sandbox checks),
                        sandboxes/ (bubblewrap, grading), agents/ (opencode, claude-code, codex,
                        mini-swe-agent)
    harness/tasks/      service side: task specs and loaders (local folder, registry dataset, HF
                        dataset repo), the generated families
    harness/warm/       the warm-start builders, run by hand (`python -m harness.warm.X --commit`):
                        SFT on scripted rollouts captured through the real agent and proxy into
                        the committed models/; offline, minutes; never imported by train or serve
"""

__all__: list[str] = []
