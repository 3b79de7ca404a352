"""The sections only an agent run has: ``[agent]`` (the program) and ``[tasks]``.

Part of ``RunConfig`` (:mod:`turnrl.train.config`, which re-exports both); each
section checks its own values (``check``), and ``RunConfig.check`` what an agent run
needs of the shared sections. Setting ``agent.entrypoint`` or ``agent.command`` makes
a run an agent run (``RunConfig.mode``), and then ``[env]`` is refused; without
them, ``[agent]`` and ``[tasks]`` are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from turnrl.entrypoints import ENTRYPOINT_FORMAT
from turnrl.train import bounds
from turnrl.train.validate import Problems

GATEWAY_HOST = "127.0.0.1"
"""The agent loop's gateway listens on loopback only (``agent.port``)."""


@dataclass
class AgentConfig:
    """A user agent program, trained through the gateway (``turnrl train`` with ``[agent]``,
    see docs/agents.md). Set exactly one of ``entrypoint`` and ``command``; tasks then
    come from ``[tasks]``, and an ``[env]`` section is refused."""

    entrypoint: str | None = None
    """``"package.module:function"`` or ``"path/to/file.py:function"``: a function (sync or
    ``async def``) of ``(task: dict, llm)`` returning the reward, or ``{"reward": x,
    "info": {...}}``; run in this process, once per rollout."""
    command: list[str] = field(default_factory=list)
    """A program run once per rollout, e.g. ``["python", "my_agent.py"]``; its environment
    has ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_MODEL``, ``TURNRL_TASK_FILE``
    (a file holding the task as JSON) and, for tasks up to 64 KiB, ``TURNRL_TASK`` (the
    JSON itself); it prints ``{"reward": x}`` as its last stdout line or POSTs it. Checked
    before any work: it must exist, be executable, and name an existing ``#!``
    interpreter."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for ``command``."""
    model: str = "agent"
    """The model name the agent is handed (``llm.model``, ``OPENAI_MODEL``). The name a call
    asks for becomes the turn's ``role``, so a program may use several (``"solver"``...)."""
    isolation: Literal["auto", "namespaces", "user", "none"] = "auto"
    """How each rollout's ``command`` is kept from its siblings, so that none can read
    another's environment (its reward URL and secret, in ``/proc/PID/environ``) and
    reward it (docs/agents.md, "What an agent can reach"). ``"namespaces"``: user, PID
    and mount namespaces of its own per rollout (``unshare``; siblings have no PID it
    can see). ``"user"``: a fresh uid per rollout, in a private working directory
    (needs the trainer to run as root and the command, its interpreter and its files
    reachable by any user). ``"auto"``: the first of those that works here, else
    ``"none"`` with a warning line. ``"none"``: commands run as the trainer's user (a
    sibling can read their secrets). A named kind that does not work here is refused
    before any work. An entrypoint runs in-process and is not isolated."""
    concurrency: int = 16
    """Rollouts running at once."""
    timeout_s: float = 300.0
    """Time limit of one rollout (the agent's whole run); past it the rollout is dropped
    and counted as a failure."""
    turn_cost: float = 0.0
    """Subtracted from the reward of every turn (every call of the model) a rollout
    takes, as the built-in environments' ``turn_cost``: a rollout of ``n`` calls whose
    agent returns ``R`` is trained on the return ``R - n * turn_cost`` (each turn's
    record carries its ``-turn_cost``, the last one ``R`` as well). A cost per call, for
    the tool that costs a turn (#489); the agent's own reward still decides its
    success. 0: the records carry the agent's reward alone, as before."""
    max_failure_fraction: float = 0.25
    """The run stops when more than this share of a step's rollouts failed (raised, timed
    out, no or a non-finite reward, non-zero exit, no call)."""
    port: int = 0
    """Loopback port of the in-process gateway; 0 takes any free port."""
    tool_format: Literal["tags", "hermes"] = "tags"
    """How the policy writes tool calls (see docs/gateway.md)."""
    tools_in_prompt: bool = True
    """Describe the request's tools in the system prompt."""
    max_batch: int = 64
    """Most concurrent calls the gateway samples in one batch."""
    batch_window_ms: float = 50.0
    """How long the gateway gathers concurrent calls into a batch. Longer than ``turnrl
    serve``'s 5 ms: agents' calls arrive spread out (benchmarks/RESULTS.md, agent
    throughput), and the loop wants throughput, not the latency of one call."""

    @property
    def enabled(self) -> bool:
        """Whether the run trains a user agent program (``entrypoint`` or ``command`` set)."""
        return self.entrypoint is not None or bool(self.command)

    def check(self, p: Problems) -> None:
        if self.entrypoint is not None and self.command:
            p.add("command", "set exactly one of agent.entrypoint and agent.command, not both")
        if self.entrypoint is not None and not ENTRYPOINT_FORMAT.match(self.entrypoint):
            p.add(
                "entrypoint",
                f"expected 'package.module:function' or 'path/to/file.py:function', "
                f"got {self.entrypoint!r}",
            )
        if not self.model:
            p.add("model", "must name a model (it becomes the turns' role)")
        if self.isolation not in ("auto", "none") and self.entrypoint is not None:
            p.add("isolation", "applies to agent.command only (an entrypoint runs in-process)")
        p.at_least("concurrency", self.concurrency, 1)
        p.at_most("concurrency", self.concurrency, bounds.MAX_CONCURRENCY, bounds.WHY)
        p.above("timeout_s", self.timeout_s, 0)
        p.finite("turn_cost", self.turn_cost)
        p.at_least("turn_cost", self.turn_cost, 0.0)
        p.within("max_failure_fraction", self.max_failure_fraction, 0.0, 1.0)
        p.within("port", self.port, 0, 65535)
        if 1 <= self.port <= 65535:
            self._check_port_free(p)
        p.at_least("max_batch", self.max_batch, 1)
        p.at_least("batch_window_ms", self.batch_window_ms, 0)

    def _check_port_free(self, p: Problems) -> None:
        """The gateway's port is free now, before any work (the trainer binds it next; a
        port taken in between still fails there with one line)."""
        from turnrl.serve.net import BindError, bind_socket

        try:
            bind_socket(GATEWAY_HOST, self.port).close()
        except BindError as err:
            p.add("port", str(err))


@dataclass
class TasksConfig:
    """The tasks of the agent loop (with ``[agent]``): what each rollout's agent receives."""

    train: str = "calculator"
    """A JSONL file (one JSON object with a ``task_id`` per line, handed to the agent whole;
    optional ``tags``) or a built-in task set by name (``calculator``)."""
    eval: str | None = None
    """Held-out tasks (a file or a built-in set); unset: a built-in ``train`` set drawn from
    another seed. Required when ``train`` is a file: the loop always evaluates (after the
    warm start, every ``train.eval_every`` steps, at the end), and a file's tasks are all
    trained on, so nothing of it is held out."""
    n_train: int = 512
    """Tasks drawn from a built-in training set (a file is used whole)."""
    n_eval: int = 64
    """Tasks drawn from a built-in evaluation set."""
    seed: int = 0
    """Seed of the built-in sets (evaluation derives its own from it)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of a built-in set, e.g. ``{hard_fraction = 0.5}`` for
    ``calculator``."""

    def check(self, p: Problems) -> None:
        for name in ("n_train", "n_eval"):
            p.at_least(name, getattr(self, name), 1)
            p.at_most(name, getattr(self, name), bounds.MAX_TASK_POOL, bounds.WHY)
