"""Command programs: any program, run in its own process group once per rollout.

``command = ["python", "my_agent.py"]``: killed as a whole when it times out or
finishes. Its environment has ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
``OPENAI_MODEL`` (which the official clients read), ``TURNRL_TASK_FILE`` (a file
holding the task as JSON), ``TURNRL_TASK`` (the same JSON, only when it is at
most :data:`TASK_ENV_MAX_BYTES`: larger values do not fit in one environment
variable on Linux), ``TURNRL_ROLLOUT_ID``, ``TURNRL_REWARD_URL``, and Agent
Lightning's ``AGL_OPENAI_BASE_URL``, ``AGL_EVENT_URL`` and ``AGL_KEY`` (so its
published agents run unchanged). It reports its reward as the last line of
stdout (``{"reward": x}``, optionally with ``"info"``), or by POSTing
``{"reward": x}`` to ``TURNRL_REWARD_URL``; a last line over
:data:`OUTPUT_TAIL_BYTES` is reported as too long. A command whose first word is
``python`` or ``python3`` runs with the interpreter turnrl runs in; any other
program is checked before any work (it exists, is executable, its ``#!``
interpreter exists).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from turnrl.train.agent.contract import LLM, AgentConfigError, AgentFailed, AgentOutput
from turnrl.train.agent.isolation import choose_isolation, namespace_prefix
from turnrl.train.process_tree import die_with_parent, watchdog_environment

OUTPUT_TAIL_BYTES = 64 * 1024
"""How much of a command's stdout and stderr is kept (the end of each); also the
longest reward line a command may print."""
TASK_ENV_MAX_BYTES = 64 * 1024
"""The largest task JSON also handed over in ``TURNRL_TASK`` (Linux refuses a single
environment string over 128 KiB with "Argument list too long"); ``TURNRL_TASK_FILE``
always holds it."""
KILL_GRACE_S = 2.0
"""How long to wait for a killed command's pipes to close before giving up on them."""


ROLLOUT_UID_BASE = 1_500_000_000
ROLLOUT_UID_SPAN = 500_000_000
"""``agent.isolation = "user"`` draws a run's first uid in ``[BASE, BASE + SPAN)`` and
counts up: far above any account (Linux uids go to 2**32 - 2), distinct per rollout."""


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


def files_needed(argv: Sequence[str]) -> list[str]:
    """The files a fresh uid must read to run ``argv`` (``agent.isolation = "user"``):
    the program and its ``#!`` interpreter; this Python's standard library and
    site-packages when the program is this interpreter; each argument that names an
    existing file."""
    program = shutil.which(argv[0]) or argv[0]
    paths = [program]
    interpreter = shebang_interpreter(program)
    if interpreter is not None:
        paths.append(interpreter[0])
    if os.path.realpath(program) == os.path.realpath(sys.executable):
        paths += [sysconfig.get_path("stdlib"), sysconfig.get_path("purelib")]
    paths += [a for a in argv[1:] if os.path.isfile(a)]
    return [os.path.realpath(p) for p in paths]  # a link's target: what is out of reach


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
    """An agent run as a separate program, in its own process group, once per rollout.

    It dies with the trainer, whatever kills it: ``PR_SET_PDEATHSIG`` for the command
    itself, the batch's watchdog for what it starts
    (:func:`~turnrl.train.process_tree.agent_watchdog`). In namespaces the process
    started is ``unshare``, which SIGKILLs the command when it dies (``--kill-child``),
    and the command is PID 1 of its namespace: the kernel kills everything in it when
    the command ends.

    ``isolation`` (``agent.isolation``, :mod:`turnrl.train.agent.isolation`) keeps a
    sibling from reading its environment (``/proc/PID/environ``, which holds its reward
    URL and secret): ``"namespaces"`` runs each rollout's command in user, PID and
    mount namespaces of its own (its siblings have no PID it can see);
    ``"user"`` (the trainer is root) as a uid of its own that no other rollout of the
    run has had, in a private working directory; ``"auto"`` picks the first that
    works here. With ``"none"`` commands run as the trainer's user, and any of them
    can read a sibling's environment (docs/agents.md, "What an agent can reach").
    """

    spawns_processes = True
    """The runner starts a watchdog for the batch (:class:`AgentRunner`)."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        isolation: str = "auto",
    ) -> None:
        self.argv = resolve_command(command)
        self.extra_env = dict(env or {})
        self.description = f"command {' '.join(command)}"
        self.isolation = choose_isolation(isolation, files_needed(self.argv))
        """How rollouts are kept apart here: ``"namespaces"``, ``"user"`` or ``"none"``."""
        self._next_uid = ROLLOUT_UID_BASE + secrets.randbelow(ROLLOUT_UID_SPAN)

    def _rollout_uid(self) -> int | None:
        """A uid no other rollout of this run has had, or None (not ``"user"``)."""
        if self.isolation != "user":
            return None
        self._next_uid += 1
        return self._next_uid

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
            **watchdog_environment(),
        }
        env.pop("TURNRL_TASK", None)
        if len(task_json.encode("utf-8")) <= TASK_ENV_MAX_BYTES:
            env["TURNRL_TASK"] = task_json
        if task_file is not None:
            env["TURNRL_TASK_FILE"] = task_file
        return env

    async def run(self, task: dict[str, Any], llm: LLM, timeout_s: float) -> AgentOutput:
        uid = self._rollout_uid()
        with task_file(task, uid) as path, home_of(uid) as home:
            env = self.environment(task, llm, path)
            if home is not None:
                env.update(HOME=home, TMPDIR=home)
            return await self._run(env, timeout_s, uid, home)

    async def _run(
        self,
        env: dict[str, str],
        timeout_s: float,
        uid: int | None = None,
        cwd: str | None = None,
    ) -> AgentOutput:
        prefix = namespace_prefix() if self.isolation == "namespaces" else []
        try:
            process = await asyncio.create_subprocess_exec(
                *prefix,
                *self.argv,
                env=env,
                cwd=cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group, killed as a whole
                preexec_fn=functools.partial(die_with_parent, os.getpid(), uid),
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
def task_file(task: dict[str, Any], uid: int | None = None) -> Iterator[str]:
    """A private temporary file holding ``task`` as JSON (removed afterwards); owned by
    ``uid`` when the rollout runs as a user of its own."""
    fd, path = tempfile.mkstemp(prefix="turnrl-task-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(task, handle, ensure_ascii=False)
        if uid is not None:
            os.chown(path, uid, uid)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


@contextlib.contextmanager
def home_of(uid: int | None) -> Iterator[str | None]:
    """A private working directory (also ``HOME`` and ``TMPDIR``) owned by ``uid`` for
    one rollout, removed afterwards; None without a uid (the command runs where the
    trainer does)."""
    if uid is None:
        yield None
        return
    home = tempfile.mkdtemp(prefix="turnrl-agent-")
    try:
        os.chown(home, uid, uid)
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)
