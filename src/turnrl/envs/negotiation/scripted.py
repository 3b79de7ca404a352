"""Scripted agents for demonstrations (supervised warm start), using public facts only.

A scripted agent sees what a policy would see (the rules and the counterpart's
messages) and never the hidden persona, so a model can learn to imitate it.
:class:`Conceder` is the classic one-number strategy: anchor, concede a fraction of
the gap to the counterpart's counter-offer each turn, accept once the counter is
close to (or at least as good as) the next concession, or at the deadline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from turnrl.envs.negotiation.actions import (
    ACCEPT,
    LAST_CHANCE,
    Offer,
    OfferFormat,
    format_offer,
    parse_offer_body,
)

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_TERMS = re.compile(r"[a-z_]+=[\d.]+(?:;[a-z_]+=[\d.]+)*")


def last_number(message: str) -> float | None:
    """The last number in a counterpart message (its counter-offer), if any.

    ``Invalid: ...`` messages carry no offer and give ``None``.
    """
    if message.startswith("Invalid"):
        return None
    found = _NUMBER.findall(message)
    return float(found[-1]) if found else None


def last_terms(message: str, fmt: OfferFormat) -> Offer | None:
    """The last ``key=value;...`` offer body in a counterpart message, parsed, if any."""
    found = _TERMS.findall(message)
    offer = parse_offer_body(found[-1], fmt) if found else None
    return offer if isinstance(offer, Offer) else None


@dataclass
class Conceder:
    """Anchor-and-concede on one number, in the agent's own value terms.

    ``sign`` maps offer numbers to agent value (``+1``: the number is what the agent
    gets, e.g. a price; ``-1``: what the counterpart gets, e.g. a discount).
    ``anchor``: first offer, or ``None`` to compute it from the opening counter as
    ``opening * anchor_factor`` (offer-number terms). ``rate``: fraction of the gap
    to the counter conceded per turn. ``close``: accept when the counter is within
    this of the next offer. ``blind_step``: concession per turn when the counterpart
    names no number. ``floor``: never accept or offer worse than this agent value.
    ``low``/``high``: the offer range. Stateful: one instance per episode.
    """

    fmt: OfferFormat
    max_turns: int
    sign: int
    rate: float
    close: float
    blind_step: float
    low: float
    high: float
    floor: float = float("-inf")
    anchor: float | None = None
    anchor_factor: float = 1.0
    turn: int = 0
    mine: float | None = None
    previous_counter: float | None = None

    def __call__(self, message: str) -> str:
        counter = last_number(message)
        turn, self.turn = self.turn, self.turn + 1
        last = turn == self.max_turns - 1 or message.startswith(LAST_CHANCE)
        plateau = counter is not None and counter == self.previous_counter
        self.previous_counter = counter
        if self.mine is None:
            if self.anchor is not None:
                return self._offer(self.anchor)
            return self._offer((counter or 0.0) * self.anchor_factor)
        if counter is None:  # no number named: concede blindly, more at the deadline
            step = self.blind_step * (2 if last else 1)
            return self._offer(self.sign * (self.sign * self.mine - step))
        value = self.sign * counter
        target = self._next_value(value)
        if value >= self.floor and (last or plateau or value >= target - self.close):
            return ACCEPT
        return self._offer(self.sign * target)

    def _next_value(self, counter_value: float) -> float:
        assert self.mine is not None
        mine = self.sign * self.mine
        return max(self.floor, mine - self.rate * max(0.0, mine - counter_value))

    def _offer(self, number: float) -> str:
        number = float(round(min(self.high, max(self.low, number))))
        if self.mine is not None and number == self.mine:  # always move: stalling costs
            number = min(self.high, max(self.low, number - self.sign))
        self.mine = number
        return format_offer(number, self.fmt)
