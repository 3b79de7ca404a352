"""A base for environments that pose one question and let the agent call tools.

The calculator and ``lookup`` share everything but their tools and their step: the
episode opens with the system prompt (the tags prompt, or the tool registry's
description in other formats) and the task's question, a response is parsed by
the tool registry, and a response that cannot be parsed is what
``check_response`` reports. Their steps (what a tool call does, when the episode
ends) stay in their own modules.
"""

from __future__ import annotations

from turnrl.envs.episode_state import ImmutableStateEnv
from turnrl.envs.tools import Malformed, ToolRegistry
from turnrl.types import Message, Task


class ToolQuestionEnv(ImmutableStateEnv):
    """``reset`` and ``check_response`` for a question answered with tools.

    Subclasses call :meth:`_init_tools` at the end of ``__init__`` and set
    ``state_type`` to a frozen dataclass built as ``state_type(task=task)``.
    """

    fmt: str
    max_turns: int
    turn_cost: float
    registry: ToolRegistry
    system_prompt: str

    def _init_tools(
        self,
        *,
        fmt: str,
        max_turns: int,
        turn_cost: float,
        registry: ToolRegistry,
        system_prompt: str | None,
        tags_prompt: str | None,
    ) -> None:
        """Keep the settings every step reads; ``system_prompt=None`` takes
        ``tags_prompt`` when given, else the registry's description in ``fmt``."""
        self.fmt = fmt
        self.max_turns = max_turns
        self.turn_cost = float(turn_cost)
        self.registry = registry
        if system_prompt is None:
            system_prompt = tags_prompt if tags_prompt is not None else registry.describe(fmt)
        self.system_prompt = system_prompt
        self._state = None

    def reset(self, task: Task) -> list[Message]:
        self._state = self.state_type(task=task)
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": task.payload["question"]},
        ]

    def check_response(self, task: Task, response: str) -> str | None:
        action = self.registry.parse(response, self.fmt)
        return action.reason if isinstance(action, Malformed) else None
