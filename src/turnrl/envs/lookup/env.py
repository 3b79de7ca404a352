"""LookupEnv: answer a multi-hop question by searching the task's knowledge base.

Episode: ``reset`` gives ``[system, user question]``; each response is one action
in the calculator's tool-call syntax (:mod:`turnrl.envs.tools`). In the default
``"tags"`` format ``<call>Ada Lin mentor</call>`` searches (``search`` is the
default tool; ``<call>search: ...</call>`` works too) and ``<answer>Rome</answer>``
answers; in ``"hermes"`` format the tools are ``search`` (argument ``query``)
and ``answer`` (argument ``text``). An ``answer`` tool call counts as the final
answer in either format. A search returns a ``"tool"`` message with up to ``k``
fact lines; a malformed response or an unknown tool returns a ``"user"``
message saying what was wrong (never an exception). The answer ends the
episode with reward 1 if it equals the gold answer after normalisation
(:func:`~turnrl.envs.lookup.tools.normalise_answer`), else 0; ``turn_cost`` is
subtracted per turn; after ``max_turns`` turns without an answer the episode
ends with ``info["truncated"]``.

Searches run in-process without a timeout thread, unlike the calculator's
tool: the query is cut to ``MAX_QUERY_CHARS`` and the index holds one task's
dozen facts, so the work is bounded.

``state_key`` (GiGPO's anchor state) is the task plus the *set of facts
retrieved so far*: what the agent knows, whatever words and order it searched
with. Two trajectories that found the same facts stand at the same decision
point; a malformed turn or a search that finds nothing new leaves the key as it
was.

``info`` per step: ``turn``, ``tool_call`` (a search), ``malformed``, ``error``,
``answered``, ``correct`` (None until the end; False when truncated),
``truncated``, ``new_facts`` (facts this search added), ``gold_found`` (facts of
the gold chain retrieved so far) and ``state_key`` (after the step).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

from turnrl.envs.lookup.kb import KnowledgeBase
from turnrl.envs.lookup.tools import (
    DEFAULT_K,
    TOOL_SCHEMAS,
    is_correct,
    render_results,
    search_ids,
)
from turnrl.envs.tool_question import ToolQuestionEnv
from turnrl.envs.tools import FinalAnswer, Malformed, Tool, ToolCall, ToolRegistry, format_answer
from turnrl.types import Message, StepResult, Task

TAGS_SYSTEM_PROMPT = "Search, then answer."
"""Kept short: a ~0.1M-parameter character model reads it in every context (the format
itself is taught by the warm start)."""


def _runs_in_env(argument: str) -> str:
    raise RuntimeError("lookup tools run inside LookupEnv.step (or through LookupTools)")


def _tool(name: str) -> Tool:
    schema = next(s["function"] for s in TOOL_SCHEMAS if s["function"]["name"] == name)
    (parameter,) = schema["parameters"]["properties"]
    return Tool(name, schema["description"], _runs_in_env, parameter=parameter)


TOOLS = (_tool("search"), _tool("answer"))
"""The tools as the parser and the system prompt see them (their execution is the env's)."""


@dataclass(frozen=True)
class _State:
    """Everything that changes during an episode (immutable, so snapshots are free)."""

    task: Task
    turn: int = 0
    retrieved: frozenset[int] = frozenset()
    """Indices of the facts every search so far returned."""
    done: bool = False


class LookupEnv(ToolQuestionEnv):
    """Multi-hop question answering over a per-task knowledge base with a BM25 search tool."""

    state_type = _State

    def __init__(
        self,
        *,
        fmt: str = "tags",
        max_turns: int = 5,
        k: int = DEFAULT_K,
        turn_cost: float = 0.0,
        system_prompt: str | None = None,
    ) -> None:
        if max_turns < 1 or k < 1:
            raise ValueError(f"max_turns and k must be >= 1, got {max_turns} and {k}")
        self.k = k
        self._init_tools(
            fmt=fmt,
            max_turns=max_turns,
            turn_cost=turn_cost,
            registry=ToolRegistry(TOOLS, default="search"),
            system_prompt=system_prompt,
            tags_prompt=TAGS_SYSTEM_PROMPT if fmt == "tags" else None,
        )

    # -- Env API (reset and check_response: ToolQuestionEnv) -------------------

    def step(self, response: str) -> StepResult:
        state = self._require_state()
        payload = state.task.payload
        action = self.registry.parse(response, self.fmt)
        if isinstance(action, ToolCall) and action.name == "answer":
            action = FinalAnswer(action.argument)
        info: dict[str, Any] = {
            "turn": state.turn,
            "tool_call": isinstance(action, ToolCall),
            "malformed": isinstance(action, Malformed),
            "error": action.reason if isinstance(action, Malformed) else None,
            "answered": isinstance(action, FinalAnswer),
            "correct": None,
            "truncated": False,
            "new_facts": 0,
        }
        reward = 0.0 - self.turn_cost  # 0.0 - x avoids a -0.0 reward
        if isinstance(action, FinalAnswer):
            correct = is_correct(action.text, payload["answer"])
            self._state = replace(state, turn=state.turn + 1, done=True)
            info.update(correct=correct, gold_found=self.gold_found(), state_key=self.state_key())
            return StepResult(None, reward + float(correct), True, info)

        retrieved = state.retrieved
        if isinstance(action, ToolCall):
            kb = KnowledgeBase.from_payload(payload["facts"])
            ids = search_ids(kb, action.argument, self.k)
            retrieved = state.retrieved | frozenset(ids)
            info["new_facts"] = len(retrieved) - len(state.retrieved)
            observation: Message = {"role": "tool", "content": render_results(kb, ids)}
        else:
            observation = {"role": "user", "content": f"Invalid: {info['error']}."}

        done = state.turn + 1 >= self.max_turns
        self._state = replace(state, turn=state.turn + 1, retrieved=retrieved, done=done)
        info.update(gold_found=self.gold_found(), state_key=self.state_key())
        if done:
            info.update(truncated=True, correct=False)
            return StepResult(None, reward, True, info)
        return StepResult(observation, reward, False, info)

    def reference_response(self, task: Task) -> str | None:
        return format_answer(task.payload["answer"])

    def state_key(self) -> str | None:
        if self._state is None:
            return None
        facts = ",".join(str(i) for i in sorted(self._state.retrieved))
        text = f"{self._state.task.task_id}\x1f{facts}"
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    # -- progress (PATR's heuristic scorer) -------------------------------------

    def gold_found(self) -> int:
        """How many facts of the gold chain the searches so far retrieved."""
        if self._state is None:
            return 0
        return len(self._state.retrieved & frozenset(self._state.task.payload["gold"]))

    @property
    def hops(self) -> int:
        """The current task's hop count."""
        if self._state is None:
            raise RuntimeError("call reset(task) first")
        return len(self._state.task.payload["chain"])
