# .venv/bin/python -m pytest tests/test_factory_config.py -q
"""A misconfigured factory says everything that is wrong at once, before starting anything."""

from __future__ import annotations

import threading

import pytest

from harness.service.factory import HarborSessionFactory


def test_every_config_problem_is_reported_together_and_nothing_starts():
    threads_before = threading.active_count()
    with pytest.raises(ValueError) as caught:
        HarborSessionFactory(
            "http://127.0.0.1:9", split="no-such-source", harness="no-such-agent",
            sandbox="no-such-backend", max_concurrent_rollouts=0, max_attempts=0,
        )
    message = str(caught.value)
    for fragment in ("unknown harness 'no-such-agent'", "split:", "unknown sandbox",
                     "max_concurrent_rollouts", "max_attempts", "admin key"):
        assert fragment in message
    assert threading.active_count() == threads_before  # no in-process proxy was started


def test_a_factory_needs_a_proxy_or_an_engine_to_start_one():
    with pytest.raises(ValueError, match="proxy_url .* or llm_url"):
        HarborSessionFactory(None, split="bundled")
