"""Hot LoRA push: each new adapter version reaches the running engine under a name of its own.

    sync = LoRAWeightSync(engine.url, run_dir / "adapters", base_name="tiny",
                          on_version=pool.set_weight_version)   # called (version, adapter name)
    sync.push(FullModelView(peft_model, dtype, trainable_only=True), version=1)

One push, from trainer rank 0:

```
adapters (full tensors, gathered under FSDP2) -> <adapter_dir>/v<N>/ (peft layout, written whole,
then renamed) -> POST /v1/load_lora_adapter {lora_name: <base>-lora-v<N>, lora_path}
-> on_version(N, <base>-lora-v<N>)        (every capture proxy: calls from now name adapter N)
-> POST /v1/unload_lora_adapter for adapters older than the last `keep_loaded`
```

WHY vLLM'S RUNTIME LoRA ROUTES, not its weight-transfer API: in vllm 0.32 the weight-transfer
engines (vllm/distributed/weight_transfer: nccl, ipc, m2n, ...) load base-model tensors through
`load_weights` only; none of them knows adapters. `/v1/load_lora_adapter` (served when
VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 and the engine runs with --enable-lora) registers an adapter
folder by name and preloads it into the workers' LoRA cache, with no pause: requests in flight
keep their adapter and finish on it, and no KV is dropped for the base.

WHY A NEW NAME PER VERSION (and the proxy sets it): a request names its adapter, and vLLM keeps
that LoRARequest for the request's whole life, so a call sent as `<base>-lora-v<N>` is sampled by
adapter N from its first token to its last. The capture proxy reads the version and the adapter
name together when a call starts and writes that name into the engine request, whatever the agent
asked for; the version it stamps is then the version that sampled every token (exact, not
"between start and end" as a full-weight sync across a pause is). A new name also gets a new
LoRA id, which keys vLLM's prefix cache, so no block computed by an older adapter is reused
(reloading one name in place would keep them: vLLM warns about exactly that).

Old adapters: the engine keeps the last `keep_loaded` (default 2: the current one and the one
before, so a call that read version N-1 an instant before the proxy heard N still finds its adapter
when it reaches the engine); older names are unloaded (new requests naming them get 404; requests
already running finish). Folders are deleted after `keep_files` versions, later than the unload,
because vLLM's workers re-read an adapter from its path if their LRU cache dropped it while a
request still used it. The engine needs `--max-loras >= keep_loaded` (two adapters in one batch).

Where the files go: `adapter_dir` (harness.train: <run folder>/trainer/adapters). The ENGINE reads
them by path, so a remote engine (--engine-url on another host) needs that folder on a shared
filesystem at the same path; there is no upload route in vllm 0.32.

Failure: a push that fails before the load leaves the engine and the proxy on the previous version;
a failed load likewise (vLLM validates the adapter before registering its name). Either raises
`WeightSyncPushError(weights_intact=True)`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.weight_sync.client import EngineControlClient
from trainer.weight_sync.errors import WeightSyncError, WeightSyncPushError, WeightSyncSetupError

__all__ = ["LoRAWeightSync", "adapter_name"]

log = logging.getLogger(__name__)

_LORA_FIX = (
    "the engine must run with --enable-lora --max-lora-rank <R> --max-loras 2 and "
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (launchers.engine.Engine(..., lora_rank=R) does it)"
)


def adapter_name(base_name: str, version: int) -> str:
    """The engine's name for adapter `version`: `tiny-lora-v3`."""
    return f"{base_name}-lora-v{version}"


class LoRAWeightSync:
    """`WeightSync` of peft adapters into one vLLM server, through its runtime LoRA routes.

    Args:
        engine_url: the server root, e.g. http://127.0.0.1:8000.
        adapter_dir: where adapter folders are written (readable by the engine at that path).
        base_name: the engine's served model name; adapters are named `<base_name>-lora-v<N>`.
        on_version: called as `on_version(version, adapter_name)` after the engine loaded it,
            e.g. `ServicePool.set_weight_version`.
        keep_loaded / keep_files: adapters kept registered in the engine / on disk (module doc).
        rank: this trainer process's rank (only rank 0 talks to the engine).
    """

    def __init__(self, engine_url: str, adapter_dir: str | Path, *, base_name: str,
                 on_version: Callable[[int, str], Any] | None = None, keep_loaded: int = 2,
                 keep_files: int = 3, http_timeout_s: float = 600.0, rank: int = 0,
                 http_transport: Any = None) -> None:
        if keep_loaded < 1 or keep_files < keep_loaded:
            raise ValueError(f"keep_loaded={keep_loaded}, keep_files={keep_files}: need "
                             "1 <= keep_loaded <= keep_files")
        self.engine_url = engine_url.rstrip("/")
        self.adapter_dir = Path(adapter_dir)
        self.base_name = base_name
        self.on_version = on_version
        self.keep_loaded, self.keep_files = keep_loaded, keep_files
        self.rank = rank
        self.version: int | None = None  # the last version the engine confirmed
        self.loaded: list[int] = []  # versions registered in the engine, oldest first
        self.written: list[int] = []  # versions whose folders exist, oldest first
        self.last_push_bytes = 0  # adapter_model.safetensors of the last push (for the log)
        self.backend = "lora"
        self.reason = "LoRA: adapter folders loaded through vLLM's /v1/load_lora_adapter"
        self.client = EngineControlClient(self.engine_url, timeout_s=http_timeout_s,
                                          transport=http_transport)

    def push(self, model: Any, version: int) -> None:
        """Make the engine serve `model`'s adapters as `version`. `model`: a FullModelView
        with trainable_only=True (or the peft model itself on one process)."""
        if self.rank != 0:
            for _ in model.named_parameters():  # join the gathers rank 0 runs
                pass
            return
        from trainer.lora import save_adapter  # peft: imported only by a LoRA trainer

        tensors = {name: t.detach().to("cpu", copy=True)
                   for name, t in model.named_parameters() if _is_adapter(name, t)}
        if not tensors:
            raise WeightSyncPushError(
                f"LoRA push of version {version}: the model has no adapter parameters (was it "
                "built with lora_rank > 0?); nothing was changed", stage="collect",
                engine_resumed=True, weights_intact=True)
        folder = save_adapter(model, tensors, self.adapter_dir / f"v{version}")
        self.last_push_bytes = (folder / "adapter_model.safetensors").stat().st_size
        name = adapter_name(self.base_name, version)
        try:
            response = self.client.lora_request(
                "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder.resolve())})
        except WeightSyncSetupError:
            raise
        except WeightSyncError as exc:
            raise WeightSyncPushError(
                f"LoRA push of version {version}: {exc}; the engine still serves version "
                f"{self.version}", stage="load_lora_adapter", engine_resumed=True,
                weights_intact=True) from exc
        if response.status_code == 400 and "already been loaded" in response.text:
            # A resume against an engine that still holds this version's name (the run was
            # restarted, the engine was not): the same version's weights, so reload in place.
            response = self.client.lora_request(
                "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder.resolve()),
                                          "load_inplace": True})
        if response.status_code == 404:
            raise WeightSyncSetupError(
                f"{self.engine_url}/v1/load_lora_adapter: 404 Not Found; {_LORA_FIX}")
        if response.status_code >= 400:
            raise WeightSyncPushError(
                f"LoRA push of version {version}: /v1/load_lora_adapter answered "
                f"{response.status_code}: {response.text[:1000]}; the engine still serves "
                f"version {self.version}. {_LORA_FIX}", stage="load_lora_adapter",
                engine_resumed=True, weights_intact=True)
        self.version = version
        self.loaded.append(version)
        self.written.append(version)
        if self.on_version is not None:
            self.on_version(version, name)
        self._retire()

    def _retire(self) -> None:
        """Unload adapters past `keep_loaded`, delete folders past `keep_files` (module doc)."""
        while len(self.loaded) > self.keep_loaded:
            old = self.loaded.pop(0)
            try:
                response = self.client.lora_request(
                    "/v1/unload_lora_adapter", {"lora_name": adapter_name(self.base_name, old)})
                if response.status_code >= 400:
                    log.warning("unloading adapter v%d: HTTP %d: %s", old,
                                response.status_code, response.text[:300])
            except WeightSyncError as exc:  # a stale name costs cache, not correctness
                log.warning("unloading adapter v%d failed: %s", old, exc)
        while len(self.written) > self.keep_files:
            shutil.rmtree(self.adapter_dir / f"v{self.written.pop(0)}", ignore_errors=True)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> LoRAWeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_adapter(name: str, tensor: torch.Tensor) -> bool:
    return "lora_" in name

