# .venv/bin/python -m pytest tests/test_factory_exports.py -q
"""Each rollout module's `__all__` is exactly its public surface: no stray, no missing name."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = [
    "harness.service.agents",
    "harness.service.agents.base",
    "harness.service.agents.claude_code",
    "harness.service.agents.codex",
    "harness.service.agents.mini_swe_agent",
    "harness.service.agents.opencode",
    "harness.shared.errors",
    "harness.service.factory",
    "harness.shared.outcome",
    "harness.shared.outcome_readers",
    "harness.service.proxy_link",
    "harness.shared.rollout",
    "harness.service.session",
    "harness.service.session_config",
    "harness.service.session_grading",
    "harness.service.session_loop",
    "harness.service.session_steps",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist_and_every_public_class_or_function_defined_here_is_exported(name):
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert all(hasattr(module, n) for n in exported)
    defined_here = {
        n for n, obj in vars(module).items()
        if not n.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", None) == name
    }  # fmt: skip
    assert defined_here <= exported, defined_here - exported
