"""Rollout services for tests: `harness.serve.spawn_service` with the tests' defaults."""

from __future__ import annotations

from pathlib import Path

from harness.serve import LocalService, spawn_service

__all__ = ["LocalService", "start_service"]


def start_service(engine_url: str, workdir: Path, *, tasks: str, key: str,
                  max_sessions: int = 4, extra_args: list[str] | None = None) -> LocalService:
    return spawn_service(engine_url, workdir, key=key, tasks=tasks, max_sessions=max_sessions,
                         extra_args=extra_args)
