"""When a run evaluates and checkpoints: the step counts every trainer's lifecycle
follows (:mod:`turnrl.train.lifecycle`)."""

from __future__ import annotations

from dataclasses import dataclass


def due(step: int, every: int) -> bool:
    """Whether a periodic action (``every`` steps; 0 = never) falls on ``step``."""
    return every > 0 and step % every == 0


@dataclass(frozen=True)
class Schedule:
    """A run's steps and its periodic actions; the last step always evaluates and
    checkpoints, so a finished run ends with both."""

    steps: int
    """Steps of the whole run (a resumed run continues up to it)."""
    eval_every: int = 0
    """Evaluate after every this many steps (0: only after the last)."""
    checkpoint_every: int = 0
    """Checkpoint after every this many steps (0: only after the last)."""
    label: str = "RL"
    """The progress bar's name."""
    progress_bar: bool = True
    """Show a progress bar; False: one logged line per step instead."""

    def evaluates(self, step: int) -> bool:
        """Whether ``step`` ends with an evaluation."""
        return due(step, self.eval_every) or step == self.steps

    def checkpoints(self, step: int) -> bool:
        """Whether ``step`` ends with a checkpoint."""
        return due(step, self.checkpoint_every) or step == self.steps
