"""The committed warm starts: where they are, and their files checked against BUILD.json.

`--model`'s default (launchers/models.py) and setup.sh need only this: the folders under models/
and the sha256 check, never the builders. The builders (capture through the real agent and the
proxy, then SFT) run rollouts, so they live with what they use, in harness/warm/; this module
imports no harness (tests/test_import_graph.py), and a BUILD.json's `built_by` is the command
below that rebuilds it.

- models/tiny-qwen3-create-file: the default (mini-swe-agent, or no --harness), `REBUILD`.
- models/tiny-qwen3-create-file-{codex,opencode,claude-code}: that --harness's default,
  `rebuild_command(harness)`.
- models/tiny-qwen3-lookup: the default of mini-swe-agent on lookup:*, `LOOKUP_REBUILD`.
- models/tiny-qwen3-lookup-{opencode,claude-code}: that --harness's default on lookup:*,
  `lookup_rebuild_command(harness)` (LOOKUP_AGENTS: the agents with one committed).
"""

from __future__ import annotations

from pathlib import Path

from launchers.paths import REPO_ROOT
from launchers.tiny_model import TinyModelError, check_build_hashes

__all__ = ["AGENTS", "AGENT_WARM_MODELS", "LOOKUP_AGENTS", "LOOKUP_MODEL", "LOOKUP_REBUILD",
           "REBUILD", "WARM_MODEL", "committed_agent_warm_model", "committed_lookup_model",
           "committed_warm_model", "lookup_model_dir", "lookup_rebuild_command",
           "rebuild_command"]

WARM_MODEL = REPO_ROOT / "models" / "tiny-qwen3-create-file"
REBUILD = "python -m harness.warm.create_file --commit"
# The agents with their own build committed (the default model of that --harness).
AGENTS = ("codex", "claude-code", "opencode")
AGENT_WARM_MODELS = {h: REPO_ROOT / "models" / f"tiny-qwen3-create-file-{h}" for h in AGENTS}
LOOKUP_MODEL = REPO_ROOT / "models" / "tiny-qwen3-lookup"
LOOKUP_REBUILD = "python -m harness.warm.lookup --commit"
# The agents other than mini-swe-agent with a lookup warm start of their own committed.
LOOKUP_AGENTS: tuple[str, ...] = ("opencode", "claude-code")


def lookup_model_dir(harness: str | None) -> Path:
    """Where `harness`'s lookup warm start is (or would be) committed."""
    if harness in (None, "mini-swe-agent"):
        return LOOKUP_MODEL
    return REPO_ROOT / "models" / f"tiny-qwen3-lookup-{harness}"


def lookup_rebuild_command(harness: str | None) -> str:
    if harness in (None, "mini-swe-agent"):
        return LOOKUP_REBUILD
    return f"python -m harness.warm.lookup --harness {harness} --commit"


def rebuild_command(harness: str) -> str:
    return f"python -m harness.warm.agents --harness {harness} --commit"


def _checked(directory: Path, rebuild: str) -> Path:
    if not (directory / "BUILD.json").exists():
        raise TinyModelError(f"{directory} has no BUILD.json: restore it (git checkout -- "
                             f"{directory}) or rebuild it with `{rebuild}`")
    check_build_hashes(directory, rebuild=rebuild)
    return directory


def committed_warm_model(directory: Path = WARM_MODEL) -> Path:
    """The committed warm-started model, every file checked against its BUILD.json sha256."""
    return _checked(directory, REBUILD)


def committed_agent_warm_model(harness: str, directory: Path | None = None) -> Path:
    """The committed warm start for `harness` (or the build in `directory`), every file checked
    against its BUILD.json."""
    if harness not in AGENT_WARM_MODELS:
        raise ValueError(f"no agent warm start for {harness!r}; there are "
                         f"{sorted(AGENT_WARM_MODELS)} (mini-swe-agent's is {WARM_MODEL.name})")
    return _checked(directory or AGENT_WARM_MODELS[harness], rebuild_command(harness))


def committed_lookup_model(directory: Path = LOOKUP_MODEL, harness: str | None = None) -> Path:
    """The committed lookup warm start (mini-swe-agent's, or `harness`'s where LOOKUP_AGENTS has
    it), every file checked against its BUILD.json sha256."""
    if harness not in (None, "mini-swe-agent"):
        if harness not in LOOKUP_AGENTS:
            raise ValueError(f"no lookup warm start for {harness!r}; there are "
                             f"{['mini-swe-agent', *LOOKUP_AGENTS]}")
        directory = lookup_model_dir(harness)
    return _checked(directory, lookup_rebuild_command(harness))
