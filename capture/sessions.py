"""Sessions: one per rollout, each with its own secret, sampling policy, graph and on-disk log.

The one decision: the session id travels in the URL path (`/s/{id}/v1/...`) and its secret in the
agent's API-key slot (`Authorization: Bearer` or `x-api-key`), so every agent SDK carries both
without knowing it is being recorded, and one proxy serves a whole GRPO group. OpenEnv 0.10 used
the key itself as the session id; keeping them apart lets the id appear in logs and URLs while the
secret does not, and the secret is compared in constant time (`hmac.compare_digest`).

Persistence ("nothing captured is lost, nothing is reused"): with a data dir, each session is a
folder

    <data_dir>/sessions/<id>/session.json   id, secret, sampling, metadata, step limit, caps
                                            (0600)
    <data_dir>/sessions/<id>/calls.jsonl    one line per completed call, appended as it completes
                                            (capture.calllog: durability policy, torn lines)

A call line holds only what the call adds (its new prompt tokens, its completion, its logprobs,
its parent), so the log grows with the conversation, not with turns x history. A proxy restarted
on the same data dir replays the logs and serves the same sessions and traces. Three rules keep a
restart honest:

  * Node ids (`<session>:<n>`) are never handed out twice, calls in flight at a crash included:
    ids are taken from blocks of ID_BLOCK reserved by a `reserve` line (made durable) BEFORE any
    id of the block is used (the first block when the session is created), and a replay resumes
    above every reserved or logged id.
  * A torn or corrupt line costs that line alone. Each call line also carries a copy of its
    parent's tokens (`parent_copy`: start, new prompt ids, completion; not its logprobs), so a
    lost parent line is rebuilt from its child as context only (logprobs lost, mask 0, counted in
    `masked_logprobs["log_line_lost"]`) and every later turn that builds on it is kept. Only two
    lost lines in a row (a call and its parent) cost the calls below them; they are counted
    (`lost_calls`), never guessed around.
  * Re-creating a session whose folder remains (from an earlier run on the data dir) is a 409
    naming the folder, never an overwrite.

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

from .calllog import FSYNC_POLICIES, CallLog, read_records
from .caps import RolloutCaps
from .dialects.memo import TranslationMemo
from .early import EarlyBodies
from .errors import (
    AgentDisconnected,
    BadRequest,
    BadSessionKey,
    EngineDisconnected,
    EngineHTTPError,
    EngineNoTokenIds,
    EngineTimeout,
    EngineUnreachable,
    StepLimitReached,
    UnknownSession,
)
from .graph import Node, RolloutGraph
from .recorder import Capture
from .resent import EngineBodies, RequestReader
from .sampling import SamplingPolicy

__all__ = ["ID_BLOCK", "INFRA_KINDS", "Session", "SessionStore", "failure_kind"]

logger = logging.getLogger(__name__)

_SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")

# Node ids reserved per `reserve` line: one durable write per ID_BLOCK calls.
ID_BLOCK = 64

# Failure kinds the agent cannot cause: the engine or the proxy failed (see failure_kind).
INFRA_KINDS = frozenset({"engine_unreachable", "engine_timeout", "engine_disconnected",
                         "engine_no_token_ids", "engine_http_error", "proxy_error"})
# Engine statuses that are about the request itself (e.g. a prompt over the context length).
_REQUEST_STATUSES = frozenset({400, 413, 422})


def failure_kind(error: Exception) -> str:
    """What failed a call, as one of the kinds `stats["failed_calls"]` counts."""
    if isinstance(error, EngineHTTPError):
        return "engine_rejected" if error.engine_status in _REQUEST_STATUSES else (
            "engine_http_error")
    for cls, kind in ((EngineTimeout, "engine_timeout"),
                      (EngineDisconnected, "engine_disconnected"),
                      (EngineNoTokenIds, "engine_no_token_ids"),
                      (EngineUnreachable, "engine_unreachable"),
                      (AgentDisconnected, "agent_disconnected")):
        if isinstance(error, cls):
            return kind
    return "proxy_error"


_KIND_OF_CAUSE = {"EngineTimeout": "engine_timeout", "EngineDisconnected": "engine_disconnected",
                  "EngineNoTokenIds": "engine_no_token_ids",
                  "EngineUnreachable": "engine_unreachable",
                  "AgentDisconnected": "agent_disconnected", "EngineHTTPError": "engine_http_error"}


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
    # A step is a call that offers tools: every coding agent sends its tool manifest on a step of
    # its own and none on its side calls (titles, summaries, probes; capture.aux). The proxy
    # refuses a step past `step_limit`, so an agent whose own limit is soft (opencode runs the
    # tools of its text-only "wrap-up" turn) or missing (Codex) cannot act past it, whatever the
    # timing; the harness's poll could only stop it after the reply had arrived.
    step_limit: int | None = None
    n_steps: int = 0  # steps served (ok + failed + in flight)
    refused_steps: int = 0
    # every call and completion token of the rollout, whatever the agent (capture.caps)
    caps: RolloutCaps = field(default_factory=RolloutCaps)
    in_flight: int = 0
    torn_log_lines: int = 0
    lost_calls: int = 0  # logged calls a replay could not restore (their parent line was lost too)
    log: CallLog | None = None
    dropped_fields: dict[str, int] = field(default_factory=dict)  # capture.allowlist, per field
    token_bytes: int = 0  # bytes of the graph's token arrays (the per-session memory bound)
    _next_id: int = 0  # the last node id number handed out
    _reserved: int = 0  # ids up to this number are reserved in the log
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

    @property
    def log_path(self) -> Path | None:
        return self.log.path if self.log is not None else None

    def take_step(self) -> None:
        """Count a call that offers tools; raise StepLimitReached for one past the limit."""
        if self.step_limit is not None and self.n_steps >= self.step_limit:
            self.refused_steps += 1
            raise StepLimitReached(self.session_id, self.step_limit)
        self.n_steps += 1

    def check_caps(self) -> None:
        """Raise RolloutCapReached (counted) for a model call past a rollout cap."""
        self.caps.check(self.session_id, self.n_calls)

    def next_call_id(self) -> str:
        """A node id never used before in this session, across proxy restarts (module doc)."""
        self.n_calls += 1
        self._next_id += 1
        if self.log is not None and self._next_id > self._reserved:
            self.reserve_ids()
        return f"{self.session_id}:{self._next_id}"

    def reserve_ids(self) -> None:
        """Reserve the next ID_BLOCK node ids in the log, durably, before any is used (the
        first block when the session is created, so its first call does not wait on an fsync)."""
        if self.log is not None:  # (`_next_id` may be the block's first id, being handed out)
            self._reserved = max(self._reserved, self._next_id - 1) + ID_BLOCK
            self.log.append({"kind": "reserve", "upto": self._reserved}, durable=True)

    def _count(self, info: dict[str, Any]) -> None:
        for name in info.get("dropped_fields") or ():
            self.dropped_fields[name] = self.dropped_fields.get(name, 0) + 1

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
        parent = node.parent
        if parent is not None:
            parent.messages = None  # no longer a leaf; rebuilt from the path if ever needed
        self.token_bytes += _token_bytes(node)
        self.caps.tokens_used += len(node.completion)
        self._count(info)
        if self.log is not None:
            record = {
                "kind": "call",
                "node_id": call_id,
                "parent_id": node.parent_id,
                "start": node.start,
                "seg": node.seg.tolist(),
                "completion": node.completion.tolist(),
                "logprobs": [None if math.isnan(x) else x for x in node.logprobs],
                "info": info,
            }
            if parent is not None:  # so a lost parent line costs that line alone (module doc)
                record["parent_copy"] = {"parent_id": parent.parent_id, "start": parent.start,
                                         "seg": parent.seg.tolist(),
                                         "completion": parent.completion.tolist()}
            self.log.append(record)
        return node

    def record_failed(self, call_id: str, error: Exception, info: dict[str, Any]) -> None:
        info.pop("_messages", None)
        entry = {
            "call_id": call_id,
            "cause": type(error).__name__,
            "failure_kind": failure_kind(error),
            "message": str(error)[:2000],
            **{k: v for k, v in info.items() if k not in ("hint", "request")},
        }
        if isinstance(error, EngineHTTPError):
            entry["engine_status"] = error.engine_status
        self.failed.append(entry)
        self._count(entry)
        if self.log is not None:
            self.log.append({"kind": "failed", **entry})

    def failed_calls(self) -> dict[str, Any]:
        """`stats["failed_calls"]`: every failed call by kind, and how many were infra's."""
        by_kind: dict[str, int] = {}
        for entry in self.failed:
            kind = (entry.get("failure_kind")
                    or _KIND_OF_CAUSE.get(entry.get("cause"), "proxy_error"))
            by_kind[kind] = by_kind.get(kind, 0) + 1
        infra = sum(n for kind, n in by_kind.items() if kind in INFRA_KINDS)
        return {"total": len(self.failed), "infra": infra, "by_kind": by_kind}

    # --- replay -----------------------------------------------------------------------------
    def replay(self, records: list[dict[str, Any]]) -> None:
        """Rebuild the session from its log's records (`calllog.read_records`), in order."""
        copies = {r.get("parent_id"): r["parent_copy"] for r in records
                  if r.get("kind") == "call" and isinstance(r.get("parent_copy"), dict)}
        highest = 0
        for record in records:
            kind = record.get("kind")
            try:
                if kind == "reserve":
                    highest = max(highest, int(record["upto"]))
                    continue
                highest = max(highest, _id_number(record.get("node_id") or record.get("call_id")))
                if kind == "failed":
                    record.pop("kind")
                    self.failed.append(record)
                    self._count(record)
                elif kind == "call":
                    self._restore(record, copies)
                else:
                    raise ValueError(f"unknown record kind {kind!r}")
                self.n_calls += 1
                self.n_steps += bool((record.get("info") or record).get("n_tools"))
            except (ValueError, KeyError, TypeError, OverflowError) as exc:
                self.lost_calls += kind == "call"
                self.torn_log_lines += kind != "call"
                logger.warning("session %s: could not replay a log record (%s)",
                               self.session_id, exc)
        self._next_id = self._reserved = max(highest, self._next_id)

    def _restore(self, record: dict[str, Any], copies: dict[str, Any]) -> None:
        parent_id = record["parent_id"]
        if record["node_id"] in self.graph.nodes:
            raise ValueError(f"node id {record['node_id']} is logged twice")
        if parent_id and parent_id not in self.graph.nodes and parent_id in copies:
            self._restore_lost(parent_id, copies[parent_id])
        info = record["info"]
        request = info.get("request") or {}
        if "new_messages" not in request and "messages" in request:  # an older log's name
            request["new_messages"] = request.pop("messages")
        node = Node(
            node_id=record["node_id"],
            start=record["start"],
            seg=array("i", record["seg"]),
            completion=array("i", record["completion"]),
            logprobs=array("d", [math.nan if x is None else x for x in record["logprobs"]]),
            info=info,
        )
        self.graph.restore(node, parent_id)
        self.token_bytes += _token_bytes(node)
        self.caps.tokens_used += len(node.completion)
        self._count(info)

    def _restore_lost(self, node_id: str, copy: dict[str, Any]) -> None:
        """A call whose own line was lost, rebuilt from its child's copy as context only."""
        completion = array("i", copy["completion"])
        node = Node(
            node_id=node_id,
            start=copy["start"],
            seg=array("i", copy["seg"]),
            completion=completion,
            logprobs=array("d", [math.nan] * len(completion)),
            info={"recovered": "its log line was lost; rebuilt from a child's copy",
                  "masked_logprobs": {"log_line_lost": len(completion)},
                  "request": {}, "response": {}},
        )
        self.graph.restore(node, copy["parent_id"])
        self.token_bytes += _token_bytes(node)

    def describe(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "created_at": self.created_at,
            "metadata": self.metadata,
            "sampling": self.policy.as_dict(),
            "n_calls": self.n_calls,
            "step_limit": self.step_limit,
            "caps": self.caps.limits(),
        }


def _token_bytes(node: Node) -> int:
    return 4 * (len(node.seg) + len(node.completion)) + 8 * len(node.logprobs)


def _id_number(node_id: Any) -> int:
    """N of a node id `<session>:<N>` (0 for anything else)."""
    tail = node_id.rpartition(":")[2] if isinstance(node_id, str) else ""
    return int(tail) if tail.isdigit() else 0


class SessionStore:
    """All sessions of one proxy, optionally backed by a data dir."""

    def __init__(self, data_dir: Path | None = None, fsync: str = "interval") -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {FSYNC_POLICIES}, got {fsync!r}")
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.fsync = fsync
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
        step_limit: int | None = None,
        caps: dict[str, Any] | None = None,
    ) -> Session:
        """`caps`: the rollout's caps (capture.caps; None: none)."""
        try:
            policy = SamplingPolicy.from_dict(sampling)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        if step_limit is not None and (type(step_limit) is not int or step_limit < 1):
            raise BadRequest(f"step_limit must be a whole number >= 1 or null, got {step_limit!r}")
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequest("metadata must be a JSON object")
        if session_id is None:
            session_id = "s" + secrets.token_hex(10)
        elif not isinstance(session_id, str) or not _SESSION_ID_RE.fullmatch(session_id):
            raise BadRequest("session_id must match [A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
        if session_id in self._sessions:
            raise BadRequest(f"session {session_id} already exists", status=409)
        session = Session(session_id, secrets.token_urlsafe(24), policy, dict(metadata or {}),
                          step_limit=step_limit, caps=RolloutCaps.from_dict(caps))
        if self.data_dir is not None:
            folder = self.data_dir / "sessions" / session_id
            try:
                folder.mkdir(parents=True, exist_ok=False)
            except FileExistsError:
                raise BadRequest(
                    f"session {session_id} is not served, but its folder {folder} remains (an "
                    "earlier proxy's, unreadable at start-up): choose another session_id, or "
                    "move that folder away and restart the proxy to drop it",
                    status=409) from None
            except OSError as exc:
                raise BadRequest(f"cannot create the folder of session {session_id}: {exc}",
                                 status=507) from exc
            header = {
                "session_id": session_id,
                "secret": session.secret,
                "sampling": sampling,
                "metadata": session.metadata,
                "created_at": session.created_at,
                "step_limit": step_limit,
                "caps": session.caps.limits(),
            }
            _write_private(folder / "session.json", json.dumps(header).encode())
            session.log = CallLog(folder / "calls.jsonl", self.fsync)
            session.reserve_ids()
        self._sessions[session_id] = session
        return session

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSession(session_id)
        return session

    def delete(self, session_id: str) -> None:
        session = self.get(session_id)
        del self._sessions[session_id]
        if session.log is not None:
            session.log.close()
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
                    step_limit=header.get("step_limit"),
                    caps=RolloutCaps.from_dict(header.get("caps")),
                )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.error("skipping unreadable session folder %s: %s", folder, exc)
                continue
            session.log = CallLog(folder / "calls.jsonl", self.fsync)
            if session.log.path.exists():
                records, session.torn_log_lines = read_records(session.log.path)
                session.replay(records)
            if session.torn_log_lines or session.lost_calls:
                logger.warning("session %s: %d torn log line(s) skipped, %d logged call(s) lost",
                               session.session_id, session.torn_log_lines, session.lost_calls)
            session.graph.rebuild_hot()
            self._sessions[session.session_id] = session
            count += 1
        return count


    def dirty_logs(self) -> list[int]:
        """Duplicated descriptors of the logs written since the last pass (to fsync off-loop)."""
        fds = []
        for session in self._sessions.values():
            fd = session.log.dup_if_dirty() if session.log is not None else None
            if fd is not None:
                fds.append(fd)
        return fds

    def close(self) -> None:
        """Close every log (fsyncing what the policy owes)."""
        for session in self._sessions.values():
            if session.log is not None:
                session.log.close()


def _write_private(path: Path, data: bytes) -> None:
    """Write a file only the owner can read (it holds a secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with contextlib.closing(os.fdopen(fd, "wb")) as handle:
        handle.write(data)
