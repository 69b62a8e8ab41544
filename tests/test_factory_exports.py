# .venv/bin/python -m pytest tests/test_factory_exports.py -q
"""Each rollout module's `__all__` is exactly its public surface: no stray, no missing name."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = [
    "harness.agents",
    "harness.agents.base",
    "harness.agents.claude_code",
    "harness.agents.codex",
    "harness.agents.mini_swe_agent",
    "harness.agents.opencode",
    "harness.errors",
    "harness.factory",
    "harness.outcome",
    "harness.outcome_readers",
    "harness.proxy_link",
    "harness.rollout",
    "harness.session",
    "harness.session_loop",
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
