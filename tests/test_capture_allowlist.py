"""The engine samples only under the trainer's policy (issue 15, item 3; capture/allowlist.py).

An agent's request fields that would change what vLLM can sample or how its logprobs read never
reach the engine, in any dialect: the in-package fake engine records every body it receives, and
each test checks the body against the allowlist, and the drop against the turn's metadata and the
session's stats.

    .venv/bin/python -m pytest tests/test_capture_allowlist.py -q
"""

from __future__ import annotations

import json

import httpx
import pytest

from capture.allowlist import KEPT, MAX_STOP, REWRITTEN, restrict
from capture.errors import BadRequest
from tests.helpers.tools import BASH_TOOLS as TOOLS

ALLOWED = KEPT | REWRITTEN
# Fields of vLLM 0.32's chat route (and OpenAI's) that change the sampled distribution, the
# logprobs, the prompt's template, or the sample's randomness.
HOSTILE = {
    "logit_bias": {"42": 100},
    "allowed_token_ids": [1, 2, 3],
    "bad_words": ["rm"],
    "min_tokens": 50,
    "ignore_eos": True,
    "stop_token_ids": [7],
    "guided_json": {"type": "object"},
    "guided_regex": "a+",
    "guided_choice": ["a", "b"],
    "guided_grammar": "root ::= 'a'",
    "structured_outputs": {"json": {"type": "object"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
    "seed": 1234,
    "best_of": 4,
    "use_beam_search": True,
    "prompt_logprobs": 5,
    "chat_template": "{{ messages }}",
    "chat_template_kwargs": {"enable_thinking": False},
    "add_generation_prompt": False,
    "continue_final_message": True,
    "truncate_prompt_tokens": 10,
    "vllm_xargs": {"a": 1},
    "logits_processors": ["x"],
}


def post(info, dialect: str, body: dict) -> httpx.Response:
    path = {"chat": "/chat/completions", "responses": "/responses", "messages": "/v1/messages"}
    return httpx.post(info.base_urls[dialect] + path[dialect], json=body, timeout=30,
                      headers={"authorization": f"Bearer {info.secret}"})


def assert_clean(sent: dict) -> None:
    """What the engine got: allowlisted fields only, no grammar-forcing tool_choice."""
    assert set(sent) <= ALLOWED, sorted(set(sent) - ALLOWED)
    assert sent.get("tool_choice") in (None, "auto", "none")


def last_turn_metadata(client, info) -> dict:
    return json.loads(client.trace_json(info.session_id))["turns"][-1]["metadata"]


# --- the rule itself ----------------------------------------------------------------------------
def test_every_field_outside_the_allowlist_is_dropped_and_named():
    chat = {"messages": [], "model": "m", "stream": True, "stream_options": {"x": 1},
            "tools": TOOLS, "tool_choice": "required", **HOSTILE}
    dropped = restrict(chat)
    assert set(chat) <= ALLOWED
    assert dropped == sorted([*HOSTILE, "tool_choice"])
    assert chat["tool_choice"] == "auto"
    assert chat["stream_options"] == {"include_usage": True}


def test_a_field_that_asks_for_nothing_is_dropped_without_being_counted():
    chat = {"messages": [], "logit_bias": {}, "seed": None, "ignore_eos": False,
            "response_format": {"type": "text"}, "bad_words": [], "add_generation_prompt": True}
    assert restrict(chat) == []
    assert set(chat) == {"messages"}


@pytest.mark.parametrize("choice", [
    "required", {"type": "function", "function": {"name": "bash"}}])
def test_a_tool_choice_that_forces_a_grammar_becomes_auto(choice):
    chat = {"messages": [], "tools": TOOLS, "tool_choice": choice}
    assert restrict(chat) == ["tool_choice"] and chat["tool_choice"] == "auto"


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_a_tool_choice_that_samples_freely_is_kept(choice):
    chat = {"messages": [], "tools": TOOLS, "tool_choice": choice}
    assert restrict(chat) == [] and chat["tool_choice"] == choice


def test_stop_strings_are_kept_within_bounds_and_refused_past_them():
    chat = {"messages": [], "stop": ["</s>", "\nObservation:"]}
    assert restrict(chat) == [] and chat["stop"] == ["</s>", "\nObservation:"]
    with pytest.raises(BadRequest, match="at most"):
        restrict({"messages": [], "stop": ["x"] * (MAX_STOP + 1)})
    with pytest.raises(BadRequest, match="string"):
        restrict({"messages": [], "stop": [1, 2]})


# --- per dialect, through the proxy: the engine never receives them ------------------------------
def test_chat_vllm_extensions_never_reach_the_engine_and_are_counted(client, fake):
    info = client.create_session()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "tool_choice": "required", "stop": ["STOP"], **HOSTILE}
    reply = post(info, "chat", body)
    assert reply.status_code == 200, reply.text
    sent = fake.requests[-1]
    assert_clean(sent)
    assert sent["stop"] == ["STOP"] and sent["tool_choice"] == "auto"
    expected = sorted([*HOSTILE, "tool_choice"])
    assert last_turn_metadata(client, info)["dropped_fields"] == expected
    assert client.stats(info.session_id)["dropped_fields"] == {name: 1 for name in expected}


def test_chat_streaming_drops_them_too(client, fake):
    info = client.create_session()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": False, "continuous_usage_stats": True},
            "logit_bias": {"1": -100}, "min_tokens": 9}
    with httpx.stream("POST", info.base_urls["chat"] + "/chat/completions", json=body,
                      headers={"authorization": f"Bearer {info.secret}"}, timeout=30) as reply:
        assert reply.status_code == 200
        lines = [line for line in reply.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    sent = fake.requests[-1]
    assert_clean(sent)
    assert sent["stream_options"] == {"include_usage": True}
    assert last_turn_metadata(client, info)["dropped_fields"] == ["logit_bias", "min_tokens"]


def test_responses_structured_output_and_forced_tools_never_reach_the_engine(client, fake):
    info = client.create_session()
    body = {"model": "m", "input": "hi", "stream": False,
            "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object"}}],
            "tool_choice": "required",
            "text": {"format": {"type": "json_schema", "name": "out", "schema": {}}},
            # fields the Responses translation never carries (checked all the same)
            "logit_bias": {"1": 5}, "seed": 7, "top_logprobs": 5}
    reply = post(info, "responses", body)
    assert reply.status_code == 200, reply.text
    sent = fake.requests[-1]
    assert_clean(sent)
    assert "response_format" not in sent and sent["tool_choice"] == "auto"
    assert last_turn_metadata(client, info)["dropped_fields"] == ["response_format",
                                                                  "tool_choice"]
    assert client.stats(info.session_id)["dropped_fields"] == {"response_format": 1,
                                                               "tool_choice": 1}


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "bash"}])
def test_messages_forced_tool_use_never_reaches_the_engine(client, fake, choice):
    info = client.create_session()
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
            "tool_choice": choice, "stop_sequences": ["\n\nHuman:"], "top_k": 5,
            "temperature": 0.1, "metadata": {"user_id": "u"}}
    reply = post(info, "messages", body)
    assert reply.status_code == 200, reply.text
    sent = fake.requests[-1]
    assert_clean(sent)
    assert sent["tool_choice"] == "auto" and sent["stop"] == ["\n\nHuman:"]
    assert (sent["top_k"], sent["temperature"]) == (-1, 1.0)  # the session's policy
    assert last_turn_metadata(client, info)["dropped_fields"] == ["tool_choice"]


def test_a_call_without_extras_drops_nothing(client, fake):
    info = client.create_session()
    assert post(info, "chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                               "tools": TOOLS, "tool_choice": "auto"}).status_code == 200
    assert_clean(fake.requests[-1])
    assert last_turn_metadata(client, info)["dropped_fields"] == []
    assert client.stats(info.session_id)["dropped_fields"] == {}


def test_a_stop_list_past_the_bound_is_a_clear_400_and_not_recorded(client, fake):
    info = client.create_session()
    before = len(fake.requests)
    reply = post(info, "chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                "stop": ["x"] * (MAX_STOP + 1)})
    assert reply.status_code == 400 and "stop" in reply.json()["error"]["message"]
    assert len(fake.requests) == before and client.stats(info.session_id)["n_calls"] == 0


def test_drop_counts_survive_a_restart(fake, tmp_path):
    from capture import CaptureClient, CaptureServer

    with CaptureServer(fake.url, data_dir=tmp_path / "d") as first:
        admin = CaptureClient(first.url, first.admin_key)
        info = admin.create_session()
        post(info, "chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                            "seed": 3})
    with CaptureServer(fake.url, data_dir=tmp_path / "d", admin_key=first.admin_key) as second:
        stats = CaptureClient(second.url, second.admin_key).stats(info.session_id)
    assert stats["dropped_fields"] == {"seed": 1}
