"""Hostile input never crashes a dialect: it translates or raises DialectError, nothing else.

    .venv/bin/python -m pytest tests/test_dialects_fuzz.py -q

The core turns DialectError into a 4xx in the agent's shape; any other exception would be a bug
answered with a 500 (issue 3, item 7). Bodies are the real agent fixtures with one value
replaced by a value of the wrong type, or one key removed, at a random place (seeded, so a
failure reproduces). Engine chunks are fuzzed the same way: an encoder must not raise on a
malformed chunk either, because it runs after the agent has been sent its SSE headers.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
from pathlib import Path

import pytest

from capture.dialects import DIALECTS, DialectError
from tests.fixtures.dialects.fake_engine import engine_chunks, engine_reply

FIXTURES = Path(__file__).parent / "fixtures" / "dialects"
HOSTILE = [None, 0, -1, 1.5, True, "", "x", [], {}, [None], [1], {"type": None},
           {"type": "text"}, "\x00\ud800", 10**30, [{}], {"role": None}]
MUTATIONS_PER_BODY = 150


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value[:6]):
            yield from _paths(inner, (*prefix, i))


def _mutate(body, rng: random.Random):
    body = copy.deepcopy(body)
    paths = [p for p in _paths(body) if p]
    path = rng.choice(paths)
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and rng.random() < 0.3:
        del parent[path[-1]]
    else:
        parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE))
    return body


def _bodies():
    for path in sorted(FIXTURES.glob("*/*.json")):
        record = json.loads(path.read_text())
        body = record["body"]
        # Keep the big prompts out of the deep copies: truncate long strings.
        yield f"{path.parent.name}/{path.stem}", record["dialect"], json.loads(
            json.dumps(body, default=str), object_hook=lambda d: {
                k: (v[:200] if isinstance(v, str) else v) for k, v in d.items()})


def _exercise(dialect, body) -> None:
    try:
        dialect.to_chat(body)
    except DialectError as exc:
        assert 400 <= exc.status < 500 and exc.message
        return
    reply = engine_reply(reasoning="r", content="c", tool_calls=[("Bash", {"command": "ls"})])
    dialect.from_chat(reply, body)
    encoder = dialect.stream_encoder(body)
    for chunk in engine_chunks(reply):
        encoder.on_chunk(chunk)
    encoder.finish()


@pytest.mark.parametrize("name, dialect_name, body", list(_bodies()), ids=lambda x: x
                         if isinstance(x, str) else "")
def test_mutated_real_bodies_translate_or_raise_dialect_error(name, dialect_name, body):
    rng = random.Random(name)
    dialect = DIALECTS[dialect_name]
    for _ in range(MUTATIONS_PER_BODY):
        mutated = _mutate(body, rng)
        _exercise(dialect, mutated)
        if dialect_name == "messages":
            with contextlib.suppress(DialectError):
                dialect.count_tokens(mutated)


@pytest.mark.parametrize("dialect_name", list(DIALECTS))
@pytest.mark.parametrize("body", [None, [], "body", 5, {}, {"messages": None},
                                  {"input": None}, {"messages": [None]}, {"input": [None]}])
def test_bodies_of_the_wrong_shape_raise_dialect_error(dialect_name, body):
    with pytest.raises(DialectError):
        DIALECTS[dialect_name].to_chat(body)


@pytest.mark.parametrize("dialect_name", list(DIALECTS))
def test_encoders_survive_mutated_engine_chunks(dialect_name):
    rng = random.Random(dialect_name)
    dialect = DIALECTS[dialect_name]
    request = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
    reply = engine_reply(reasoning="think", content="hello",
                         tool_calls=[("Bash", {"command": "ls"}), ("Bash", {"command": "pwd"})])
    for _ in range(300):
        encoder = dialect.stream_encoder(request)
        for chunk in engine_chunks(reply):
            if rng.random() < 0.3:
                chunk = _mutate(chunk, rng)
            assert isinstance(encoder.on_chunk(chunk), bytes)
        assert isinstance(encoder.finish(), bytes)


@pytest.mark.parametrize("dialect_name", list(DIALECTS))
def test_from_chat_survives_mutated_engine_replies(dialect_name):
    rng = random.Random(dialect_name)
    dialect = DIALECTS[dialect_name]
    reply = engine_reply(reasoning="think", content="hello",
                         tool_calls=[("Bash", {"command": "ls"})])
    for _ in range(300):
        assert isinstance(dialect.from_chat(_mutate(reply, rng), {"model": "m"}), dict)
