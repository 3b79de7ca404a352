"""SIGTERM and SIGINT stop a training command cleanly.

``timeout``, SLURM and Kubernetes send SIGTERM; a user presses Ctrl-C (SIGINT).
Inside :func:`stopping_on_signals` either one raises :class:`RunInterrupted` in the
main thread, wherever it is: the step in progress is abandoned (its writes are
atomic, so nothing partial is kept; the next ``--resume`` redoes it from the last
checkpoint), the agent runner's event loop cancels its rollouts (killing each
command's process group), and on the way out every process started below the
trainer is killed (:mod:`turnrl.train.process_tree`). The command then prints one
line and exits with ``128 + signal`` (143 for SIGTERM, 130 for SIGINT), as a shell
reports a process killed by that signal. A second signal during the cleanup is
ignored.

A raise from a signal handler can be lost: where the signal lands inside a callback
whose exceptions Python only prints (``Exception ignored in ...``: logging's after-fork
hook, a finaliser), the body carries on as if nothing happened, and a run under
``timeout`` would never stop. The same happens where it lands while an asyncio task
runs that nobody awaits (the agent runner's pipe readers): asyncio keeps the exception
in the task, and the event loop goes back to waiting in its selector. So after the
first signal a watchdog thread sends it again to the main thread
(``signal.pthread_kill``) every :data:`RETRY_S` seconds until the cleanup starts. A real
signal is needed: it interrupts the selector's wait (``_thread.interrupt_main`` only
schedules the handler, which then runs when the loop next wakes, at the agents'
timeout: the stop of a run under ``timeout`` hung that long). Each repeat raises again,
unless a :class:`RunInterrupted` is already propagating (the handler sees it as the
exception being handled, or as the context of the one being handled), in which case the
repeat is ignored.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from turnrl.train.process_tree import descendants, kill_new_descendants, subreaper

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RETRY_S = 1.0
"""Seconds between repeats of a stop signal whose raise was lost (module docstring)."""


class RunInterrupted(BaseException):
    """A stop signal arrived (a ``BaseException``, as ``KeyboardInterrupt``: code that
    catches ``Exception`` must not swallow it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """Run the body with SIGTERM/SIGINT raising :class:`RunInterrupted` (main thread
    only; elsewhere the body runs unchanged), as a child subreaper, and kill every
    process started below this one when leaving."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with subreaper(), _raising_on_signals() as stopping:
        before = descendants()
        try:
            yield
        finally:
            stopping.append(0)  # a signal during the cleanup is ignored
            kill_new_descendants(before)


@contextlib.contextmanager
def _raising_on_signals() -> Iterator[list[int]]:
    """The first SIGTERM/SIGINT raises :class:`RunInterrupted`, later ones are ignored
    (as all are once anything is appended to the yielded list); the previous handlers
    are restored after."""
    fired: list[int] = []
    cleaning = threading.Event()
    watchdog: list[threading.Thread] = []

    def handler(signum: int, frame: Any) -> None:
        if 0 in fired:  # the cleanup has started (appended before `cleaning` is set)
            return
        if fired:
            if _unwinding():  # the first raise propagates: its cleanup runs on
                return
            raise RunInterrupted(fired[0])  # the first raise was lost: again
        fired.append(signum)
        # Every agent process is about to be killed on purpose; asyncio's child watcher
        # may then find one already reaped (by subprocess's own clean-up of the handles
        # the interrupted loop dropped) and warn "Unknown child process pid ...": noise
        # beside the one line the stop prints, so only asyncio's errors are shown now.
        logging.getLogger("asyncio").setLevel(logging.ERROR)
        watchdog.append(
            threading.Thread(
                target=_repeat_until, args=(cleaning, signum), name="stop-signal", daemon=True
            )
        )
        watchdog[0].start()
        raise RunInterrupted(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield fired
    finally:
        fired.append(0)
        cleaning.set()
        for thread in watchdog:
            thread.join()
        for _ in range(2):  # a repeat the watchdog made last is handled (ignored) here,
            pass  # at this loop's backward jump, while this module's handler is in place
        for s, old in previous.items():
            signal.signal(s, old)


def _unwinding() -> bool:
    """Whether the exception being handled here is a :class:`RunInterrupted` or was
    raised while one was (``__context__``: a task's ``CancelledError`` in the cleanup
    that the first stop started)."""
    exc: BaseException | None = sys.exc_info()[1]
    seen = 0
    while exc is not None and seen < 64:
        if isinstance(exc, RunInterrupted):
            return True
        exc, seen = exc.__context__, seen + 1
    return False


def _repeat_until(cleaning: threading.Event, signum: int) -> None:
    """Send ``signum`` to the main thread every :data:`RETRY_S` seconds until
    ``cleaning`` is set (the watchdog of the module docstring)."""
    main = threading.main_thread().ident
    assert main is not None
    while not cleaning.wait(RETRY_S):
        signal.pthread_kill(main, signum)
