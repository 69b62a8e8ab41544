"""Starting processes: the vLLM engine, the capture proxy, the trainer, and the HF Jobs launcher.

Everything here is about processes and where their binaries live; nothing here trains or scores.
"""

__all__: list[str] = []
