"""Run many agent rollouts at once against the gateway, and keep what they recorded.

Each rollout is one run of the user's program (:mod:`turnrl.train.agent.programs`)
on one task, with a base URL that names the rollout, so every chat completion
the program makes becomes a turn record of that rollout in the gateway. At most
``concurrency`` rollouts run at a time; each has ``timeout_s`` in all.

A rollout whose agent failed (raised, timed out, gave no or a non-finite
reward, exited non-zero, or never called the model) is closed in the gateway
(later calls are refused) and dropped. What is known about it (the reason, the
traceback, or the program's stderr and stdout) is saved as
``<failure_dir>/<rollout_id>.txt`` and returned as an :class:`AgentFailure`;
the trainer counts, logs and limits them.

A rollout whose call the gateway refused at the per-turn context cap
(``rollout.max_context_tokens``) ends truncated (:attr:`RolloutResult.truncated`):
trained on if its agent still gave a reward, else a failure whose reason says so
(logged, but not held against ``agent.max_failure_fraction``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from turnrl.io import atomic_write_text
from turnrl.train.agent.contract import LLM, AgentFailed, AgentProgram, reward_of
from turnrl.train.process_tree import agent_watchdog, no_process_left
from turnrl.types import Task, TurnRecord

AT_CONTEXT_CAP = (
    "the gateway refused a call over the per-turn context cap (rollout.max_context_tokens: "
    "400 context_length_exceeded), which ended the rollout truncated"
)
"""How a failure's reason starts when the context cap ended its rollout."""


class Endpoint(Protocol):
    """Where one rollout's agent talks to the gateway (:class:`turnrl.serve.RolloutEndpoint`)."""

    base_url: str
    reward_url: str
    api_key: str

    def env(self) -> dict[str, str]: ...


class RolloutLink(Protocol):
    """What the runner needs from the gateway."""

    def open(self, rollout_id: str, task_id: str) -> Endpoint:
        """Register a rollout of task ``task_id``; its URLs."""
        ...

    def posted_reward(self, rollout_id: str) -> float | None:
        """The reward the agent posted itself, if it did."""
        ...

    def finish(self, rollout_id: str, reward: float) -> int:
        """Put ``reward`` on the rollout (equal to a posted one: no change); its turn count."""
        ...

    def close(self, rollout_id: str, reason: str) -> None:
        """Drop a failed rollout; later calls on it are refused."""
        ...

    def collect(self) -> dict[str, tuple[TurnRecord, ...]]:
        """The records of every rollout finished since the last collect, by rollout id
        (the gateway then forgets them)."""
        ...

    def truncated(self, rollout_id: str) -> str | None:
        """Why the open rollout ended truncated (``"context"``: a call over the context
        cap was refused), or ``None``."""
        ...


@dataclass(frozen=True)
class AgentFailure:
    """One dropped rollout: why, and where the details were saved."""

    rollout_id: str
    task_id: str
    reason: str
    path: str | None

    def describe(self) -> str:
        where = f" (details: {self.path})" if self.path else ""
        return f"rollout {self.rollout_id} (task {self.task_id}): {self.reason}{where}"


@dataclass
class RolloutResult:
    """One finished (or failed) rollout."""

    rollout_id: str
    task: Task
    records: list[TurnRecord] = field(default_factory=list)
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    failure: AgentFailure | None = None
    seconds: float = 0.0
    turn_cost: float = 0.0
    """What each of ``records`` was charged (``agent.turn_cost``; already in their
    rewards): the rollout's return is ``reward - turn_cost * len(records)``."""
    truncated: str | None = None
    """``"context"``: the gateway refused a call over the per-turn context cap, which
    ended the rollout (``None``: it was not truncated)."""


def charge_turns(records: Sequence[TurnRecord], turn_cost: float) -> list[TurnRecord]:
    """The records with ``turn_cost`` subtracted from each one's reward
    (``agent.turn_cost``); unchanged (the same objects) when it is 0."""
    if turn_cost == 0:
        return list(records)
    return [dataclasses.replace(r, reward=r.reward - turn_cost) for r in records]


class AgentRunner:
    """Runs a batch of rollouts of one agent program, ``concurrency`` at a time."""

    def __init__(
        self,
        program: AgentProgram,
        link: RolloutLink,
        *,
        concurrency: int,
        timeout_s: float,
        model: str,
        api_key: str = "turnrl",
        turn_cost: float = 0.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"agent.concurrency must be >= 1, got {concurrency}")
        if not timeout_s > 0:
            raise ValueError(f"agent.timeout_s must be > 0, got {timeout_s}")
        self.program = program
        self.link = link
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.model = model
        self.api_key = api_key
        self.turn_cost = turn_cost

    def run(
        self,
        jobs: Sequence[tuple[str, Task]],
        *,
        failure_dir: Path | None = None,
        on_done: Callable[[RolloutResult], None] | None = None,
    ) -> list[RolloutResult]:
        """Run every ``(rollout_id, task)`` job; results in job order.

        ``failure_dir`` receives one file per failed rollout; ``on_done`` is called
        as each rollout ends (progress bars). Processes the agents started and left
        running (outside their process group) are killed at the end of the batch
        (:func:`~turnrl.train.process_tree.no_process_left`); a program that starts
        processes (a command) has them killed if this process is killed too
        (:func:`~turnrl.train.process_tree.agent_watchdog`).
        """
        spawns = bool(getattr(self.program, "spawns_processes", False))
        with no_process_left(), agent_watchdog(enabled=spawns):
            return asyncio.run(self._run_all(jobs, failure_dir, on_done))

    async def _run_all(
        self,
        jobs: Sequence[tuple[str, Task]],
        failure_dir: Path | None,
        on_done: Callable[[RolloutResult], None] | None,
    ) -> list[RolloutResult]:
        slots = asyncio.Semaphore(self.concurrency)
        clients = _http_clients()

        async def one(rollout_id: str, task: Task) -> RolloutResult:
            async with slots:
                result = await self._rollout(rollout_id, task, failure_dir, clients)
            if on_done is not None:
                on_done(result)
            return result

        try:
            results = list(await asyncio.gather(*(one(rid, task) for rid, task in jobs)))
        finally:
            if clients is not None:
                clients[0].close()
                await clients[1].aclose()
        finished = self.link.collect()
        for result in results:
            if result.failure is None:
                records = finished.get(result.rollout_id)
                if records is None:  # closed by the gateway after it finished: lost
                    lost = AgentFailed("the gateway lost the finished rollout's records")
                    result.failure = self._fail(result.rollout_id, result.task, failure_dir, lost)
                else:
                    result.records = charge_turns(records, self.turn_cost)
                    result.turn_cost = self.turn_cost
        return results

    def llm(self, rollout_id: str, task: Task, clients: tuple[Any, Any] | None = None) -> LLM:
        """Open the rollout in the gateway; the handle its agent gets."""
        endpoint = self.link.open(rollout_id, task.task_id)
        return LLM(
            base_url=endpoint.base_url,
            api_key=endpoint.api_key,
            model=self.model,
            rollout_id=rollout_id,
            task_id=task.task_id,
            timeout_s=self.timeout_s,
            reward_url=endpoint.reward_url,
            env=endpoint.env(),
            http_client=None if clients is None else clients[0],
            async_http_client=None if clients is None else clients[1],
        )

    async def _rollout(
        self,
        rollout_id: str,
        task: Task,
        failure_dir: Path | None,
        clients: tuple[Any, Any] | None,
    ) -> RolloutResult:
        started = time.perf_counter()
        result = RolloutResult(rollout_id, task)
        try:
            llm = self.llm(rollout_id, task, clients)
            try:
                output = await self.program.run(dict(task.payload), llm, self.timeout_s)
            finally:
                result.truncated = self._truncation(rollout_id)
            result.reward, result.info = reward_of(output, self.link.posted_reward(rollout_id))
            if self.link.finish(rollout_id, result.reward) == 0:
                raise AgentFailed("the agent made no call to the model")
        except AgentFailed as failed:
            if result.truncated is not None:
                failed = AgentFailed(
                    f"{AT_CONTEXT_CAP}; then: {failed.reason}",
                    failed.details,
                )
            result.failure = self._fail(rollout_id, task, failure_dir, failed)
        except Exception as exc:  # a fault in one rollout never stops the others
            failed = AgentFailed(
                f"the rollout failed in turnrl: {type(exc).__name__}: {exc}",
                traceback.format_exc(),
            )
            result.failure = self._fail(rollout_id, task, failure_dir, failed)
        result.seconds = time.perf_counter() - started
        return result

    def _truncation(self, rollout_id: str) -> str | None:
        """Whether the gateway ended the rollout at the context cap (``None`` also when
        the gateway cannot say: it closed the rollout, or is going away)."""
        try:
            return self.link.truncated(rollout_id)
        except Exception:
            return None

    def _fail(
        self, rollout_id: str, task: Task, failure_dir: Path | None, failed: AgentFailed
    ) -> AgentFailure:
        """Close the rollout in the gateway and save what is known about its failure."""
        try:
            self.link.close(rollout_id, failed.reason)
        except Exception as exc:  # already closed, or the gateway is going away
            failed = AgentFailed(failed.reason, f"{failed.details}\n(closing it failed: {exc})")
        path = _save_failure(failure_dir, rollout_id, task, self.program.description, failed)
        return AgentFailure(rollout_id, task.task_id, failed.reason, path)


def _http_clients() -> tuple[Any, Any] | None:
    """Sync and async HTTP clients (openai's defaults) shared by a batch's agents, or
    None when ``openai`` is not installed."""
    try:
        import openai
    except ImportError:
        return None
    return openai.DefaultHttpxClient(), openai.DefaultAsyncHttpxClient()


def _save_failure(
    directory: Path | None, rollout_id: str, task: Task, program: str, failed: AgentFailed
) -> str | None:
    """Write what is known about a failed rollout; returns the file's path."""
    if directory is None:
        return None
    path = Path(directory) / f"{rollout_id}.txt"
    header = (
        f"rollout: {rollout_id}\ntask: {task.task_id}\nagent: {program}\n"
        f"failure: {failed.reason}\n\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, header + (failed.details or "(no details)") + "\n")
    return str(path)


def failure_fraction_error(
    failures: Sequence[AgentFailure], total: int, limit: float, what: str
) -> str | None:
    """The message that stops a run when more than ``limit`` of ``total`` rollouts failed."""
    if total == 0 or len(failures) <= limit * total:
        return None
    return (
        f"{len(failures)} of {total} agent rollouts failed in {what}, more than "
        f"agent.max_failure_fraction={limit:g}; first failure: {failures[0].describe()}"
    )


def counted_failures(results: Sequence[RolloutResult]) -> list[AgentFailure]:
    """The failures ``agent.max_failure_fraction`` limits: all but those of rollouts the
    context cap ended (the run asked for that truncation; they are still logged)."""
    return [r.failure for r in results if r.failure is not None and r.truncated is None]


class GatewayLink:
    """:class:`RolloutLink` over an in-process :class:`~turnrl.serve.Gateway` and its server."""

    def __init__(self, gateway: Any, server: Any) -> None:
        self.gateway = gateway
        self.server = server

    def open(self, rollout_id: str, task_id: str) -> Endpoint:
        endpoint = self.server.open_rollout(rollout_id, task_id)
        # The task is pinned by open_rollout: a base URL without it works for any task id
        # (one with a "/" cannot be a path segment). The rollout's secret stays in it.
        base_url = self.server.base_url(rollout_id, secret=endpoint.secret)
        return dataclasses.replace(endpoint, base_url=base_url, reward_url=f"{base_url}/reward")

    def posted_reward(self, rollout_id: str) -> float | None:
        from turnrl.serve import GatewayError

        try:
            state = self.gateway.views.rollout(rollout_id)
        except GatewayError:  # closed (the gateway's own timeout)
            return None
        if not state["finished"] or not state["records"]:
            return None
        posted = float(state["records"][-1]["reward"])
        _, refused = self.gateway.registry.problems(rollout_id)
        if refused:
            raise AgentFailed(
                f"the agent posted a second, different reward ({refused[0]:g} after "
                f"{posted:g}); a rollout has one reward",
                f"posted reward: {posted:g}; refused (409) later rewards: "
                + ", ".join(f"{value:g}" for value in refused),
            )
        return posted

    def finish(self, rollout_id: str, reward: float) -> int:
        from turnrl.serve import GatewayError

        try:
            summary = self.gateway.reward(rollout_id, reward)
        except GatewayError as exc:
            raise AgentFailed(f"the gateway refused the reward: {exc}") from exc
        turns = int(summary.get("turns", 1))
        refusals, _ = self.gateway.registry.problems(rollout_id)
        if turns == 0 and refusals:
            raise AgentFailed(
                f"the gateway refused the agent's calls ({len(refusals)}), last: {refusals[-1]}",
                "refused calls (the gateway's answers):\n" + "\n".join(refusals),
            )
        return turns

    def close(self, rollout_id: str, reason: str) -> None:
        self.gateway.discard(rollout_id, reason)

    def truncated(self, rollout_id: str) -> str | None:
        return self.gateway.registry.truncation(rollout_id)

    def collect(self) -> dict[str, tuple[TurnRecord, ...]]:
        # counted in the gateway's stats; the runner has its own list
        self.gateway.registry.pop_closed()
        return {r.rollout_id: r.records for r in self.gateway.views.pop_finished_rollouts()}
