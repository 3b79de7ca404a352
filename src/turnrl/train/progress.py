"""Progress of a run's phases (warm start, steps): a rich bar on a terminal, plain lines
otherwise.

A rich ``Progress`` on a stdout that is not a terminal (a batch job's log file, a pipe)
prints nothing until it stops, so a redirected log stayed empty for the whole warm
start. :class:`PlainProgress` has the part of rich's interface the trainers use
(``add_task``, ``update``, the ``with`` block) and prints one flushed line when a phase
starts, one per step, and one when the phase ends::

    warm start: 0/40
    warm start 1/40 (0.9s): warm start  loss 2.310
    ...
    warm start: done, 40/40 in 36.2s
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO


@dataclass
class _Phase:
    description: str
    total: float | None
    completed: float
    started: float = field(default_factory=time.perf_counter)


class PlainProgress:
    """Rich's ``Progress`` as plain log lines (see the module docstring); silent when
    ``disable``."""

    def __init__(self, *, disable: bool = False, stream: TextIO | None = None) -> None:
        self.disable = disable
        self.stream = stream
        self._phases: list[_Phase] = []

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            return
        for phase in self._phases:
            self._print(
                f"{phase.description}: done, {self._count(phase)} in {self._elapsed(phase)}"
            )

    def add_task(
        self, description: str, total: float | None = None, completed: float = 0, **_: Any
    ) -> int:
        """Start a phase; prints its name and where it starts."""
        phase = _Phase(description, total, completed)
        self._phases.append(phase)
        self._print(f"{description}: {self._count(phase)}")
        return len(self._phases) - 1

    def update(
        self,
        task_id: int,
        *,
        advance: float = 0,
        completed: float | None = None,
        description: str | None = None,
        **_: Any,
    ) -> None:
        """One step of a phase; prints the count, the time and the step's description."""
        phase = self._phases[task_id]
        phase.completed = completed if completed is not None else phase.completed + advance
        name = phase.description
        line = f"{name} {self._count(phase)} ({self._elapsed(phase)})"
        self._print(f"{line}: {description}" if description else line)

    @staticmethod
    def _count(phase: _Phase) -> str:
        done = f"{phase.completed:g}"
        return f"{done}/{phase.total:g}" if phase.total is not None else done

    @staticmethod
    def _elapsed(phase: _Phase) -> str:
        return f"{time.perf_counter() - phase.started:.1f}s"

    def _print(self, line: str) -> None:
        if not self.disable:
            print(line, file=self.stream or sys.stdout, flush=True)


def progress_display(*, disable: bool) -> Any:
    """A rich progress bar when stdout is a terminal, else :class:`PlainProgress`."""
    if not sys.stdout.isatty():
        return PlainProgress(disable=disable)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=disable,
        transient=False,
    )
