"""The order every training run goes through, owned in one place.

The three trainers (the environment trainer :class:`~turnrl.train.online.trainer.OnlineTrainer`
and its torchrun form, the agent loop :class:`~turnrl.train.agent.loop.AgentTrainer`,
Iterative GRPO :class:`~turnrl.train.iterate.loop.IterativeGRPO`) implement
:class:`Trainer`: their own algorithm, one step at a time. :class:`Lifecycle` runs
any of them the same way::

    checkpoint = run_directory.start()         # lock, config.toml, newest checkpoint
    done = trainer.setup(checkpoint)           # warm start, or the checkpoint's state
    if done == 0:
        append_metrics({"step": 0, **trainer.start_metrics()})   # the warm start's eval
    for step in done + 1 .. schedule.steps:    # (stop_after: a killed run, for tests)
        row = trainer.train_step(step)
        if eval due or last step: row |= trainer.evaluate()
        append_metrics(row)
        if checkpoint or export due, or last step: trainer.checkpoint()
        if export due: run_directory.export_policy(step)     # policy/step-N/
    trainer.finish()                           # only when the last step was reached:
                                               # the final policy as policy/
    report(run_dir)                            # only when the last step was reached
    ... and trainer.close() in any case (an error, a stop signal: ``finally``)

What stays in the trainer: building its policy, tasks and servers (seeded with
:func:`seed_process` before the policy is built), reading and writing its own
counters in a checkpoint, and what a step is. Under torchrun only rank 0 writes: the
other ranks' run directory (``online.ranks._RankRun``) writes nothing, so the
same order runs on every rank. Stop signals (SIGTERM, SIGINT) raise
:class:`~turnrl.train.stop_signals.RunInterrupted` inside :func:`stopping`, which the
CLI wraps around building the trainer and its lifecycle; the step in progress is
abandoned and ``close()`` still runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

from turnrl.train.run import Checkpoint, RunDirectory
from turnrl.train.schedule import Schedule, due
from turnrl.train.update.divergence import DivergedUpdateError

__all__ = ["Lifecycle", "LifecycleRun", "Schedule", "Trainer", "seed_process", "stopping"]


@runtime_checkable
class Trainer(Protocol):
    """What :class:`Lifecycle` needs of a trainer; each method is one phase of a run."""

    run_directory: RunDirectory
    """Where the run is written (opened, and so checked, when the trainer is built)."""

    @property
    def schedule(self) -> Schedule:
        """How many steps the run has, and how often it evaluates and checkpoints."""
        ...

    def setup(self, checkpoint: Checkpoint | None) -> int:
        """Start the run: a fresh warm start (``checkpoint`` None) or the state saved in
        ``checkpoint``; start whatever serves the steps. Returns the steps already done."""
        ...

    def start_metrics(self) -> dict[str, Any]:
        """The step-0 row's metrics of a fresh run: the warm start's evaluation."""
        ...

    def train_step(self, step: int) -> dict[str, Any]:
        """Run step ``step`` (the one after the last done); its metrics row with ``step``."""
        ...

    def evaluate(self) -> dict[str, float]:
        """The held-out evaluation of the current policy."""
        ...

    def checkpoint(self) -> None:
        """Save everything the step after the last finished one needs, atomically."""
        ...

    def describe(self, row: Mapping[str, Any]) -> str:
        """One progress line for a step's metrics row."""
        ...

    def finish(self) -> None:
        """Final outputs once the last step is done (not when a run stops early)."""
        ...

    def close(self) -> None:
        """Release what the trainer holds (servers, sockets, the run directory's lock).
        Called once whatever happened, also after a failed :meth:`setup`."""
        ...


@dataclass
class Lifecycle:
    """Runs a :class:`Trainer` from start (or resume) to its last step; see the module
    docstring for the order."""

    trainer: Trainer
    report: Callable[[Path], None] | None = None
    """Called with the run directory after the last step (the CLI's HTML report)."""

    def run(self, *, stop_after: int | None = None) -> Path:
        """Train to the schedule's last step and return the run directory.

        ``stop_after``: return after that many finished steps, as a killed run would
        (no :meth:`Trainer.finish`, no report); tests of resume use it."""
        trainer = self.trainer
        run = trainer.run_directory
        try:
            done = self.start()
            finished = self._steps(done, stop_after)
            if finished:
                trainer.finish()
        finally:
            trainer.close()
        if finished and self.report is not None:
            self.report(run.path)
        return run.path

    def start(self) -> int:
        """Start writing the run directory (lock, ``config.toml``, the newest checkpoint
        when resuming) and set the trainer up from it; the steps already done. :meth:`run`
        begins with it; benchmarks that drive steps themselves call it alone."""
        return self.trainer.setup(self.trainer.run_directory.start())

    def _steps(self, done: int, stop_after: int | None) -> bool:
        """The step-0 evaluation of a fresh run, then the steps after ``done``; whether
        the last step was reached."""
        trainer = self.trainer
        run = trainer.run_directory
        schedule = trainer.schedule
        if done == 0:
            run.append_metrics({"step": 0, **trainer.start_metrics()})
        with run.progress(enabled=schedule.progress_bar) as bar:
            task = bar.add_task(schedule.label, total=schedule.steps, completed=done)
            for step in range(done + 1, schedule.steps + 1):
                if stop_after is not None and step > stop_after:
                    return False
                try:
                    row = trainer.train_step(step)
                except DivergedUpdateError as err:
                    raise err.at_step(step) from None
                if schedule.evaluates(step):
                    row.update(trainer.evaluate())
                run.append_metrics(row)
                exports = due(step, run.export_every)
                if schedule.checkpoints(step) or exports:  # an export is made from one
                    trainer.checkpoint()
                if exports:
                    run.export_policy(step)
                if schedule.progress_bar:
                    bar.update(task, advance=1, description=trainer.describe(row))
                else:
                    run.log(trainer.describe(row))
        return True


class LifecycleRun:
    """What the three trainers share around :class:`Lifecycle`: ``run()`` and the
    phases most of them leave at their default (finishing exports the final policy;
    closing releases the run directory's lock). A trainer that holds more overrides
    :meth:`close`."""

    run_directory: RunDirectory
    schedule: Any

    def finish(self) -> None:
        """Export the last checkpoint's policy as ``policy/``, a Hugging Face model
        directory (:mod:`turnrl.train.export`)."""
        self.run_directory.export_policy(self.schedule.steps, final=True)

    def close(self) -> None:
        """Release the run directory's lock."""
        self.run_directory.close()

    def run(self, *, stop_after: int | None = None) -> Path:
        """Train to the schedule's last step through :class:`Lifecycle`; the run
        directory. ``stop_after`` returns after that many steps, as a killed run would
        (tests of resume use it)."""
        return Lifecycle(cast(Trainer, self)).run(stop_after=stop_after)


def seed_process(seed: int, threads: int) -> None:
    """Seed torch's global generator with the run's seed (and cap its CPU threads when
    ``threads`` > 0). A trainer calls it right before building its policy, which draws
    from that generator: every trainer's first random numbers come from here."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)


def resume_hint(run_dir: str | Path) -> str:
    """Where an interrupted run can be continued from."""
    from turnrl.train.checkpoint import list_checkpoints

    saved = list_checkpoints(run_dir)
    if not saved:
        return f"no checkpoint in {run_dir} yet: --resume starts it again"
    return f"last checkpoint: step {saved[-1][0]}; continue with --resume --run-dir {run_dir}"


@contextlib.contextmanager
def stopping(run_dir: str | Path) -> Iterator[None]:
    """Run the body with SIGTERM/SIGINT raising
    :class:`~turnrl.train.stop_signals.RunInterrupted` (processes started below are
    killed on the way out); the exception carries a note saying how to resume."""
    from turnrl.train.stop_signals import RunInterrupted, stopping_on_signals

    try:
        with stopping_on_signals():
            yield
    except RunInterrupted as stopped:
        stopped.add_note(resume_hint(run_dir))
        raise
