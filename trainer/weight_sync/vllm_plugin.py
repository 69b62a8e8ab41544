"""vLLM general plugin: registers the "harness_gloo" CPU weight-transfer backend.

Declared in pyproject.toml as the `vllm.general_plugins` entry point
`harness_cpu_weight_transfer = "trainer.weight_sync.vllm_plugin:register"`. vLLM calls `register`
in every one of its processes (API server, engine core, workers), possibly more than once per
process, so it is idempotent. It registers by module path: the engine class
(`trainer.weight_sync.gloo_engine`) is imported only where vLLM builds it, in the workers.

It runs in the engine venv, where this repository is on PYTHONPATH but none of the project's
dependencies are installed: this module imports the stdlib at import time and vLLM inside
`register`, nothing else. (Importing it also imports `trainer/__init__.py` and
`trainer/weight_sync/__init__.py`; those must stay free of eager heavy imports for that reason.)
"""

from __future__ import annotations

__all__ = ["BACKEND_NAME", "register"]

BACKEND_NAME = "harness_gloo"


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    # Loaded several times per process by design (see vllm/plugins/__init__.py), and
    # register_engine raises on a second registration.
    if BACKEND_NAME in WeightTransferEngineFactory._registry:
        return
    WeightTransferEngineFactory.register_engine(
        BACKEND_NAME,
        "trainer.weight_sync.gloo_engine",
        "HarnessGlooWeightTransferEngine",
    )
