"""Harness rollouts: Harbor tasks, sandboxes, agents, sessions and the session factory.

Importing `harness` imports nothing heavy (no harbor, torch or httpx): subpackages are imported
where they are used, so `python -m harness.train --help` and the capture service stay fast.

    harness.tasks       load Harbor task dirs (local folder, registry dataset, HF dataset repo)
    harness.sandboxes   the local bubblewrap sandbox (a Harbor environment) and remote exposure
"""

__all__: list[str] = []
