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

What a run produced is an :class:`AgentOutput`; what counts as a failure
(raised, timed out, no reward, a non-finite reward, a non-zero exit) is decided
in :func:`reward_of`, and the runner (:mod:`turnrl.train.agent.runner`) drops
those rollouts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import inspect
import io
import json
import math
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from turnrl.entrypoints import load_object
from turnrl.errors import ConfigError
from turnrl.train.credit_check import MAX_ABS_REWARD

OUTPUT_TAIL_BYTES = 64 * 1024
"""How much of a command's stdout and stderr is kept (the end of each); also the
longest reward line a command may print."""
TASK_ENV_MAX_BYTES = 64 * 1024
"""The largest task JSON also handed over in ``TURNRL_TASK`` (Linux refuses a single
environment string over 128 KiB with "Argument list too long"); ``TURNRL_TASK_FILE``
always holds it."""
KILL_GRACE_S = 2.0
"""How long to wait for a killed command's pipes to close before giving up on them."""


class AgentConfigError(ConfigError):
    """The agent program cannot be loaded or started (caught before any work)."""


class AgentFailed(Exception):
    """One rollout's agent failed: ``reason`` is one line, ``details`` a traceback or output."""

    def __init__(self, reason: str, details: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.details = details


@dataclass(frozen=True)
class LLM:
    """How an agent function reaches the policy for one rollout of one task.

    ``base_url`` already names the rollout, so every chat completion made with it
    is a turn of this rollout; ``model`` may be replaced by any name, which becomes
    the turn's ``role`` (several agents in one program: ``"solver"``, ``"checker"``).
    """

    base_url: str
    """OpenAI ``base_url`` scoped to this rollout (``.../rollouts/ID/v1``)."""
    api_key: str
    """The run's gateway key (a fresh one per run): clients send it as ``Authorization:
    Bearer``; the gateway refuses calls without it."""
    model: str
    """The model name to ask for (the default role)."""
    rollout_id: str
    task_id: str
    timeout_s: float
    """The rollout's time limit (also a sensible per-request timeout)."""
    reward_url: str
    """Where to POST ``{"reward": x}`` instead of returning it (with the key:
    ``Authorization: Bearer`` ``api_key``); it carries this rollout's secret."""
    env: dict[str, str] = field(default_factory=dict, repr=False)
    """The gateway's environment variables for this rollout (``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY`` and Agent Lightning's ``AGL_*``), handed to commands."""
    http_client: Any = field(default=None, repr=False, compare=False)
    """An ``httpx`` client shared by the batch's rollouts (``openai_client`` uses it: a new
    one costs about 0.1 s of CPU, mostly loading certificates), or None."""
    async_http_client: Any = field(default=None, repr=False, compare=False)
    """The same for ``async_openai_client`` (bound to the batch's event loop)."""

    def client_settings(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for an ``openai.OpenAI``/``AsyncOpenAI`` client of this rollout.

        The request timeout is the rollout's; retries are the client's default (the
        gateway answers a repeated request once, with the first call's result).
        """
        return {
            "base_url": self.base_url,
            "api_key": self.api_key,
            "timeout": self.timeout_s,
            **overrides,
        }

    def openai_client(self, **overrides: Any) -> Any:
        """An ``openai.OpenAI`` client for this rollout (needs the ``openai`` package)."""
        import openai

        if self.http_client is not None:
            overrides.setdefault("http_client", self.http_client)
        return openai.OpenAI(**self.client_settings(**overrides))

    def async_openai_client(self, **overrides: Any) -> Any:
        """An ``openai.AsyncOpenAI`` client for this rollout."""
        import openai

        if self.async_http_client is not None:
            overrides.setdefault("http_client", self.async_http_client)
        return openai.AsyncOpenAI(**self.client_settings(**overrides))


@dataclass
class AgentOutput:
    """What one agent run gave back, before it is judged (see :func:`reward_of`)."""

    value: Any = None
    """An entrypoint's return value, or the parsed last stdout line of a command."""
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    details: str = field(default="", repr=False)
    """What to save if the run turns out to have failed (output, or nothing)."""


class AgentProgram(Protocol):
    """One way of running the user's agent: once per rollout, for one task."""

    description: str

    async def run(self, task: dict[str, Any], llm: LLM, timeout_s: float) -> AgentOutput:
        """Run the agent to the end; :class:`AgentFailed` if it crashed or ran past
        ``timeout_s`` (nothing it started is left running, threads excepted)."""
        ...


def is_number(value: Any) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def reward_of(output: AgentOutput, posted: float | None) -> tuple[float, dict[str, Any]]:
    """The rollout's reward and info, or :class:`AgentFailed` saying why there is none.

    ``posted`` is the reward the agent posted to the gateway itself (or ``None``).
    A posted reward has already finished the rollout, so it is the reward; a
    returned or printed one must then be the same number (a different one is a
    failure, never an override) and contributes its ``info``.
    """
    value = output.value
    info: dict[str, Any] = {}
    if isinstance(value, dict):
        raw_info = value.get("info", {})
        if not isinstance(raw_info, dict):
            raise AgentFailed(
                f"'info' must be a dict, got {type(raw_info).__name__}", output.details
            )
        info = raw_info
        if "reward" not in value and posted is None:
            raise AgentFailed("returned a dict without 'reward'", output.details)
        value = value.get("reward")
    if posted is not None:
        if value is not None and not (is_number(value) and float(value) == posted):
            raise AgentFailed(
                f"the agent posted reward {posted:g} and returned {value!r}; a rollout has "
                "one reward (post it or return it)",
                output.details,
            )
        return check_reward_range(posted, output.details), info
    if value is None:
        raise AgentFailed("no reward (nothing returned or printed, nothing posted)", output.details)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AgentFailed(f"the reward must be a number, got {value!r}", output.details)
    if not math.isfinite(value):
        raise AgentFailed(f"the reward is not finite ({value!r})", output.details)
    return check_reward_range(float(value), output.details), info


def check_reward_range(reward: float, details: str = "") -> float:
    """``reward`` if ``|reward| <= MAX_ABS_REWARD``, else :class:`AgentFailed` saying so."""
    if not abs(reward) <= MAX_ABS_REWARD:
        raise AgentFailed(
            f"the reward {reward!r} is outside the accepted range |reward| <= "
            f"{MAX_ABS_REWARD:g} (larger values overflow the advantages)",
            details,
        )
    return reward


# --------------------------------------------------------------------------- entrypoints


def load_entrypoint(spec: str) -> Callable[..., Any]:
    """The function an ``agent.entrypoint`` string names, checked to take ``(task, llm)``."""
    return load_callable(spec, "agent.entrypoint", arity=2)


def load_callable(spec: str, option: str, *, arity: int) -> Callable[..., Any]:
    """The function ``spec`` names, checked to accept ``arity`` positional arguments.

    ``"package.module:function"`` imports the module (the current directory is on
    the path); ``"path/to/file.py:function"`` loads that file. Raises
    :class:`AgentConfigError` naming ``option`` and what is wrong.
    """
    fn = load_object(spec, option, error=AgentConfigError)
    target, name = spec.strip().rsplit(":", 1)
    if not callable(fn):
        raise AgentConfigError(f"{option}: {target}:{name} is not callable")
    try:
        inspect.signature(fn).bind(*([object()] * arity))
    except TypeError as exc:
        what = "(task, llm)" if arity == 2 else f"{arity} positional arguments"
        raise AgentConfigError(f"{option}: {target}:{name} must accept {what}: {exc}") from None
    except ValueError:  # builtins without a signature: let the call decide
        pass
    return fn


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


# --------------------------------------------------------------------------- commands


def resolve_command(command: Sequence[str]) -> list[str]:
    """The argv to run: ``python``/``python3`` become this interpreter; any other program
    must exist, be executable and, for a script, have an interpreter that exists
    (:func:`check_program`), so a bad command is a config error before any work."""
    option = "agent.command"
    if not command or not all(isinstance(a, str) and a for a in command):
        raise AgentConfigError(f"{option}: expected a non-empty list of strings, got {command!r}")
    argv = list(command)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    else:
        check_program(argv[0], option)
    return argv


def check_program(program: str, option: str) -> str:
    """The file ``program`` runs (a path, or a name looked up on ``PATH``), checked to be
    an executable file whose ``#!`` interpreter (if any) exists; else
    :class:`AgentConfigError` naming ``option`` and what is wrong."""
    if os.sep in program:
        path = program
        if not os.path.exists(path):
            raise AgentConfigError(f"{option}: program {program!r} does not exist")
    else:
        found = shutil.which(program)
        if found is None:
            on_path = shutil.which(program, mode=os.F_OK)
            if on_path is not None:
                raise AgentConfigError(
                    f"{option}: program {program!r} ({on_path}) is not executable (chmod +x)"
                )
            raise AgentConfigError(f"{option}: program {program!r} not found (not on PATH)")
        path = found
    if not os.path.isfile(path):
        raise AgentConfigError(f"{option}: program {program!r} is not a file")
    if not os.access(path, os.X_OK) or not os.stat(path).st_mode & 0o111:
        raise AgentConfigError(f"{option}: program {program!r} is not executable (chmod +x)")
    interpreter = shebang_interpreter(path)
    if interpreter is not None and not _interpreter_exists(interpreter):
        raise AgentConfigError(
            f"{option}: program {program!r} names the interpreter {' '.join(interpreter)!r} "
            "in its #! line, which does not exist"
        )
    return path


def shebang_interpreter(path: str) -> list[str] | None:
    """The words of a script's ``#!`` line (``["/usr/bin/env", "python3"]``), or None."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    return line.split() or None


def _interpreter_exists(words: list[str]) -> bool:
    """Whether a ``#!`` line's program exists, and for ``env NAME`` whether ``NAME`` does."""
    program = words[0]
    if not (os.path.isfile(program) and os.access(program, os.X_OK)):
        return False
    if os.path.basename(program) == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        return not names or shutil.which(names[0]) is not None
    return True


def last_line_reward(stdout: str) -> Any:
    """The parsed last non-empty stdout line if it is a JSON object, else ``None``."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1], parse_constant=lambda name: float(name))
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class OutputTail:
    """The end of what a program wrote to one pipe."""

    text: str
    """The last ``limit`` bytes, decoded."""
    dropped: int
    """Bytes before them that were not kept."""

    def last_line_cut(self) -> bool:
        """Whether the last non-empty line began before what was kept (it is longer
        than the limit, so it cannot be read)."""
        body = self.text.rstrip("\r\n\t ")
        return self.dropped > 0 and bool(body) and "\n" not in body


async def _read_tail(stream: asyncio.StreamReader | None, limit: int) -> OutputTail:
    """Read a pipe to its end, keeping the last ``limit`` bytes."""
    if stream is None:
        return OutputTail("", 0)
    chunks: collections.deque[bytes] = collections.deque()
    size = total = 0
    while chunk := await stream.read(65536):
        chunks.append(chunk)
        size += len(chunk)
        total += len(chunk)
        while size - len(chunks[0]) >= limit:
            size -= len(chunks.popleft())
    kept = b"".join(chunks)[-limit:]
    return OutputTail(kept.decode("utf-8", errors="replace"), total - len(kept))


def kill_process_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (the command and everything it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class CommandProgram:
    """An agent run as a separate program, in its own process group, once per rollout."""

    def __init__(self, command: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        self.argv = resolve_command(command)
        self.extra_env = dict(env or {})
        self.description = f"command {' '.join(command)}"

    def environment(
        self, task: dict[str, Any], llm: LLM, task_file: str | None = None
    ) -> dict[str, str]:
        """The command's environment; ``task_file`` holds the task (``TURNRL_TASK_FILE``),
        ``TURNRL_TASK`` is set too when the task's JSON is small enough for one variable."""
        task_json = json.dumps(task, ensure_ascii=False)
        env = {
            **os.environ,
            **self.extra_env,
            **llm.env,
            "OPENAI_BASE_URL": llm.base_url,
            "OPENAI_API_KEY": llm.api_key,
            "OPENAI_MODEL": llm.model,
            "TURNRL_ROLLOUT_ID": llm.rollout_id,
            "TURNRL_REWARD_URL": llm.reward_url,
        }
        env.pop("TURNRL_TASK", None)
        if len(task_json.encode("utf-8")) <= TASK_ENV_MAX_BYTES:
            env["TURNRL_TASK"] = task_json
        if task_file is not None:
            env["TURNRL_TASK_FILE"] = task_file
        return env

    async def run(self, task: dict[str, Any], llm: LLM, timeout_s: float) -> AgentOutput:
        with task_file(task) as path:
            return await self._run(self.environment(task, llm, path), timeout_s)

    async def _run(self, env: dict[str, str], timeout_s: float) -> AgentOutput:
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group, killed as a whole
            )
        except OSError as exc:
            raise AgentFailed(f"could not start {self.argv[0]!r}: {exc}") from exc
        readers = [
            asyncio.ensure_future(_read_tail(process.stdout, OUTPUT_TAIL_BYTES)),
            asyncio.ensure_future(_read_tail(process.stderr, OUTPUT_TAIL_BYTES)),
        ]
        exit_code: int | None = None
        try:
            exit_code = await asyncio.wait_for(process.wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            # Always (timeout, cancellation, normal exit): the command and anything it
            # started go, then the pipes are read to their end.
            kill_process_group(process.pid)
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
            _done, pending = await asyncio.wait(readers, timeout=KILL_GRACE_S)
            for reader in pending:  # a grandchild that left the group holds a pipe open
                reader.cancel()
        out, err = (
            r.result() if r.done() and not r.cancelled() else OutputTail("", 0) for r in readers
        )
        stdout, stderr = out.text, err.text
        details = f"exit code {exit_code}\n--- stderr ---\n{stderr}\n--- stdout ---\n{stdout}"
        if exit_code is None:
            raise AgentFailed(f"timed out after {timeout_s:g} s (killed)", details)
        if exit_code != 0:
            last = stderr.strip().splitlines()[-1:] or ["(no stderr)"]
            raise AgentFailed(f"exited with code {exit_code}: {last[0][:200]}", details)
        value = last_line_reward(stdout)
        if value is None and out.last_line_cut():
            raise AgentFailed(
                f"the last line of stdout (the reward line) is too long: over "
                f"{OUTPUT_TAIL_BYTES} bytes, the most a reward line may have "
                f"({out.dropped + len(stdout.encode()):,} bytes of stdout in all)",
                f"exit code 0\n--- stderr ---\n{stderr}\n--- stdout (its end) ---\n"
                f"{stdout[-2000:]}",
            )
        return AgentOutput(
            value=value,
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            details=details,
        )


@contextlib.contextmanager
def task_file(task: dict[str, Any]) -> Iterator[str]:
    """A private temporary file holding ``task`` as JSON (removed afterwards)."""
    fd, path = tempfile.mkstemp(prefix="turnrl-task-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(task, handle, ensure_ascii=False)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def make_program(
    entrypoint: str | None, command: Sequence[str] | None, env: dict[str, str] | None = None
) -> AgentProgram:
    """The program an ``[agent]`` section describes: exactly one of entrypoint and command."""
    if (entrypoint is None) == (not command):
        raise AgentConfigError("[agent]: set exactly one of agent.entrypoint and agent.command")
    if entrypoint is not None:
        return EntrypointProgram(entrypoint)
    assert command is not None
    return CommandProgram(command, env=env)
