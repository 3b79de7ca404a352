"""What the calculator agents of examples/agents/ share, with no turnrl import.

A user's agent lives in its own environment, without turnrl: these examples run
unchanged in ``.venv-agents`` (``make setup-agents``: the frameworks of
requirements/agents.txt, no turnrl, no torch) as ``agent.command`` programs, and in
turnrl's own venv as ``agent.entrypoint`` functions. Each example is one function
``run(task, llm)`` and two thin entries: the function itself (in-process: ``llm`` is
turnrl's ``LLM``) and ``main(run)`` under ``if __name__ == "__main__"`` (a command:
``llm`` is an :class:`Endpoint` read from the environment turnrl gives the command).

Here, for both:

* :func:`calculator`: the tool, turnrl's safe arithmetic (parsed, never ``eval``).
  It is ``src/turnrl/envs/safe_math.py`` loaded by path: a standard-library-only
  file of this repository, not the ``turnrl`` package (which the agent venv does not
  have). An agent of your own brings its own tools.
* :func:`score`: the reward, 1.0 when the reply's last number is the task's answer.
* :func:`main`: the command entry: the task from ``TURNRL_TASK_FILE`` (or
  ``TURNRL_TASK``), the endpoint from ``OPENAI_BASE_URL``/``OPENAI_API_KEY``/
  ``OPENAI_MODEL``, the result printed as the last stdout line ``{"reward": ...}``.

The examples find this module by putting their own folder on ``sys.path`` (a command's
folder is there already; turnrl loads an entrypoint file by path, without it).
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SAFE_MATH_FILE = Path(__file__).resolve().parents[2] / "src" / "turnrl" / "envs" / "safe_math.py"


def _load_safe_math() -> Any:
    """turnrl's safe arithmetic module, loaded from its file (standard library only)."""
    spec = importlib.util.spec_from_file_location("calc_common_safe_math", _SAFE_MATH_FILE)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {_SAFE_MATH_FILE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_safe_math = _load_safe_math()

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")
"""A number as ``turnrl.envs.calculator.parse_number`` reads it (test_agent_frameworks_venv
checks that the two agree)."""


def calculator(expression: str) -> str:
    """The calculator tool: the result of ``expression``, or ``"error: ..."`` for input the
    safe arithmetic refuses (names, calls, huge powers...)."""
    try:
        return _safe_math.calculate(expression)
    except _safe_math.SafeMathError as exc:
        return f"error: {exc}"


def is_correct(reply: str, expected: float) -> bool:
    """Whether the last number of ``reply`` is ``expected`` (relative tolerance 1e-6;
    thousands separators ignored)."""
    matches = _NUMBER.findall(reply)
    if not matches:
        return False
    try:
        value = float(matches[-1].replace(",", ""))
    except ValueError:
        return False
    return abs(value - expected) <= 1e-6 * max(1.0, abs(expected))


def score(task: Mapping[str, Any], reply: str) -> dict[str, Any]:
    """The episode's result: reward 1.0 and success when ``reply`` states the answer."""
    correct = is_correct(reply, float(task["answer"]))
    return {"reward": float(correct), "info": {"success": correct}}


@dataclass(frozen=True)
class Endpoint:
    """The part of turnrl's ``LLM`` a command gets, from its environment: the rollout's
    base URL, the run's key and the model name."""

    base_url: str
    api_key: str
    model: str

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Endpoint:
        return cls(environ["OPENAI_BASE_URL"], environ["OPENAI_API_KEY"], environ["OPENAI_MODEL"])

    def async_openai_client(self) -> Any:
        """An ``openai.AsyncOpenAI`` client for the rollout (as ``LLM.async_openai_client``)."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key)


def read_task(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The rollout's task: ``TURNRL_TASK_FILE`` (always set by turnrl), else ``TURNRL_TASK``."""
    path = environ.get("TURNRL_TASK_FILE")
    task = json.loads(Path(path).read_text()) if path else json.loads(environ["TURNRL_TASK"])
    if not isinstance(task, dict):
        raise ValueError(f"the task is not a JSON object: {task!r:.200}")
    return task


def main(run: Callable[[dict[str, Any], Endpoint], Any]) -> None:
    """The command entry: one episode of ``run`` (sync or ``async def``) on the rollout's
    task, its result printed as the last line of stdout."""
    result = run(read_task(), Endpoint.from_environ())
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    print(json.dumps(result), flush=True)
