"""``upsell``: sell add-ons to a customer with hidden valuations who tires of pitches.

Public: three add-ons and their list prices. ``<offer>case=20</offer>`` pitches one
add-on at a price, ``<offer>case=20;cable=5</offer>`` a bundle (judged on its
total). Hidden persona: a ``value`` per add-on (0 for about a quarter of them:
not wanted at any price; else 0.5-1.3 of list), a haggling ``band`` (a price up
to ``(1 + band)`` times the value gets a counter-offer instead of a refusal), a
counter ``factor`` (the counter-offer is ``factor`` times the value: accepting it
leaves money on the table), ``patience`` (2-4 refusals) and ``warns``.

The customer buys at the pitched price if it is within the value; counters if
within the band (``<accept/>`` buys at the counter, ``<reject/>`` drops it);
otherwise refuses, which annoys it. Pitching what it already has also annoys.
At ``patience`` annoyances it hangs up and cancels every add-on (value 0): so
pushing too many pitches is costly. ``<end/>``, buying everything, or running
out of turns closes the sale. Reward: revenue / the customer's total value of
all add-ons (1 = every wanted add-on sold at exactly its value).

Written in-repo (no textarena counterpart); the hidden valuations follow
textarena's SimpleNegotiation private resource values.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

from turnrl.envs.negotiation.actions import (
    ACCEPT,
    END,
    LAST_CHANCE,
    Accept,
    Action,
    End,
    Issue,
    Offer,
    OfferFormat,
    Reject,
    format_offer,
)
from turnrl.envs.negotiation.base import NegotiationEnv, Reply, check_style, make_tasks, play
from turnrl.envs.negotiation.scripted import last_number
from turnrl.envs.safe_math import format_number
from turnrl.types import Message, Task

CATALOGUE = ("case", "care", "cable", "setup", "bag", "ink", "stand", "cloud")
MAX_PRICE = 500


def _draw(rng: random.Random) -> dict[str, Any]:
    names = rng.sample(CATALOGUE, 3)
    items = {name: rng.randrange(10, 61, 5) for name in names}
    values = {name: 0 for name in names}
    while not any(values.values()):
        values = {
            name: 0 if rng.random() < 0.25 else round(price * rng.uniform(0.5, 1.3))
            for name, price in items.items()
        }
    persona = {
        "values": values,
        "band": round(rng.uniform(0.1, 0.35), 3),
        "factor": round(rng.uniform(0.75, 0.95), 3),
        "patience": rng.randint(2, 4),
        "warns": rng.random() < 0.5,
    }
    return {"items": items, "persona": persona}


def upsell_tasks(n: int, seed: int) -> list[Task]:
    """``n`` upsell calls (three add-ons with list prices, hidden customer) from ``seed``."""
    return make_tasks("upsell", n, seed, _draw)


@dataclass(frozen=True)
class _Customer:
    """What changed in the call: purchases, the standing counter-offer, annoyance."""

    bought: tuple[tuple[str, float], ...] = ()
    pending: tuple[tuple[str, ...], float] | None = None
    annoyance: int = 0

    def revenue(self) -> float:
        return sum(price for _, price in self.bought)


class UpsellEnv(NegotiationEnv):
    """Pitch add-ons: ``<offer>item=P</offer>``; ``<accept/>`` or ``<reject/>`` a counter."""

    def offer_format(self, task: Task) -> OfferFormat:
        return OfferFormat(tuple(Issue(name, 0, MAX_PRICE) for name in task.payload["items"]))

    def system_prompt(self, task: Task) -> str:
        listing = ", ".join(f"{k} {v}" for k, v in task.payload["items"].items())
        return (
            f"Sell add-ons: {listing}. {self.max_turns} turns. "
            "<offer>item=P</offer> <accept/> <reject/> <end/>"
        )

    def open(self, task: Task) -> tuple[_Customer, str]:
        return _Customer(), "Just the phone, thanks."

    def _value(self, task: Task, customer: _Customer) -> float:
        return customer.revenue() / sum(task.payload["persona"]["values"].values())

    def _close(self, task: Task, customer: _Customer, text: str, outcome: str) -> Reply:
        value = self._value(task, customer)
        return Reply(text, customer, outcome=outcome, value=value, deal=value > 0)

    def _buy(self, task: Task, customer: _Customer, purchase: dict[str, float]) -> Reply:
        bought = tuple(sorted((*customer.bought, *purchase.items())))
        customer = replace(customer, bought=bought, pending=None)
        if len(bought) == len(task.payload["items"]):
            return self._close(task, customer, "That's all. Bye.", "deal")
        return Reply("Added.", customer)

    def on_timeout(self, task: Task, counterpart: Any) -> tuple[float, bool]:
        value = self._value(task, counterpart)
        return value, value > 0

    def respond(self, task: Task, counterpart: Any, action: Action, turn: int) -> Reply:
        customer: _Customer = counterpart
        persona = task.payload["persona"]
        if isinstance(action, End):
            return self._close(task, customer, "Thanks. Bye.", "ended")
        if isinstance(action, Accept | Reject):
            if customer.pending is None:
                return Reply("Nothing to answer.", customer, invalid="no counter-offer to answer")
            if isinstance(action, Reject):
                return Reply("OK.", replace(customer, pending=None))
            items, price = customer.pending
            share = price / len(items)  # a bundle's counter price, split evenly
            return self._buy(task, customer, {item: share for item in items})
        if not isinstance(action, Offer):  # Say
            return Reply("Hm.", customer)
        terms = action.as_dict()
        owned = {item for item, _ in customer.bought}
        values = [persona["values"][item] for item in terms]
        worth, total = sum(values), sum(terms.values())
        if not owned & set(terms) and all(values):
            if total <= worth:
                return self._buy(task, customer, terms)
            if total <= (1 + persona["band"]) * worth:
                counter = float(math.floor(persona["factor"] * worth))
                pending = (tuple(sorted(terms)), counter)
                head = self._head(persona, customer.annoyance)
                return Reply(
                    f"{head} {format_number(counter)}?",
                    replace(customer, pending=pending),
                    info={"counter": counter},
                )
        annoyance = customer.annoyance + 1
        customer = replace(customer, pending=None, annoyance=annoyance)
        if annoyance >= persona["patience"]:
            return Reply("Enough. Cancel all.", customer, outcome="walkout")
        return Reply(self._head(persona, annoyance), customer)

    @staticmethod
    def _head(persona: dict[str, Any], annoyance: int) -> str:
        return LAST_CHANCE if persona["warns"] and annoyance == persona["patience"] - 1 else "No."


# ----------------------------------------------------------------------------- demo

_STYLES = {  # pitch price (x list), re-pitch after a counter (x counter) or None
    "weak": (1.0, None),
    "medium": (0.8, None),
    "strong": (0.65, 1.15),
}


@dataclass
class UpsellAgent:
    """Scripted seller: pitch each add-on once at a multiple of its list price; on a
    counter either accept it or (``repitch``) ask a little above it once, then accept;
    move on after a refusal; stop when warned or out of add-ons."""

    items: dict[str, int]
    fmt: OfferFormat
    markup: float
    repitch: float | None
    queue: list[str] | None = None
    current: str | None = None
    repitched: bool = False

    def __call__(self, message: str) -> str:
        if self.queue is None:
            self.queue = list(self.items)
        if message.startswith(LAST_CHANCE):
            return END
        counter = last_number(message) if message.endswith("?") else None
        if counter is not None and self.current is not None:
            if self.repitch is not None and not self.repitched:
                self.repitched = True
                return self._pitch(counter * self.repitch)
            return ACCEPT
        if not self.queue:
            return END
        self.current, self.repitched = self.queue.pop(0), False
        return self._pitch(self.items[self.current] * self.markup)

    def _pitch(self, price: float) -> str:
        assert self.current is not None
        return format_offer({self.current: max(1, round(price))}, self.fmt)


def agent(task: Task, max_turns: int, style: str = "medium") -> UpsellAgent:
    """The scripted seller for ``task`` (knows only the add-ons and their list prices)."""
    markup, repitch = _STYLES[check_style(style)]
    del max_turns  # this strategy does not plan for the deadline
    fmt = UpsellEnv().offer_format(task)
    return UpsellAgent(dict(task.payload["items"]), fmt, markup, repitch)


def demonstration(task: Task, style: str = "medium", **env_kwargs: Any) -> list[Message]:
    """A full scripted upsell call on ``task`` (observations from a real env)."""
    env = UpsellEnv(**env_kwargs)
    messages, _ = play(env, task, agent(task, env.max_turns, style))
    return messages
