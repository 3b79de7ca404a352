"""Entrypoint programs: an agent function called in-process, once per rollout.

``entrypoint = "package.module:function"`` (or ``"path/to/file.py:function"``):
``function(task: dict, llm: LLM)``, sync or ``async def``, returns the reward as a
number, or a dict ``{"reward": x, "info": {...}}``, or ``None`` when it posted
the reward to ``llm.reward_url`` itself. Both run on reused daemon worker
threads (:class:`DaemonThreads`), an ``async def`` on its thread's own event loop
(:class:`_ThreadLoop`), so an agent that blocks (``time.sleep`` in a coroutine)
blocks only itself and the runner's clock still times it out (a hung thread
cannot be killed in Python: it is abandoned, and its rollout closed, so its
later calls are refused). Whatever an agent raises, ``SystemExit`` and
``KeyboardInterrupt`` included, fails its rollout only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import io
import queue
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from turnrl.train.agent.contract import LLM, AgentFailed, AgentOutput, load_entrypoint


def _format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


class EntrypointProgram:
    """An agent function called in-process, on a daemon worker thread (an ``async def``
    on that thread's own event loop), timed out by the runner's clock."""

    def __init__(self, spec: str) -> None:
        self.fn = load_entrypoint(spec)
        self.description = f"entrypoint {spec}"
        self.is_async = inspect.iscoroutinefunction(self.fn)
        self.threads = DaemonThreads()

    async def run(self, task: dict[str, Any], llm: LLM, timeout_s: float) -> AgentOutput:
        if self.is_async:
            call: Callable[..., Any] = _run_coroutine_function
            args: tuple[Any, ...] = (self.fn, task, llm)
        else:
            call, args = self.fn, (task, llm)
        value = await _thread_with_timeout(self.threads, call, args, timeout_s)
        return AgentOutput(value=value)


def _raised(exc: BaseException) -> AgentFailed:
    return AgentFailed(f"raised {type(exc).__name__}: {exc}", _format_exception(exc))


def _timed_out(timeout_s: float, where: str) -> AgentFailed:
    return AgentFailed(f"timed out after {timeout_s:g} s", f"where the agent was:\n{where}")


class _ThreadLoop:
    """A worker thread's own event loop for async agents, and the HTTP client bound to
    it (``llm.async_openai_client`` uses it: a new one costs about 0.1 s of CPU)."""

    _local = threading.local()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.http_client: Any = None
        with contextlib.suppress(ImportError):
            import openai

            self.http_client = openai.DefaultAsyncHttpxClient()
        self.task: asyncio.Task[Any] | None = None
        """The agent's task while it runs (its stack, and cancelling it on timeout)."""

    @classmethod
    def current(cls) -> _ThreadLoop:
        """This thread's loop (made on first use)."""
        loop = getattr(cls._local, "loop", None)
        if loop is None:
            loop = cls._local.loop = cls()
        return loop

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` to the end, then cancel what it left running. A loop that an
        agent left with a ``BaseException`` (``SystemExit``, cancellation) is discarded."""
        self.task = self.loop.create_task(coroutine)
        try:
            return self.loop.run_until_complete(self.task)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self.discard()
            raise
        finally:
            self.task = None
            if not self.loop.is_closed():
                self.cancel_leftovers()

    def cancel_leftovers(self) -> None:
        """Cancel the tasks an agent left behind (as ``asyncio.run`` does)."""
        leftovers = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for leftover in leftovers:
            leftover.cancel()
        if leftovers:
            with contextlib.suppress(BaseException):
                self.loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))

    def discard(self) -> None:
        """Forget this thread's loop (the next async agent gets a new one) and close it."""
        type(self)._local.loop = None
        with contextlib.suppress(BaseException):
            self.cancel_leftovers()
            if self.http_client is not None:
                self.loop.run_until_complete(self.http_client.aclose())
            self.loop.close()

    def cancel(self) -> None:
        """Cancel the running agent (from another thread; it stops at its next await)."""
        task = self.task
        if task is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self.loop.call_soon_threadsafe(task.cancel)

    def stack(self) -> str:
        """Where the agent's coroutine is suspended (empty when it is not)."""
        task = self.task
        if task is None:
            return ""
        out = io.StringIO()
        with contextlib.suppress(Exception):  # read from another thread: best effort
            task.print_stack(file=out)
        return out.getvalue()


def _run_coroutine_function(fn: Callable[..., Any], task: dict[str, Any], llm: LLM) -> Any:
    """Call an async agent on this worker thread's own event loop (with the loop's HTTP
    client in ``llm``) and wait for it."""
    thread_loop = _ThreadLoop.current()
    if thread_loop.http_client is not None:
        llm = dataclasses.replace(llm, async_http_client=thread_loop.http_client)
    return thread_loop.run(fn(task, llm))


class DaemonThreads:
    """Daemon worker threads for agent functions: started on demand, then reused.

    Not a ``ThreadPoolExecutor``: its threads are joined when the interpreter exits,
    so one hung agent would hang the trainer's exit. Not a new thread per rollout
    either: ``Thread.start`` waits until the thread runs, which under a busy GIL
    (the sampler) took about 0.1 s and held up the event loop that launches agents.
    A job whose agent hangs keeps its thread; the next submit finds no idle worker
    and starts another.
    """

    def __init__(self, name: str = "turnrl-agent") -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self.started = 0
        """Threads started so far."""

    def submit(self, job: _Job) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
            else:
                self.started += 1
                threading.Thread(target=self._work, name=self.name, daemon=True).start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            self._jobs.get().run()
            with self._lock:
                self._idle += 1


@dataclass
class _Job:
    """One call of an agent function, reporting back to an event loop."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[tuple[bool, Any]]
    """Settled with ``(True, value)`` or ``(False, exception)``: never with the exception
    itself, which for ``SystemExit``/``KeyboardInterrupt`` would escape the runner's loop."""
    thread: int | None = None
    """The worker thread's id while it runs (for the stack of a hung agent)."""
    thread_loop: _ThreadLoop | None = None
    """The worker thread's event loop while an async agent runs on it."""

    def run(self) -> None:
        self.thread = threading.get_ident()
        if self.fn is _run_coroutine_function:
            self.thread_loop = _ThreadLoop.current()
        try:
            result: tuple[bool, Any] = (True, self.fn(*self.args))
        except BaseException as exc:  # anything the agent raises fails its rollout only
            result = (False, exc)
        self.thread = None
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            self.loop.call_soon_threadsafe(self._settle, result)

    def _settle(self, result: tuple[bool, Any]) -> None:
        if not self.future.done():
            self.future.set_result(result)

    def where(self) -> str:
        """The stack of the running agent: its thread's, and its coroutine's if async."""
        frame = sys._current_frames().get(self.thread) if self.thread is not None else None
        where = "".join(traceback.format_stack(frame)) if frame is not None else "(not started)"
        coroutine = self.thread_loop.stack() if self.thread_loop is not None else ""
        return f"{where}\n{coroutine}" if coroutine else where


async def _thread_with_timeout(
    threads: DaemonThreads, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float
) -> Any:
    """Call an agent function on a worker thread and wait at most ``timeout_s``.

    Anything it raises (``BaseException`` included) is :class:`AgentFailed`; on timeout
    its stack is saved, an async agent is cancelled and the thread abandoned. Only the
    cancellation of the waiting task itself (the runner stopping) propagates.
    """
    loop = asyncio.get_running_loop()
    job = _Job(fn, args, loop, loop.create_future())
    threads.submit(job)
    try:
        done, _ = await asyncio.wait({job.future}, timeout=timeout_s)
    except asyncio.CancelledError:  # the runner stops: stop an async agent too
        if job.thread_loop is not None:
            job.thread_loop.cancel()
        raise
    if not done:
        where = job.where()
        if job.thread_loop is not None:
            job.thread_loop.cancel()
        job.future.cancel()
        raise _timed_out(timeout_s, where)
    ok, value = job.future.result()
    if not ok:
        raise _raised(value)
    return value
