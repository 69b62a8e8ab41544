"""The warm-start builders: how the committed starting models under models/ were made.

Why this room exists: a starting model that scores 0% gives GRPO nothing to move, so each
default model is the tiny model fine-tuned (SFT, plain torch) on scripted rollouts captured
through the real agent, the capture proxy, the sandboxes and the verifiers, the path a user takes
to distil a stronger policy into a model before RL. Building one runs rollouts (sessions, tasks,
the scripted engine), so the builders live here with what they use, not in launchers/. They run
offline, by hand, in minutes on 2 cores, and write models/<name>/ with a hashed BUILD.json;
nothing in train, eval or serve imports them. What those need, the committed folders and their
hash checks, is launchers/warm_models.py (it imports no harness).

    create_file  models/tiny-qwen3-create-file, mini-swe-agent's default on family:*: the
                 family's train instances     `python -m harness.warm.create_file --commit`
    agents       models/tiny-qwen3-create-file-{codex,opencode,claude-code}: the same, in each
                 agent's own prompt and tool format, from tiny-qwen3-create-file
                 `python -m harness.warm.agents --harness codex --commit`
    lookup       models/tiny-qwen3-lookup, mini-swe-agent's default on lookup:* (the main
                 command's tasks): two-step rollouts, from the create-file one
                 `python -m harness.warm.lookup --commit`; models/tiny-qwen3-lookup-{opencode,
                 claude-code} the same in those agents' formats, `... --harness opencode --commit`
"""

__all__: list[str] = []
