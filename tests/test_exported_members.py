"""Each package's public surface is deliberate: every name in `__all__` exists and imports.

Run: .venv/bin/python -m pytest tests/test_exported_members.py -q
"""

from __future__ import annotations

import importlib

import pytest

PACKAGES = ["harness", "harness.service.agents", "harness.audit", "harness.service.sandboxes", "harness.tasks",
            "capture", "capture.dialects", "trainer", "trainer.weight_sync", "launchers"]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_name_in_all_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    missing = [attr for attr in exported if getattr(module, attr, None) is None]
    assert not missing, f"{name}.__all__ names what it does not have: {missing}"


def test_capture_imports_neither_torch_nor_harbor() -> None:
    # DESIGN.md section 1: the proxy is a light service that can run on its own host.
    import subprocess
    import sys

    code = ("import sys, capture, capture.server, capture.client, capture.dialects; "
            "bad = [m for m in ('torch', 'harbor') if m in sys.modules]; print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"capture pulled in: {out.stdout.strip()}"


def test_trainer_never_imports_harness() -> None:
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent / "trainer"
    offenders = [str(p) for p in root.rglob("*.py")
                 if "from harness" in p.read_text() or "import harness" in p.read_text()]
    assert not offenders, offenders
