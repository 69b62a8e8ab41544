"""The bash tool definitions the capture, dialect and engine tests offer (OpenAI chat shape).

Each test used to write its own copy; three shapes are really used, and which one matters:
the schema is part of the prompt the engine renders (a chat template writes the tools into the
system turn), so a test that pins token ids or compares with real vLLM needs the same one every
time. Each constant is a fresh list per import site only by convention: never mutate them.
"""

from __future__ import annotations

__all__ = ["BASH_COMMAND_TOOLS", "BASH_DESCRIBED_TOOLS", "BASH_TOOLS"]

# The least a chat request's tool can be: a name and an object schema.
BASH_TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]

# With its `command` argument declared (what mini-swe-agent-like agents send).
BASH_COMMAND_TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}]

# Described, its argument required: the fullest shape, as the real agents' tools are.
BASH_DESCRIBED_TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]
