"""mini-swe-agent's chat model without litellm: the same requests, ~8 s less CPU per rollout.

Loaded *inside the sandbox* by mini-swe-agent's own interpreter, through its public extension
point (`model.model_class: harness_mswea_model.ChatCompletionsModel`, the directory on
PYTHONPATH), so this file imports only the standard library, pydantic and mini-swe-agent.

Why it exists: `import litellm` costs 6-8 s of CPU at every agent start (measured with
`-X importtime`: openai.types and litellm.utils dominate, with the local price map), against
~1.4 s of engine time for a whole tiny-model rollout; on a 2-core machine it capped throughput
at ~11 rollouts a minute. mini-swe-agent's own `OpenRouterModel` does what this does with
`requests` for a fixed URL; this one posts to `model_kwargs.api_base`.

What stays mini-swe-agent's: the loop, the prompts, the bash tool (`BASH_TOOL`), the action
parser and the observation format (its `actions_toolcall` helpers), the retry policy, the config
fields (so `get_template_vars()`, which the templates render, is unchanged). The request body is
the one litellm sends for an `openai/` model with `drop_params` (`tests/test_mswea_model.py`
compares the two clients' bodies turn by turn against a recording server), and the assistant
message kept in the history is the reply's message as the server sent it.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any, Literal

from minisweagent.exceptions import FormatError
from minisweagent.models import GLOBAL_MODEL_STATS
from minisweagent.models.utils.actions_toolcall import (
    BASH_TOOL,
    format_toolcall_observation_messages,
    parse_toolcall_actions,
)
from minisweagent.models.utils.openai_multimodal import expand_multimodal_content
from minisweagent.models.utils.retry import retry
from pydantic import BaseModel

logger = logging.getLogger("harness_mswea_model")

# Keys of model_kwargs that configure the client, never sent (litellm's drop_params semantics).
_CLIENT_KEYS = ("api_base", "api_key", "drop_params", "timeout")


class ChatCompletionsModelConfig(BaseModel):
    # The fields of mini-swe-agent's LitellmModelConfig, so templates see the same variables.
    model_name: str
    model_kwargs: dict[str, Any] = {}
    litellm_model_registry: str | None = None
    set_cache_control: Literal["default_end"] | None = None
    cost_tracking: Literal["default", "ignore_errors"] = os.getenv("MSWEA_COST_TRACKING", "default")
    format_error_template: str = "{{ error }}"
    observation_template: str = (
        "{% if output.exception_info %}<exception>{{output.exception_info}}</exception>\n{% endif %}"
        "<returncode>{{output.returncode}}</returncode>\n<output>\n{{output.output}}</output>"
    )
    multimodal_regex: str = ""


class ClientRequestError(Exception):
    """A 4xx other than 408/429: the request itself is refused, so retrying cannot help."""


class ChatCompletionsModel:
    abort_exceptions: list[type[Exception]] = [ClientRequestError, KeyboardInterrupt]

    def __init__(self, **kwargs: Any) -> None:
        self.config = ChatCompletionsModelConfig(**kwargs)
        kw = self.config.model_kwargs
        if not kw.get("api_base"):
            raise ValueError("harness_mswea_model needs model.model_kwargs.api_base (the /v1 URL)")
        self._url = str(kw["api_base"]).rstrip("/") + "/chat/completions"
        self._api_key = str(kw.get("api_key") or "")
        self._timeout = float(kw.get("timeout") or 600)
        # "openai/tiny" -> "tiny": the provider prefix is litellm's routing, not the model's name.
        name = self.config.model_name
        self._wire_model = name.split("/", 1)[1] if name.startswith("openai/") else name

    def _query(self, messages: list[dict], **kwargs: Any) -> dict:
        extra = {k: v for k, v in (self.config.model_kwargs | kwargs).items() if k not in _CLIENT_KEYS}
        body = {"model": self._wire_model, "messages": messages, "tools": [BASH_TOOL], **extra}
        request = urllib.request.Request(
            self._url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._api_key}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            if 400 <= e.code < 500 and e.code not in (408, 429):
                raise ClientRequestError(f"HTTP {e.code}: {detail}") from e
            raise RuntimeError(f"HTTP {e.code}: {detail}") from e

    def query(self, messages: list[dict], **kwargs: Any) -> dict:
        prepared = [{k: v for k, v in msg.items() if k != "extra"} for msg in messages]
        for attempt in retry(logger=logger, abort_exceptions=self.abort_exceptions):
            with attempt:
                response = self._query(prepared, **kwargs)
        cost = {"cost": 0.0}
        if self.config.cost_tracking != "ignore_errors":
            raise RuntimeError("a local engine has no price: set MSWEA_COST_TRACKING=ignore_errors")
        GLOBAL_MODEL_STATS.add(0.0)
        choice = response["choices"][0]
        try:
            actions = parse_toolcall_actions(
                [_as_object(call) for call in choice["message"].get("tool_calls") or []],
                format_error_template=self.config.format_error_template,
                template_kwargs={"finish_reason": choice.get("finish_reason")},
            )
        except FormatError as e:
            e.messages[0]["extra"].update(cost)
            e.messages[0]["extra"]["response"] = response
            raise
        message = dict(choice["message"])
        message["extra"] = {"actions": actions, "response": response, **cost, "timestamp": time.time()}
        return message

    def format_message(self, **kwargs: Any) -> dict:
        return expand_multimodal_content(kwargs, pattern=self.config.multimodal_regex)

    def format_observation_messages(
        self, message: dict, outputs: list[dict], template_vars: dict | None = None
    ) -> list[dict]:
        return format_toolcall_observation_messages(
            actions=message.get("extra", {}).get("actions", []),
            outputs=outputs,
            observation_template=self.config.observation_template,
            template_vars=template_vars,
            multimodal_regex=self.config.multimodal_regex,
        )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return self.config.model_dump()

    def serialize(self) -> dict:
        return {
            "info": {
                "config": {
                    "model": self.config.model_dump(mode="json"),
                    "model_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                }
            }
        }


def _as_object(call: dict) -> SimpleNamespace:
    # parse_toolcall_actions reads attributes (litellm's objects); a reply is plain JSON.
    function = call.get("function") or {}
    return SimpleNamespace(
        id=call.get("id"),
        type=call.get("type"),
        function=SimpleNamespace(name=function.get("name"), arguments=function.get("arguments")),
    )
