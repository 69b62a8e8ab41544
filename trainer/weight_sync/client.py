"""HTTP control plane of vLLM's weight-transfer protocol, with vLLM's errors translated once.

Routes (vLLM 0.32, `vllm/entrypoints/rl/online/api_router.py`, mounted only when the server runs
with `VLLM_SERVER_DEV_MODE=1`):

```
GET  /get_world_size                      -> {"world_size": TP*PP*DP}
POST /init_weight_transfer_engine         {"init_info": {...backend fields}}
POST /pause?mode=abort|wait|keep&clear_cache=true
POST /start_weight_update
POST /update_weights                      {"update_info": {...backend fields}}
POST /finish_weight_update                {"weight_version": "7"}   (a string, optional)
POST /update_weight_version               {"new_version": "7"}
GET  /weight_info                         -> {"weight_version": "7"}
POST /resume
POST /shutdown_weight_transfer_engine
```

The `init/start/update/finish` methods match vLLM's `VLLMWeightSyncClient` protocol, so this client
can be handed to vLLM's own trainer-side engines (the NCCL path does). vLLM's bundled HTTP client
needs `requests`; the project venv has httpx, and this one names fixes instead of raising bare
HTTP errors: a 404 on these routes means dev mode is off, "Weight transfer not configured" means
the server was started without `--weight-transfer-config`, and so on.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from trainer.weight_sync.errors import WeightSyncError, WeightSyncSetupError

__all__ = ["EngineControlClient"]

_DEV_MODE_FIX = (
    "the engine does not serve vLLM's weight-transfer routes: start it with "
    "VLLM_SERVER_DEV_MODE=1 (launchers.engine.Engine sets it)"
)
_CONFIG_FIX = (
    "the engine was started without a weight-transfer backend: start it with "
    "--weight-transfer-config '{\"backend\": \"harness_gloo\"}' (CPU) or '{\"backend\": \"nccl\"}' "
    "(GPU), e.g. launchers.engine.Engine(model, weight_transfer_backend=...)"
)


def explain(status: int, body: str, route: str) -> str:
    """Turn a failed control-plane response into a message that names the fix."""
    if status == 404:
        return f"{route}: 404 Not Found; {_DEV_MODE_FIX}"
    if "Weight transfer not configured" in body:
        return f"{route}: {_CONFIG_FIX}"
    if "Invalid init_info" in body or "Invalid update_info" in body:
        return (
            f"{route}: the engine's weight-transfer backend does not understand this trainer's "
            "messages; the engine runs a different backend than the trainer speaks. Start the "
            "engine with the trainer's backend in --weight-transfer-config (engine says: "
            f"{body[:500]})"
        )
    if "Invalid weight transfer backend" in body:
        return (
            f"{route}: the engine does not know the backend. For 'harness_gloo' the vLLM plugin "
            "'trainer.weight_sync.vllm_plugin:register' must be importable in every vLLM process "
            "(repository root on PYTHONPATH plus the entry-point shim launchers.engine.Engine "
            f"writes). Engine says: {body[:500]}"
        )
    return f"{route}: HTTP {status}: {body[:2000]}"


class EngineControlClient:
    """Synchronous client for one vLLM server's weight-transfer routes."""

    def __init__(
        self,
        engine_url: str,
        *,
        timeout_s: float = 600.0,
        transport: httpx.BaseTransport | None = None,
        api_key: str | None = None,
    ) -> None:
        """`api_key`: the engine's key (default: $HARNESS_ENGINE_API_KEY, as launchers.engine
        starts it). vLLM 0.32 checks it on /v1 routes only, not on these; sent all the same, so
        a vLLM that guards them keeps working."""
        self.engine_url = engine_url.rstrip("/")
        key = api_key if api_key is not None else os.environ.get("HARNESS_ENGINE_API_KEY")
        # One timeout for everything: /update_weights returns only when the whole model has
        # crossed, and /init_weight_transfer_engine only when every worker has joined.
        self._http = httpx.Client(
            base_url=self.engine_url, timeout=timeout_s, transport=transport, trust_env=False,
            headers={"authorization": f"Bearer {key}"} if key else None,
        )

    def _call(
        self,
        method: str,
        route: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        try:
            response = self._http.request(method, route, json=json, params=params)
        except httpx.ConnectError as exc:
            raise WeightSyncSetupError(
                f"cannot reach the engine at {self.engine_url} ({exc}); is vLLM running there?"
            ) from exc
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{route}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            message = explain(response.status_code, response.text, route)
            if response.status_code == 404 or "not configured" in message:
                raise WeightSyncSetupError(message)
            raise WeightSyncError(message)
        try:
            return response.json()
        except ValueError:
            return response.text

    # -- discovery ---------------------------------------------------------------------------
    def world_size(self) -> int:
        """Number of vLLM workers that receive weights (TP * PP * DP)."""
        return int(self._call("GET", "/get_world_size")["world_size"])

    def weight_version(self) -> str | None:
        return self._call("GET", "/weight_info").get("weight_version")

    def is_paused(self) -> bool:
        return bool(self._call("GET", "/is_paused")["is_paused"])

    # -- VLLMWeightSyncClient protocol -------------------------------------------------------
    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._call("POST", "/init_weight_transfer_engine", json={"init_info": init_info})

    def start_weight_update(self) -> None:
        self._call("POST", "/start_weight_update")

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._call("POST", "/update_weights", json={"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        body = {"weight_version": weight_version} if weight_version is not None else None
        self._call("POST", "/finish_weight_update", json=body)

    # -- the rest of the lifecycle -----------------------------------------------------------
    def shutdown_weight_transfer_engine(self) -> None:
        self._call("POST", "/shutdown_weight_transfer_engine")

    def pause(self, mode: str = "keep", clear_cache: bool = True) -> None:
        self._call(
            "POST", "/pause", params={"mode": mode, "clear_cache": str(clear_cache).lower()}
        )

    def resume(self) -> None:
        self._call("POST", "/resume")

    def update_weight_version(self, version: str) -> None:
        self._call("POST", "/update_weight_version", json={"new_version": version})

    # -- runtime LoRA (trainer.weight_sync.lora) ----------------------------------------------
    def lora_request(self, route: str, body: dict[str, Any]) -> httpx.Response:
        """POST /v1/load_lora_adapter or /v1/unload_lora_adapter; the reply as it came (the
        LoRA sync words its own errors: these routes answer 404 when LoRA updating is off, which
        is not the dev-mode fix `_call` would name). Raises WeightSyncSetupError when the engine
        cannot be reached, WeightSyncError on other transport failures."""
        try:
            return self._http.post(route, json=body)
        except httpx.ConnectError as exc:
            raise WeightSyncSetupError(
                f"cannot reach the engine at {self.engine_url} ({exc}); is vLLM running there?"
            ) from exc
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{route}: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self._http.close()
