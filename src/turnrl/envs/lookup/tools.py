"""The lookup tools as plain functions, with OpenAI function-calling schemas.

For an agent program that is not a turnrl environment (an OpenAI-client agent
run by the agent loop, say): build :class:`LookupTools` from a task, hand
:data:`TOOL_SCHEMAS` to the chat-completions call as ``tools=``, and route each
tool call the model makes through :meth:`LookupTools.call`::

    tools = LookupTools(task)            # a Task, or its JSON record (task_record)
    reply = client.chat.completions.create(model=..., messages=..., tools=TOOL_SCHEMAS)
    for call in reply.choices[0].message.tool_calls or ():
        result = tools.call(call.function.name, call.function.arguments)  # never raises
    ...
    reward = tools.reward()              # 1.0 once answer() got the gold answer

``search(query)`` returns the best-matching facts, one per line (the same text
:class:`~turnrl.envs.lookup.env.LookupEnv` shows); ``answer(text)`` records the
final answer. :meth:`LookupTools.call` accepts the arguments as the JSON string
the API sends or as a dict, and turns every problem (bad JSON, a missing or
extra argument, an unknown tool) into an ``"error: ..."`` string the agent can
read, never an exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from turnrl.envs.lookup.kb import KnowledgeBase
from turnrl.envs.lookup.retriever import fact_index
from turnrl.types import Task

DEFAULT_K = 3
"""Facts returned per search."""

NO_MATCH = "No fact matches."

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": (
                "Search the knowledge base. Returns the best-matching facts, one per line, "
                "like 'Ada Lin mentor: Bo Kay'. Query with an entity and a relation."
            ),
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "e.g. 'Ada Lin mentor'"}},
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "answer",
            "description": "Give the final answer (an entity name). Ends the task.",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string", "description": "e.g. 'Rome'"}},
                "required": ["text"],
                "additionalProperties": False,
            },
        },
    },
]
"""OpenAI function-calling schemas of ``search`` and ``answer``."""

TOOL_NAMES = tuple(schema["function"]["name"] for schema in TOOL_SCHEMAS)

_NOT_WORD = re.compile(r"[^a-z0-9]+")


def normalise_answer(text: str) -> str:
    """Lower case, every run of non-alphanumerics one space, trimmed: ``" Bo  Kay."`` ->
    ``"bo kay"``."""
    return _NOT_WORD.sub(" ", text.lower()).strip()


def is_correct(answer: str, gold: str) -> bool:
    """Exact match after :func:`normalise_answer`."""
    return normalise_answer(answer) == normalise_answer(gold)


def task_record(task: Task) -> dict[str, Any]:
    """A task as one JSON object (``task_id``, ``tags`` and the payload's fields), the form
    task files hold; :class:`LookupTools` accepts it as well as the :class:`Task`."""
    return {"task_id": task.task_id, "tags": list(task.tags), **task.payload}


def search_ids(facts: KnowledgeBase, query: str, k: int = DEFAULT_K) -> list[int]:
    """Indices of the facts ``search`` returns for ``query``."""
    return fact_index(facts.texts).search(query, k)


def render_results(facts: KnowledgeBase, ids: list[int]) -> str:
    """The text of a search result: one fact per line, or :data:`NO_MATCH`."""
    return "\n".join(facts.facts[i].text for i in ids) if ids else NO_MATCH


class LookupTools:
    """``search`` and ``answer`` over one task's knowledge base, as plain functions."""

    def __init__(self, task: Task | Mapping[str, Any], *, k: int = DEFAULT_K) -> None:
        payload = task.payload if isinstance(task, Task) else task
        self.kb = KnowledgeBase.from_payload(payload["facts"])
        self.gold = str(payload["answer"])
        self.k = k
        self.answers: list[str] = []
        """Every answer given so far (the last one counts)."""

    def search(self, query: str) -> str:
        """The facts that best match ``query``, one per line."""
        return render_results(self.kb, search_ids(self.kb, str(query), self.k))

    def answer(self, text: str) -> str:
        """Record the final answer."""
        self.answers.append(str(text))
        return "Answer recorded."

    def reward(self) -> float:
        """1.0 if the last answer is the gold one (after normalisation), else 0.0."""
        return float(bool(self.answers) and is_correct(self.answers[-1], self.gold))

    def functions(self) -> dict[str, Callable[[str], str]]:
        """The tools by name."""
        return {"search": self.search, "answer": self.answer}

    def call(self, name: str, arguments: str | Mapping[str, Any]) -> str:
        """Run tool ``name`` with its JSON (or dict) arguments; problems become ``"error: ..."``."""
        tool = self.functions().get(name)
        if tool is None:
            return f"error: unknown tool {str(name)[:30]!r}; tools: {', '.join(sorted(TOOL_NAMES))}"
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (json.JSONDecodeError, RecursionError):
                return f"error: {name} arguments are not valid JSON"
        if not isinstance(arguments, Mapping):
            return f"error: {name} arguments must be a JSON object"
        (parameter,) = _parameters(name)
        value = arguments.get(parameter)
        if not isinstance(value, str) or set(arguments) != {parameter}:
            return f'error: {name} takes exactly one string argument "{parameter}"'
        return tool(value)


def _parameters(name: str) -> list[str]:
    schema = next(s for s in TOOL_SCHEMAS if s["function"]["name"] == name)
    return list(schema["function"]["parameters"]["properties"])
