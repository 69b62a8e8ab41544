"""The agent's step limit as a session enforces it: the engine calls it may start, the guard that
stops it past them, and whether a run that ended on its own ended at its limit.

Why it exists: the agent CLIs count steps differently (Codex has no step option, opencode's is
soft, mini-swe-agent's counts model calls), so the session cannot take a CLI's word for its
limit. The proxy refuses a step past it (what no reply can outrun); this module bounds the run
around that refusal and reads its end, from the proxy's counts of the session's engine calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from harness.service.session_config import SessionConfig
from harness.service.session_loop import cancel_and_wait

__all__ = ["STEP_POLL_S", "call_ceiling", "ended_at_step_limit", "step_guard"]

log = logging.getLogger(__name__)

STEP_POLL_S = 1.0  # how often the step guard asks the proxy for the turn count


def call_ceiling(config: SessionConfig) -> int:
    """Engine calls the agent may make; the session stops it when it starts one more.

    A CLI without a step option (Codex) gets max_steps. A CLI with one gets room
    above it: its own limit is soft (opencode's `steps` only withdraws the tools, and a model
    that calls tools anyway went on for 65 calls in 120 s, measured against capture's fake
    engine), and aux calls (titles, summaries) count at the proxy too.
    """
    steps = config.max_steps
    return steps * 2 + 4 if config.agent_cls.NATIVE_STEP_LIMIT else steps


async def step_guard(task: asyncio.Task[None], ceiling: int,
                     model_calls: Callable[[], Awaitable[tuple[int, int]]],
                     agent_name: str) -> None:
    """Stop the agent once it starts engine call `ceiling + 1` in this session, or once the
    proxy refused it a step past its step limit (it may retry or hang on the error).

    `model_calls()`: (engine calls the agent made in the session, calls the proxy refused).
    Not at call `ceiling`: that call is the agent's last allowed step, and stopping the
    agent while it is in flight cut its reply and lost the turn, and the tools the reply
    asked for never ran (every 1-step Codex rollout kept no turn at all). The call started
    past the ceiling is cut instead, and a cut call is never recorded as a turn. This poll
    only bounds the run: what the agent may do is bounded by the proxy's refusal, which
    no reply can outrun.
    """
    while not task.done():
        await asyncio.sleep(STEP_POLL_S)
        with contextlib.suppress(Exception):
            calls, refused = await model_calls()
            if calls > ceiling or refused:
                log.info("%s reached its step limit (%d engine calls, %d refused); stopping "
                         "it", agent_name, calls, refused)
                await cancel_and_wait(task)
                return


def ended_at_step_limit(config: SessionConfig, calls: int, refused: int) -> bool:
    """Whether an agent that exited by itself had no step left.

    The CLI stopped itself at its own step limit (mini-swe-agent's step_limit counts model
    calls), or ended on the proxy's refusal of a step past it. One that finished on exactly its
    last allowed call counts too: it had no step left, which is what `timed_out` tells a reward
    function.
    """
    return bool(refused or (config.agent_cls.NATIVE_STEP_LIMIT and calls >= config.max_steps))
