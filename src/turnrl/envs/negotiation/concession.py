"""A scripted counterpart's concession model, shared by the one-number settings.

Everything is in the counterpart's own utility units, where *higher is better for
the counterpart* (a buyer's utility of a price is minus the price; a subscriber's
utility of a discount is the discount; a partner's utility of a split is its
share). The counterpart holds an *aspiration*: what it currently demands.

On each agent offer ``x`` (its utility to the counterpart):

1. The aspiration moves toward ``x`` by the persona's ``rate`` (never up, never
   below the ``reservation``), and optionally down to a deadline schedule:
   ``a' = max(reservation, min(a - rate * max(0, a - x), schedule))``.
   A higher anchor by the agent therefore gets a better counter-offer.
2. The offer is accepted iff ``x >= reservation`` and ``x >= a' - tolerance``:
   nothing below the reservation is ever accepted, and acceptance is monotone in
   ``x`` (a better offer is accepted whenever a worse one is).
3. Otherwise an *insult* (``x < reservation - insult``) or, when ``must_improve``,
   an offer no better than the agent's previous one costs one patience; at zero
   patience the counterpart walks away. ``time_patience`` instead charges every
   unaccepted turn (a subscriber who wants to leave).

Stalls (``<reject/>``, ``<say>``) cost patience when ``must_improve`` or
``time_patience`` and move the aspiration only along the schedule.

All state is a frozen dataclass, so snapshots of an environment are free.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class Verdict(Enum):
    """What the counterpart does with an offer; ordered from worst to best for a deal."""

    WALKOUT = 0
    COUNTER = 1
    ACCEPT = 2


@dataclass(frozen=True)
class Temper:
    """A persona's fixed negotiation parameters (hidden from the agent)."""

    reservation: float
    """Lowest utility the counterpart ever accepts."""
    rate: float
    """Fraction of the gap to the agent's offer conceded per offer, in [0, 1]."""
    tolerance: float = 0.0
    """Accept offers this close below the aspiration (closes near-converged haggles)."""
    insult: float = float("inf")
    """An offer more than this below the reservation costs patience."""
    must_improve: bool = False
    """An offer no better than the agent's previous one (or a stall) costs patience."""
    time_patience: bool = False
    """Every turn without a deal costs patience (instead of only bad moves)."""


@dataclass(frozen=True)
class Stance:
    """The counterpart's changing position."""

    aspiration: float
    patience: int
    last_offer: float | None = None
    """Utility of the agent's previous offer (``None`` before the first)."""


def react(
    stance: Stance, temper: Temper, offered: float, schedule: float | None = None
) -> tuple[Stance, Verdict]:
    """The counterpart's new stance and verdict on an offer of utility ``offered``."""
    aspiration = stance.aspiration - temper.rate * max(0.0, stance.aspiration - offered)
    if schedule is not None:
        aspiration = min(aspiration, schedule)
    aspiration = max(temper.reservation, aspiration)
    moved = replace(stance, aspiration=aspiration, last_offer=offered)
    if offered >= temper.reservation and offered >= aspiration - temper.tolerance:
        return moved, Verdict.ACCEPT
    stalled = stance.last_offer is not None and offered <= stance.last_offer
    bad = (
        temper.time_patience
        or offered < temper.reservation - temper.insult
        or (temper.must_improve and stalled)
    )
    return _spend(moved, bad)


def stall(stance: Stance, temper: Temper, schedule: float | None = None) -> tuple[Stance, Verdict]:
    """The counterpart's reaction to a turn without an offer."""
    aspiration = stance.aspiration if schedule is None else min(stance.aspiration, schedule)
    moved = replace(stance, aspiration=max(temper.reservation, aspiration))
    return _spend(moved, temper.must_improve or temper.time_patience)


def _spend(stance: Stance, bad: bool) -> tuple[Stance, Verdict]:
    if not bad:
        return stance, Verdict.COUNTER
    stance = replace(stance, patience=stance.patience - 1)
    return stance, Verdict.WALKOUT if stance.patience <= 0 else Verdict.COUNTER


def deadline_schedule(
    start: float, floor: float, turns_taken: int, horizon: int, shape: float
) -> float:
    """Aspiration cap after ``turns_taken`` of ``horizon`` turns: ``start`` down to ``floor``.

    ``floor + (start - floor) * (1 - (turns_taken / horizon) ** shape)``: ``shape > 1``
    holds out until late (Boulware), ``shape < 1`` concedes early (conceder). At the
    deadline the cap is the floor: the counterpart takes its minimum rather than nothing.
    """
    progress = min(1.0, max(0.0, turns_taken / max(1, horizon)))
    return floor + (start - floor) * (1.0 - progress**shape)
