"""Where a run's model comes from: the tiny default, a local directory, or the HF hub, resolved once.

The one decision: a hub id (`--model Qwen/Qwen3-4B`, or `org/name@revision`) is resolved to one
commit and downloaded once, by the process that starts the run, through huggingface_hub's own
`snapshot_download` (its cache, its token, its HF_ENDPOINT). The engine and the trainer then both
get the local snapshot directory (`.../snapshots/<commit>`), so they load the same revision by
construction: two processes each asking the hub for "main" could get two commits if a push lands
between them. Past that point the model is local, and only then is HF_HUB_OFFLINE=1 right for the
engine (launchers/engine.py).

What is downloaded: configs, tokenizer files, chat templates and `*.safetensors` weights. Not
`*.bin`/`*.pth`/GGUF/ONNX duplicates, which would double a 4B download for files neither vLLM nor
transformers reads when safetensors exist. A repo with no safetensors is an error naming that.

Errors name the fix: a hub that cannot be reached (HF_ENDPOINT, a proxy, or pre-download and
HF_HUB_OFFLINE=1), a missing or gated repo (HF_TOKEN / `hf auth login`), an unknown revision,
a path that does not exist.

    python -m launchers.models Qwen/Qwen3-4B       # download (or find in the cache); print the path
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "HubUnreachableError",
    "ModelError",
    "ResolvedModel",
    "WEIGHT_PATTERNS",
    "parse_hub_id",
    "resolve_model",
]

# What a run loads from a hub repo (huggingface_hub allow_patterns).
WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")


class ModelError(ValueError):
    """The model cannot be found or fetched; the message says why and what to do."""


class HubUnreachableError(ModelError):
    """The hub could not be reached and the model is not in the local cache."""


@dataclass(frozen=True)
class ResolvedModel:
    """A model every process of the run loads from the same local directory."""

    path: Path
    source: str  # "tiny" (built here), "local" (a directory given), "hub" (a snapshot)
    repo_id: str | None = None
    revision: str | None = None  # the commit sha, for hub models

    def describe(self) -> str:
        if self.source == "hub":
            return f"{self.repo_id}@{self.revision} (hub snapshot {self.path})"
        return f"{self.path} ({self.source})"


def parse_hub_id(spec: str) -> tuple[str, str | None] | None:
    """`org/name` or `org/name@revision` -> (repo_id, revision or None); None if not a hub id."""
    match = _HUB_ID.match(spec)
    return (match["repo"], match["rev"]) if match else None


def _check_local(path: Path, spec: str) -> None:
    if not (path / "config.json").exists():
        raise ModelError(f"--model {spec}: {path} has no config.json; give an HF model directory "
                         "(config.json, tokenizer, *.safetensors) or a hub id like Qwen/Qwen3-4B")


def lookup_default(harness: str | None, tasks: str | None) -> bool:
    """Whether the default model is a lookup family warm start: on lookup:*, mini-swe-agent's
    and those of LOOKUP_AGENTS (the other agents start from their create-file one)."""
    from launchers.warm_models import LOOKUP_AGENTS

    return harness in (None, "mini-swe-agent", *LOOKUP_AGENTS) and (tasks or "").startswith(
        "lookup:")


def resolve_model(spec: str | None, *, harness: str | None = None, tasks: str | None = None,
                  endpoint: str | None = None, token: str | bool | None = None) -> ResolvedModel:
    """The local directory every process of the run should load `spec` from.

    None is the default model, committed under models/: on the lookup family (`tasks`
    lookup:*) with mini-swe-agent (or no harness), the tiny model warm-started on its train
    pairs (tiny-qwen3-lookup, harness/warm/lookup.py), with an agent of LOOKUP_AGENTS its own
    (tiny-qwen3-lookup-HARNESS); otherwise the tiny model
    warm-started on the create-file family's train tasks in `harness`'s own prompt format
    (tiny-qwen3-create-file by harness/warm/create_file.py for mini-swe-agent and no harness;
    tiny-qwen3-create-file-{codex,opencode,claude-code} by harness/warm/agents.py for those
    three); its files
    checked against BUILD.json; a run's --seed sets its sampling and training, not which model it
    starts from); an existing directory is used as
    is; `org/name[@rev]` is downloaded from the hub (or found in its cache) at one commit.
    `endpoint`/`token` default to huggingface_hub's own (HF_ENDPOINT, HF_TOKEN or the saved login).
    """
    if spec is None:
        from launchers.warm_models import (
            AGENT_WARM_MODELS,
            committed_agent_warm_model,
            committed_lookup_model,
            committed_warm_model,
        )

        if lookup_default(harness, tasks):
            return ResolvedModel(committed_lookup_model(harness=harness), "tiny")
        if harness in AGENT_WARM_MODELS:
            return ResolvedModel(committed_agent_warm_model(harness), "tiny")
        return ResolvedModel(committed_warm_model(), "tiny")
    path = Path(spec).expanduser()
    if path.exists():
        _check_local(path, spec)
        return ResolvedModel(path.resolve(), "local")
    hub = parse_hub_id(spec)
    if spec.startswith((".", "/", "~")) or hub is None:
        raise ModelError(f"--model {spec}: no such directory, and not a hub id (org/name or "
                         "org/name@revision)")
    repo_id, revision = hub
    return _download(repo_id, revision, endpoint=endpoint, token=token)


def _download(repo_id: str, revision: str | None, *, endpoint: str | None,
              token: str | bool | None) -> ResolvedModel:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = endpoint or constants.ENDPOINT
    name = f"{repo_id}@{revision}" if revision else repo_id
    try:
        # snapshot_download resolves the revision to one commit (repo_info), then fetches every
        # file at that commit; with the hub unreachable it falls back to a cached snapshot.
        snapshot = Path(snapshot_download(repo_id, revision=revision, allow_patterns=WEIGHT_PATTERNS,
                                          endpoint=endpoint, token=token))
    except GatedRepoError as exc:
        raise ModelError(f"--model {name}: the repo is gated on {where}; accept its terms on the "
                         "hub and give a token (HF_TOKEN or `hf auth login`)") from exc
    except RevisionNotFoundError as exc:
        raise ModelError(f"--model {name}: no revision {revision!r} in {repo_id} on {where}; "
                         "give a branch, tag or commit that exists") from exc
    except RepositoryNotFoundError as exc:
        raise ModelError(f"--model {name}: no such model on {where}, or it is private and no "
                         "token was given (HF_TOKEN or `hf auth login`)") from exc
    except LocalEntryNotFoundError as exc:
        if constants.HF_HUB_OFFLINE:
            raise HubUnreachableError(
                f"--model {name}: HF_HUB_OFFLINE=1 and the model is not in the cache "
                f"({constants.HF_HUB_CACHE}); unset HF_HUB_OFFLINE to download it, or give a "
                "local model directory") from exc
        raise HubUnreachableError(
            f"--model {name}: cannot reach the hub at {where} and the model is not in the cache "
            f"({constants.HF_HUB_CACHE}). Check the network (or HF_ENDPOINT / HTTPS_PROXY), or "
            "download it where the hub is reachable (`python -m launchers.models "
            f"{name}`) and run with HF_HUB_OFFLINE=1, or give a local model directory. "
            f"Cause: {exc}") from exc
    if not any(snapshot.glob("*.safetensors")):
        raise ModelError(f"--model {name}: the snapshot {snapshot} has no *.safetensors weights; "
                         "vLLM and the trainer load safetensors: convert the weights or give a "
                         "local directory that has them")
    _check_local(snapshot, name)
    # The snapshot folder is named after the commit it holds.
    return ResolvedModel(snapshot, "hub", repo_id=repo_id, revision=snapshot.name)


def main(argv: list[str] | None = None) -> int:
    """`python -m launchers.models SPEC`: resolve a model once; print its directory (or JSON)."""
    parser = argparse.ArgumentParser(prog="python -m launchers.models", description=main.__doc__)
    parser.add_argument("model", help="a local HF model directory or a hub id (org/name[@rev])")
    parser.add_argument("--json", action="store_true", help="print path, source, repo and commit")
    args = parser.parse_args(argv)
    try:
        resolved = resolve_model(args.model)
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**asdict(resolved), "path": str(resolved.path)}))
    else:
        print(resolved.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
