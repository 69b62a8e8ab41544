"""Harness rollouts: Harbor tasks, sandboxes, agents, sessions, the session factory, and the
`train` / `eval` commands that wire every room.

Importing `harness` imports nothing heavy (no harbor, torch or httpx): subpackages are imported
where they are used, so `python -m harness.train --help` and the capture service stay fast.

    harness.tasks       load Harbor task dirs (local folder, registry dataset, HF dataset repo)
    harness.sandboxes   the local bubblewrap sandbox (a Harbor environment) and remote exposure
    harness.agents      opencode, claude-code, codex, mini-swe-agent, pointed at the capture proxy
    harness.session     HarborSession: sandbox -> agent -> verifier -> TrainingTrace -> close
    harness.factory     HarborSessionFactory: bounded, retried rollouts, each with a cause
    harness.outcome     HarnessRolloutOutcome: what a reward function sees
    harness.serve       `python -m harness.serve`: rollouts as an HTTP service (own host/env)
    harness.remote      RemoteSessionFactory: the trainer's client (no openenv, no harbor)
    harness.train       `python -m harness.train`: the recipe (engine, rollout service, trainer)
    harness.eval        `python -m harness.eval`: rollouts and pass rates, no training
"""

__all__: list[str] = []
