"""``multi_issue``: sell a contract on price (50-100) and term (1-12 months) at once.

``<offer>price=90;term=12</offer>``. The agent wants a high price and a long term
and is told its own weights (e.g. ``price 0.3, term 0.7``): its value of a deal
is ``w_price * (price-50)/50 + w_term * (term-1)/11`` in [0, 1]. The client wants
the opposite, with hidden weights that usually differ from the agent's (about
``1 - w_price``), so logrolling (give on the issue the client cares about, keep
the one you care about) pays more than splitting both down the middle.

Hidden persona: ``price_weight``, ``reservation`` (least client utility it signs
for, 0.3-0.55), opening ``aspiration`` (0.85-1.0), concession ``rate``,
``patience`` (2-4 bad moves: an offer worth less to it than the agent's previous
one, or worth 0.3 below its reservation) and ``warns``. The client's aspiration
moves toward each offer's utility (:mod:`.concession`), and its counter-offer is
the point of the price-step-5 grid that meets its aspiration and is closest to the
agent's offer: a counter-offer responds to *where* the agent offered, not only how
much. ``<accept/>`` signs the standing counter-offer. Reward: the agent's value of
the deal, 0 without one.

Inspired by textarena's NewRecruit (multi-issue with distributive, compatible and
integrative issues), cut down to two issues and a scripted client.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from turnrl.envs.negotiation.actions import (
    ACCEPT,
    LAST_CHANCE,
    Accept,
    Action,
    End,
    Issue,
    Offer,
    OfferFormat,
    format_offer,
    format_terms,
)
from turnrl.envs.negotiation.base import NegotiationEnv, Reply, check_style, make_tasks, play
from turnrl.envs.negotiation.concession import Stance, Temper, Verdict, react, stall
from turnrl.envs.negotiation.scripted import last_terms
from turnrl.types import Message, Task

PRICE = Issue("price", 50, 100)
TERM = Issue("term", 1, 12)
FORMAT = OfferFormat((PRICE, TERM), require_all=True)
GRID = tuple((p, t) for p in range(50, 101, 5) for t in range(1, 13))
"""The client's counter-offers lie on this grid (price step 5)."""

Deal = tuple[float, float]
"""``(price, term)``."""


def _scaled(deal: Deal) -> tuple[float, float]:
    """Price and term scaled to [0, 1] (1: best for the agent)."""
    price, term = deal
    span_price, span_term = PRICE.high - PRICE.low, TERM.high - TERM.low
    return (price - PRICE.low) / span_price, (term - TERM.low) / span_term


def agent_value(weights: tuple[float, float], deal: Deal) -> float:
    """The agent's value of a deal: its weighted scaled price and term."""
    p, t = _scaled(deal)
    return weights[0] * p + weights[1] * t


def client_utility(price_weight: float, deal: Deal) -> float:
    """The client's utility: low price and short term, weighted by its hidden weight."""
    p, t = _scaled(deal)
    return price_weight * (1 - p) + (1 - price_weight) * (1 - t)


def _draw(rng: random.Random) -> dict[str, Any]:
    w_price = round(rng.uniform(0.2, 0.8), 1)
    client_price = min(0.85, max(0.15, 1 - w_price + rng.uniform(-0.2, 0.2)))
    persona = {
        "price_weight": round(client_price, 3),
        "reservation": round(rng.uniform(0.3, 0.55), 3),
        "aspiration": round(rng.uniform(0.85, 1.0), 3),
        "rate": round(rng.uniform(0.2, 0.5), 3),
        "patience": rng.randint(2, 4),
        "warns": rng.random() < 0.5,
    }
    return {"weights": [w_price, round(1 - w_price, 1)], "persona": persona}


def multi_issue_tasks(n: int, seed: int) -> list[Task]:
    """``n`` contract negotiations (public agent weights, hidden client) from ``seed``."""
    return make_tasks("multi_issue", n, seed, _draw)


@dataclass(frozen=True)
class _Client:
    """The client's changing state: its stance and its standing counter-offer."""

    stance: Stance
    counter: Deal


class MultiIssueEnv(NegotiationEnv):
    """Negotiate price and term together; ``<accept/>`` signs the client's counter-offer."""

    def offer_format(self, task: Task) -> OfferFormat:
        return FORMAT

    def system_prompt(self, task: Task) -> str:
        w_price, w_term = task.payload["weights"]
        return (
            f"Contract: price 50-100, term 1-12; you weigh price {w_price:g}, "
            f"term {w_term:g}. {self.max_turns} turns. <offer>price=P;term=T</offer> "
            "<accept/> <end/>"
        )

    def _temper(self, task: Task) -> Temper:
        persona = task.payload["persona"]
        return Temper(
            reservation=persona["reservation"],
            rate=persona["rate"],
            tolerance=0.02,
            insult=0.3,
            must_improve=True,
        )

    def _counter(self, task: Task, aspiration: float, near: Deal) -> Deal:
        """The grid point the client proposes: meets ``aspiration``, closest to ``near``."""
        weight = task.payload["persona"]["price_weight"]
        ok = [d for d in GRID if client_utility(weight, d) >= aspiration - 1e-9]
        if not ok:  # aspiration above every grid point: its favourite deal
            return (PRICE.low, TERM.low)
        x, y = _scaled(near)

        def key(d: Deal) -> tuple[float, float]:
            dx, dy = _scaled(d)
            return ((dx - x) ** 2 + (dy - y) ** 2, -client_utility(weight, d))

        return min(ok, key=key)

    def open(self, task: Task) -> tuple[_Client, str]:
        persona = task.payload["persona"]
        stance = Stance(aspiration=persona["aspiration"], patience=persona["patience"])
        counter = self._counter(task, stance.aspiration, (PRICE.high, TERM.high))
        return _Client(stance, counter), f"I propose {self._terms(counter)}."

    def respond(self, task: Task, counterpart: Any, action: Action, turn: int) -> Reply:
        client: _Client = counterpart
        weights = tuple(task.payload["weights"])
        if isinstance(action, End):
            return Reply("Bye.", client, outcome="ended")
        if isinstance(action, Accept):
            value = agent_value(weights, client.counter)
            return Reply("Deal.", client, outcome="deal", value=value, deal=True)
        temper = self._temper(task)
        near = client.counter
        if isinstance(action, Offer):
            near = (action["price"], action["term"])
            utility = client_utility(task.payload["persona"]["price_weight"], near)
            stance, verdict = react(client.stance, temper, utility)
            if verdict is Verdict.ACCEPT:
                value = agent_value(weights, near)
                client = replace(client, stance=stance)
                return Reply("Deal.", client, outcome="deal", value=value, deal=True)
        else:
            stance, verdict = stall(client.stance, temper)
        if verdict is Verdict.WALKOUT:
            return Reply("No deal. Bye.", replace(client, stance=stance), outcome="walkout")
        counter = self._counter(task, stance.aspiration, near)
        warn = task.payload["persona"]["warns"] and stance.patience == 1
        text = f"{LAST_CHANCE if warn else 'No.'} {self._terms(counter)}?"
        info = {"counter": {"price": counter[0], "term": counter[1]}}
        return Reply(text, _Client(stance, counter), info=info)

    @staticmethod
    def _terms(deal: Deal) -> str:
        return format_terms({"price": deal[0], "term": deal[1]}, FORMAT)


# ----------------------------------------------------------------------------- demo

_STYLES = {  # concession rate on (less important, more important) issue, accept-if-within
    "weak": ((0.7, 0.7), 0.15),
    "medium": ((0.4, 0.4), 0.05),
    "strong": ((0.6, 0.1), 0.02),
}


@dataclass
class MultiIssueAgent:
    """Scripted seller: open at the best deal, concede on each issue toward the client's
    counter (``strong``: mostly on the issue the agent cares less about), accept the
    counter when it is worth about as much as the next concession, or at the deadline."""

    weights: tuple[float, float]
    max_turns: int
    rates: tuple[float, float]
    close: float
    turn: int = 0
    mine: Deal | None = None

    def __call__(self, message: str) -> str:
        turn, self.turn = self.turn, self.turn + 1
        last = turn == self.max_turns - 1 or message.startswith(LAST_CHANCE)
        counter = self._parse(message)
        if self.mine is None or counter is None:
            return self._offer(self.mine or (PRICE.high, TERM.high))
        # rate per issue: the lower-weighted issue gets the larger (first) rate
        minor = 0 if self.weights[0] < self.weights[1] else 1
        rate = [self.rates[1], self.rates[1]]
        rate[minor] = self.rates[0]
        mine = self.mine
        target = (
            mine[0] - rate[0] * max(0.0, mine[0] - counter[0]),
            mine[1] - rate[1] * max(0.0, mine[1] - counter[1]),
        )
        gain = agent_value(self.weights, counter) - agent_value(self.weights, target)
        if last or gain >= -self.close:
            return ACCEPT
        return self._offer(target)

    @staticmethod
    def _parse(message: str) -> Deal | None:
        offer = last_terms(message, FORMAT)
        return None if offer is None else (offer["price"], offer["term"])

    def _offer(self, deal: Deal) -> str:
        new = (float(round(deal[0])), float(round(deal[1])))
        if self.mine is not None and new == self.mine:  # always concede a little
            new = (max(PRICE.low, new[0] - 1), new[1])
        self.mine = new
        return format_offer({"price": new[0], "term": new[1]}, FORMAT)


def agent(task: Task, max_turns: int, style: str = "medium") -> MultiIssueAgent:
    """The scripted seller for ``task`` (knows only its own public weights)."""
    rates, close = _STYLES[check_style(style)]
    return MultiIssueAgent(tuple(task.payload["weights"]), max_turns, rates, close)


def demonstration(task: Task, style: str = "medium", **env_kwargs: Any) -> list[Message]:
    """A full scripted contract negotiation on ``task`` (observations from a real env)."""
    env = MultiIssueEnv(**env_kwargs)
    messages, _ = play(env, task, agent(task, env.max_turns, style))
    return messages
