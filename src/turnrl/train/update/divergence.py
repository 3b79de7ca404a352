"""A diverged update stops the run before it poisons the weights or a checkpoint.

A learning rate far too large (``train.lr = 1e308``) makes the first Adam step move
every weight by about ``lr``: the weights overflow to infinity, the next forward gives
a NaN loss and NaN gradients, and an optimiser step on those would write NaN into
every tensor, which the next checkpoint would then save. So every optimiser step of
the PPO update (:func:`turnrl.train.update.ppo.ppo_update`) and of the supervised warm
start (:func:`turnrl.train.update.sft.supervised_warm_start`) is checked first: a
non-finite loss or gradient norm refuses the step (the weights stay as they were), and
after the last step of an update the weights themselves must be finite (a finite
gradient times a huge learning rate still overflows them) and, in the PPO update, give
a finite forward (weights near 1e30 are finite, but overflow the first product). The error is a
:class:`~turnrl.errors.TurnrlError` (one line, exit code 2); the run's last checkpoint
is the one saved before the diverged step, and is finite: the step's own checkpoint is
never written, because the error stops the run inside the step.

:class:`turnrl.train.lifecycle.Lifecycle` adds the run's step to the message
(:meth:`DivergedUpdateError.at_step`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from turnrl.errors import TurnrlError

if TYPE_CHECKING:  # the error loads without torch (the lifecycle imports it)
    import torch

__all__ = [
    "DivergedUpdateError",
    "check_finite_parameters",
    "check_finite_step",
    "non_finite_parameters",
]


class DivergedUpdateError(TurnrlError, FloatingPointError):
    """An update's loss, gradient or weights are not finite: the update is refused."""

    def __init__(self, problem: str, step: int | None = None) -> None:
        self.problem = problem
        self.step = step
        where = "" if step is None else f"step {step}: "
        kept = "" if step is None else f"; nothing of step {step} is saved"
        super().__init__(
            f"{where}{problem}: the update diverged (a learning rate far too large?) and "
            f"was not applied{kept}"
        )

    def at_step(self, step: int) -> DivergedUpdateError:
        """The same error naming the run's ``step`` (unless it names one already)."""
        return self if self.step is not None else DivergedUpdateError(self.problem, step)

    def __reduce__(self):  # keep the fields when pickled (Ray, multiprocessing)
        return (type(self), (self.problem, self.step))


def check_finite_step(loss: float, grad_norm: float, where: str) -> None:
    """Refuse an optimiser step whose ``loss`` or gradient norm is not finite (a NaN in
    any gradient makes the norm NaN); ``where`` names the step in the update."""
    for name, value in (("loss", loss), ("gradient norm", grad_norm)):
        if not math.isfinite(value):
            raise DivergedUpdateError(f"the {name} of {where} is {value!r}")


def non_finite_parameters(parameters: Iterable[torch.Tensor]) -> int:
    """How many of ``parameters`` hold a non-finite value (FSDP2 shards: this rank's)."""
    import torch

    bad = 0
    with torch.no_grad():
        for parameter in parameters:
            local = getattr(parameter, "to_local", None)
            tensor = local() if local is not None else parameter
            bad += int(not bool(torch.isfinite(tensor).all()))
    return bad


def check_finite_parameters(parameters: list[torch.Tensor], where: str, bad: int = -1) -> None:
    """Refuse weights that an update made non-finite; ``bad`` is the count when the
    caller computed it already (summed over ranks), else it is counted here."""
    count = non_finite_parameters(parameters) if bad < 0 else bad
    if count:
        raise DivergedUpdateError(
            f"{count} of {len(parameters)} weight tensors are not finite after {where}"
        )
