"""Ctrl-C during `python -m harness.train` ends with the interrupted line and exit 130, even when
the error that reaches the main process is a child's absence (the engine went first), and any
other error still surfaces as itself."""

from __future__ import annotations

import contextlib
import signal

import pytest

import harness.train as train
from trainer.weight_sync import WeightSyncSetupError


def _engine_gone_after_ctrl_c(settings, console):
    # what a terminal's Ctrl-C sends this process, swallowed by a cleanup path; the next call
    # finds the engine gone
    with contextlib.suppress(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    raise WeightSyncSetupError("the engine at http://127.0.0.1:8000 refused the weight push")


def test_a_childs_error_after_ctrl_c_reads_as_the_interrupt(monkeypatch, capsys):
    monkeypatch.setattr(train, "run_training", _engine_gone_after_ctrl_c)
    before = signal.getsignal(signal.SIGINT)
    assert train.main([]) == 130
    err = capsys.readouterr().err
    assert "interrupted: every process this run started was stopped" in err
    assert "Traceback" not in err
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler is back


def test_ctrl_c_itself_exits_130(monkeypatch, capsys):
    monkeypatch.setattr(train, "run_training",
                        lambda settings, console: signal.raise_signal(signal.SIGINT))
    assert train.main([]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_the_same_error_without_ctrl_c_is_raised_as_itself(monkeypatch):
    def engine_gone(settings, console):
        raise WeightSyncSetupError("the engine refused the weight push")

    monkeypatch.setattr(train, "run_training", engine_gone)
    with pytest.raises(WeightSyncSetupError, match="refused the weight push"):
        train.main([])
