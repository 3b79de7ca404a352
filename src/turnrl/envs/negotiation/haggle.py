"""``haggle``: the agent sells an item to a buyer with a hidden maximum price.

Public: the item, its list price ``L`` and the agent's cost ``c = 0.4 L``. The
buyer opens with a low bid. Hidden persona: ``reservation`` (most it pays,
0.6-1.0 ``L``), ``opening`` bid (0.45-0.7 of the reservation), concession
``rate``, ``patience`` (2-4 bad moves), ``greed_tolerance`` (an ask more than this
fraction above the reservation is an insult) and ``warns`` (says "Last chance."
when one bad move from leaving).

Each agent price moves the buyer's bid toward it by ``rate`` (capped at the
reservation); the buyer accepts a price within 2% of ``L`` of its new bid and never
above its reservation. Asking the same or more than last time, stalling, or an
insulting ask costs patience. Reward: ``(price - c) / (L - c)``, below 0 for a sale
under cost (clipped at -1), 0 without a deal.

Inspired by textarena's SimpleNegotiation (trading at private valuations) and
UsedCarNegotiation, reduced to one price and a scripted buyer.
"""

from __future__ import annotations

import random
from typing import Any

from turnrl.envs.negotiation.actions import OfferFormat, single_issue
from turnrl.envs.negotiation.base import check_style, make_tasks, play, public
from turnrl.envs.negotiation.concession import Stance, Temper
from turnrl.envs.negotiation.scripted import Conceder
from turnrl.envs.negotiation.single import SingleIssueEnv
from turnrl.types import Message, Task

ITEMS = ("lamp", "bike", "desk", "chair", "radio", "clock", "rug", "tent")
MAX_PRICE = 1000


def _draw(rng: random.Random) -> dict[str, Any]:
    list_price = rng.randrange(60, 201, 10)
    reservation = round(list_price * rng.uniform(0.6, 1.0))
    persona = {
        "reservation": reservation,
        "opening": round(reservation * rng.uniform(0.45, 0.7)),
        "rate": round(rng.uniform(0.25, 0.6), 3),
        "patience": rng.randint(2, 4),
        "greed_tolerance": round(rng.uniform(0.15, 0.4), 3),
        "warns": rng.random() < 0.5,
    }
    return {
        "item": rng.choice(ITEMS),
        "list_price": list_price,
        "cost": round(0.4 * list_price),
        "persona": persona,
    }


def haggle_tasks(n: int, seed: int) -> list[Task]:
    """``n`` haggle tasks (item, list price, cost, hidden buyer persona) from ``seed``."""
    return make_tasks("haggle", n, seed, _draw)


class HaggleEnv(SingleIssueEnv):
    """Sell one item: ``<offer>PRICE</offer>``, ``<accept/>`` the buyer's bid, ``<end/>``."""

    FORMAT: OfferFormat = single_issue("price", 0, MAX_PRICE)

    def offer_format(self, task: Task) -> OfferFormat:
        return self.FORMAT

    def system_prompt(self, task: Task) -> str:
        p = task.payload
        return (
            f"Sell a {p['item']}. Cost {p['cost']}, list {p['list_price']}. "
            f"{self.max_turns} turns. <offer>N</offer> <accept/> <end/>"
        )

    def temper(self, task: Task) -> Temper:
        persona = self.persona(task)
        reservation = float(persona["reservation"])
        return Temper(
            reservation=-reservation,
            rate=persona["rate"],
            tolerance=0.02 * task.payload["list_price"],
            insult=reservation * persona["greed_tolerance"],
            must_improve=True,
        )

    def start(self, task: Task) -> Stance:
        persona = self.persona(task)
        return Stance(aspiration=-float(persona["opening"]), patience=persona["patience"])

    def opening_text(self, task: Task, stance: Stance) -> str:
        return f"I'd pay {round(-stance.aspiration)}."

    def utility(self, task: Task, number: float) -> float:
        return -number

    def number(self, task: Task, utility: float) -> float:
        return -utility

    def value(self, task: Task, number: float) -> float:
        cost, list_price = task.payload["cost"], task.payload["list_price"]
        return max(-1.0, min(1.0, (number - cost) / (list_price - cost)))


_STYLES = {  # anchor (x opening bid), concession rate, accept-if-within (x list price)
    "weak": (1.15, 0.6, 0.1),
    "medium": (1.35, 0.4, 0.05),
    "strong": (1.6, 0.25, 0.02),
}


def agent(task: Task, max_turns: int, style: str = "medium") -> Conceder:
    """A scripted seller (public facts only): anchor at a multiple of the buyer's opening
    bid (capped at the list price), concede toward each counter, never below cost."""
    anchor, rate, close = _STYLES[check_style(style)]
    p = public(task)
    return Conceder(
        fmt=HaggleEnv.FORMAT,
        max_turns=max_turns,
        sign=1,
        rate=rate,
        close=close * p["list_price"],
        blind_step=0.1 * p["list_price"],
        low=p["cost"],
        high=p["list_price"],
        floor=p["cost"],
        anchor_factor=anchor,
    )


def demonstration(task: Task, style: str = "medium", **env_kwargs: Any) -> list[Message]:
    """A full scripted haggle on ``task`` (observations from a real :class:`HaggleEnv`)."""
    env = HaggleEnv(**env_kwargs)
    messages, _ = play(env, task, agent(task, env.max_turns, style))
    return messages
