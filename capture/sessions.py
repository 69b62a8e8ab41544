"""Sessions: one per rollout, each with its own secret, sampling policy, graph and on-disk log.

The one decision: the session id travels in the URL path (`/s/{id}/v1/...`) and its secret in the
agent's API-key slot (`Authorization: Bearer` or `x-api-key`), so every agent SDK carries both
without knowing it is being recorded, and one proxy serves a whole GRPO group. OpenEnv 0.10 used
the key itself as the session id; keeping them apart lets the id appear in logs and URLs while the
secret does not, and the secret is compared in constant time (`hmac.compare_digest`).

Persistence ("nothing captured is lost"): with a data dir, each session is a folder

    <data_dir>/sessions/<id>/session.json   id, secret, sampling, metadata (mode 0600)
    <data_dir>/sessions/<id>/calls.jsonl    one line per completed call, appended as it completes

A call line holds only what the call adds (its new prompt tokens, its completion, its logprobs,
its parent), so the log grows with the conversation, not with turns x history. A proxy restarted
on the same data dir replays the logs and serves the same sessions and traces; a torn last line
(a crash mid-write) is skipped and counted.

What it refuses: to let one session read or write another's data (every agent route resolves
exactly one session from the path and checks that session's own secret) and to keep a session
the owner deleted (DELETE removes its folder too).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import shutil
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .dialects.memo import TranslationMemo
from .early import EarlyBodies
from .errors import BadRequest, BadSessionKey, UnknownSession
from .graph import Node, RolloutGraph
from .recorder import Capture
from .resent import EngineBodies, RequestReader
from .sampling import SamplingPolicy
from .upstream import dumps, loads

__all__ = ["Session", "SessionStore"]

logger = logging.getLogger(__name__)

_SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


@dataclass(eq=False)
class Session:
    """One rollout's capture: graph of completed calls, failed calls, counters, log file."""

    session_id: str
    secret: str
    policy: SamplingPolicy
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    graph: RolloutGraph = field(default_factory=RolloutGraph)
    failed: list[dict[str, Any]] = field(default_factory=list)
    n_calls: int = 0  # calls started (ok + failed + in flight)
    in_flight: int = 0
    torn_log_lines: int = 0
    log_path: Path | None = None
    # What recent requests translated to, so a resent history is not re-translated (not persisted:
    # a restarted proxy just translates the next call in full).
    memo: TranslationMemo = field(default_factory=TranslationMemo)
    # The last request bodies, in and out, so a resent history is neither parsed nor serialised
    # again (capture/resent.py; not persisted either).
    reader: RequestReader = field(default_factory=RequestReader)
    engine_bodies: EngineBodies = field(default_factory=EngineBodies)
    # Engine bodies known before the full translation (capture/early.py; not persisted).
    early: EarlyBodies = field(default_factory=EarlyBodies)

    def check_key(self, presented: str | None) -> None:
        if presented is None or not hmac.compare_digest(
            presented.encode("utf-8", "surrogatepass"), self.secret.encode()
        ):
            raise BadSessionKey(
                f"wrong or missing key for session {self.session_id}: send the session secret "
                "from POST /admin/sessions as `Authorization: Bearer <secret>` or `x-api-key`"
            )

    def next_call_id(self) -> str:
        self.n_calls += 1
        return f"{self.session_id}:{self.n_calls}"

    # --- recording --------------------------------------------------------------------------
    def record_ok(self, call_id: str, capture: Capture, info: dict[str, Any]) -> Node:
        """Add a completed call to the graph and append it to the log."""
        messages = info.pop("_messages", None) or []
        node = self.graph.add(
            call_id, capture.prompt_ids, capture.completion_ids, capture.logprobs, info
        )
        # The request as this call adds to it: the messages after the parent's request and reply,
        # so a 150-turn session keeps each message once, not 150 times.
        skip = node.parent.info.get("n_messages", 0) + 1 if node.parent is not None else 0
        info["request"]["new_messages"] = messages[skip:]
        info["request"]["n_messages"] = len(messages)
        info["n_messages"] = len(messages)
        node.messages = messages
        if node.parent is not None:
            node.parent.messages = None  # no longer a leaf; rebuilt from the path if ever needed
        if self.log_path is not None:
            self._append({
                "kind": "call",
                "node_id": call_id,
                "parent_id": node.parent_id,
                "start": node.start,
                "seg": node.seg.tolist(),
                "completion": node.completion.tolist(),
                "logprobs": [None if math.isnan(x) else x for x in node.logprobs],
                "info": info,
            })
        return node

    def record_failed(self, call_id: str, error: Exception, info: dict[str, Any]) -> None:
        info.pop("_messages", None)
        entry = {
            "call_id": call_id,
            "cause": type(error).__name__,
            "message": str(error)[:2000],
            **{k: v for k, v in info.items() if k not in ("hint", "request")},
        }
        self.failed.append(entry)
        self._append({"kind": "failed", **entry})

    def _append(self, record: dict[str, Any]) -> None:
        if self.log_path is None:
            return
        try:
            with open(self.log_path, "ab") as handle:
                handle.write(dumps(record) + b"\n")
        except OSError as exc:  # a full disk must not kill the agent's call; it is logged loudly
            logger.error("session %s: could not append to %s: %s", self.session_id,
                         self.log_path, exc)

    # --- replay -----------------------------------------------------------------------------
    def replay(self, line: bytes) -> None:
        record = loads(line)
        if record.get("kind") == "failed":
            record.pop("kind")
            self.failed.append(record)
            self.n_calls += 1
            return
        request = record["info"].get("request") or {}
        if "new_messages" not in request and "messages" in request:  # an older log's name
            request["new_messages"] = request.pop("messages")
        node = Node(
            node_id=record["node_id"],
            start=record["start"],
            seg=array("i", record["seg"]),
            completion=array("i", record["completion"]),
            logprobs=array("d", [math.nan if x is None else x for x in record["logprobs"]]),
            info=record["info"],
        )
        self.graph.restore(node, record["parent_id"])
        self.n_calls += 1

    def describe(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "created_at": self.created_at,
            "metadata": self.metadata,
            "sampling": self.policy.as_dict(),
            "n_calls": self.n_calls,
        }


class SessionStore:
    """All sessions of one proxy, optionally backed by a data dir."""

    def __init__(self, data_dir: Path | None = None) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self._sessions: dict[str, Session] = {}
        if self.data_dir is not None:
            (self.data_dir / "sessions").mkdir(parents=True, exist_ok=True)

    def __len__(self) -> int:
        return len(self._sessions)

    def ids(self) -> list[str]:
        return list(self._sessions)

    def create(
        self,
        sampling: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        try:
            policy = SamplingPolicy.from_dict(sampling)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequest("metadata must be a JSON object")
        if session_id is None:
            session_id = "s" + secrets.token_hex(10)
        elif not isinstance(session_id, str) or not _SESSION_ID_RE.fullmatch(session_id):
            raise BadRequest("session_id must match [A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
        if session_id in self._sessions:
            raise BadRequest(f"session {session_id} already exists", status=409)
        session = Session(session_id, secrets.token_urlsafe(24), policy, dict(metadata or {}))
        if self.data_dir is not None:
            folder = self.data_dir / "sessions" / session_id
            folder.mkdir(parents=True, exist_ok=False)
            header = {
                "session_id": session_id,
                "secret": session.secret,
                "sampling": sampling,
                "metadata": session.metadata,
                "created_at": session.created_at,
            }
            _write_private(folder / "session.json", json.dumps(header).encode())
            session.log_path = folder / "calls.jsonl"
        self._sessions[session_id] = session
        return session

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSession(session_id)
        return session

    def delete(self, session_id: str) -> None:
        self.get(session_id)
        del self._sessions[session_id]
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir / "sessions" / session_id, ignore_errors=True)

    def recover(self) -> int:
        """Load every session folder under the data dir; returns how many were recovered."""
        if self.data_dir is None:
            return 0
        count = 0
        for folder in sorted((self.data_dir / "sessions").iterdir()):
            header_path = folder / "session.json"
            if not header_path.is_file() or folder.name in self._sessions:
                continue
            try:
                header = json.loads(header_path.read_bytes())
                session = Session(
                    header["session_id"],
                    header["secret"],
                    SamplingPolicy.from_dict(header.get("sampling")),
                    header.get("metadata") or {},
                    header.get("created_at", time.time()),
                )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.error("skipping unreadable session folder %s: %s", folder, exc)
                continue
            session.log_path = folder / "calls.jsonl"
            if session.log_path.exists():
                for line in session.log_path.read_bytes().splitlines():
                    if not line.strip():
                        continue
                    try:
                        session.replay(line)
                    except (ValueError, KeyError, TypeError) as exc:
                        session.torn_log_lines += 1
                        logger.warning("session %s: skipped a torn log line (%s)",
                                       session.session_id, exc)
            session.graph.rebuild_hot()
            self._sessions[session.session_id] = session
            count += 1
        return count


def _write_private(path: Path, data: bytes) -> None:
    """Write a file only the owner can read (it holds a secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with contextlib.closing(os.fdopen(fd, "wb")) as handle:
        handle.write(data)
