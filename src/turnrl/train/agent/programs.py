"""User agent programs: a Python function or any command, run once per rollout.

Two ways to plug an agent in (``[agent]`` in the run config):

* ``entrypoint = "package.module:function"`` (or ``"path/to/file.py:function"``):
  ``function(task: dict, llm: LLM)``, sync or ``async def``, returns the reward
  as a number, or a dict ``{"reward": x, "info": {...}}``, or ``None`` when it
  posted the reward to ``llm.reward_url`` itself. Both run on reused daemon
  worker threads, an ``async def`` on its thread's own event loop, so an agent
  that blocks (``time.sleep`` in a coroutine) blocks only itself and the
  runner's clock still times it out (a hung thread cannot be killed in Python:
  it is abandoned, and its rollout closed, so its later calls are refused).
  Whatever an agent raises, ``SystemExit`` and ``KeyboardInterrupt`` included,
  fails its rollout only.
* ``command = ["python", "my_agent.py"]``: any program, in its own process group
  (killed as a whole when it times out or finishes). Its environment has
  ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_MODEL`` (which the official
  clients read), ``TURNRL_TASK_FILE`` (a file holding the task as JSON),
  ``TURNRL_TASK`` (the same JSON, only when it is at most
  :data:`TASK_ENV_MAX_BYTES`: larger values do not fit in one environment
  variable on Linux), ``TURNRL_ROLLOUT_ID``,
  ``TURNRL_REWARD_URL``, and Agent Lightning's ``AGL_OPENAI_BASE_URL``,
  ``AGL_EVENT_URL`` and ``AGL_KEY`` (so its published agents run unchanged).
  It reports its reward as the last line of stdout (``{"reward": x}``,
  optionally with ``"info"``), or by POSTing ``{"reward": x}`` to
  ``TURNRL_REWARD_URL``; a last line over :data:`OUTPUT_TAIL_BYTES` is
  reported as too long. A command whose first word is ``python`` or
  ``python3`` runs with the interpreter turnrl runs in; any other program is
  checked before any work (it exists, is executable, its ``#!`` interpreter
  exists).

The contract both share (:class:`~turnrl.train.agent.contract.LLM`,
:class:`~turnrl.train.agent.contract.AgentOutput`, what counts as a failure:
:func:`~turnrl.train.agent.contract.reward_of`) is in
:mod:`turnrl.train.agent.contract`; the two programs are in
:mod:`turnrl.train.agent.inprocess` and :mod:`turnrl.train.agent.command`. This
module picks one (:func:`make_program`).
"""

from __future__ import annotations

from collections.abc import Sequence

from turnrl.train.agent.command import CommandProgram
from turnrl.train.agent.contract import AgentConfigError, AgentProgram
from turnrl.train.agent.inprocess import EntrypointProgram


def make_program(
    entrypoint: str | None,
    command: Sequence[str] | None,
    env: dict[str, str] | None = None,
    *,
    isolation: str = "auto",
) -> AgentProgram:
    """The program an ``[agent]`` section describes: exactly one of entrypoint and command
    (``isolation``: how each rollout's command is kept from its siblings, see
    :mod:`turnrl.train.agent.isolation`)."""
    if (entrypoint is None) == (not command):
        raise AgentConfigError("[agent]: set exactly one of agent.entrypoint and agent.command")
    if entrypoint is not None:
        return EntrypointProgram(entrypoint)
    assert command is not None
    return CommandProgram(command, env=env, isolation=isolation)
