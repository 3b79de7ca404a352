"""``retention``: a subscriber calls to cancel; the agent may offer a discount to keep them.

Public: the plan's monthly price. ``<offer>D</offer>`` offers ``D`` percent off.
Hidden persona: ``threshold`` (the smallest discount that keeps them, 5-50%),
``ask`` (the discount they first hold out for, 15-40 points above the
threshold), concession ``rate``, ``patience`` (3-6 turns: every turn without a
deal costs one, since they want to leave), ``terse`` (says only "No." instead of
naming the discount it wants) and ``warns`` ("Last chance." on the final turn of
its patience).

Each offer moves the subscriber's ask toward it (never below the threshold); an
offer within 2 points of the new ask keeps them. ``<accept/>`` grants the standing
ask. Reward: ``1 - D/100`` if they stay (giving away more is worth less), 0 if
they cancel.

Inspired by textarena's TwoDollar secret roles (a hidden minimum to agree), turned
into a one-sided retention call with time pressure.
"""

from __future__ import annotations

import random
from typing import Any

from turnrl.envs.negotiation.actions import OfferFormat, single_issue
from turnrl.envs.negotiation.base import check_style, make_tasks, play
from turnrl.envs.negotiation.concession import Stance, Temper
from turnrl.envs.negotiation.scripted import Conceder
from turnrl.envs.negotiation.single import SingleIssueEnv
from turnrl.types import Message, Task

PLANS = ("music", "video", "news", "cloud", "gym", "games")


def _draw(rng: random.Random) -> dict[str, Any]:
    threshold = rng.randint(5, 50)
    persona = {
        "threshold": threshold,
        "ask": min(90, threshold + rng.randint(15, 40)),
        "rate": round(rng.uniform(0.2, 0.5), 3),
        "patience": rng.randint(3, 6),
        "terse": rng.random() < 0.4,
        "warns": rng.random() < 0.6,
    }
    return {"plan": rng.choice(PLANS), "monthly": rng.randrange(10, 51, 5), "persona": persona}


def retention_tasks(n: int, seed: int) -> list[Task]:
    """``n`` retention calls (plan, monthly price, hidden subscriber persona) from ``seed``."""
    return make_tasks("retention", n, seed, _draw)


class RetentionEnv(SingleIssueEnv):
    """Keep a subscriber: ``<offer>D</offer>`` (D% off), ``<accept/>`` their ask, ``<end/>``."""

    FORMAT: OfferFormat = single_issue("discount", 0, 100)
    issue = "discount"
    walkout_text = "Cancel it. Bye."

    def offer_format(self, task: Task) -> OfferFormat:
        return self.FORMAT

    def system_prompt(self, task: Task) -> str:
        p = task.payload
        return (
            f"Keep the {p['plan']} subscriber ({p['monthly']}/mo). {self.max_turns} turns. "
            "<offer>D</offer> = D% off. <accept/> <end/>"
        )

    def temper(self, task: Task) -> Temper:
        persona = self.persona(task)
        return Temper(
            reservation=float(persona["threshold"]),
            rate=persona["rate"],
            tolerance=2.0,
            time_patience=True,
        )

    def start(self, task: Task) -> Stance:
        persona = self.persona(task)
        return Stance(aspiration=float(persona["ask"]), patience=persona["patience"])

    def opening_text(self, task: Task, stance: Stance) -> str:
        return "I want to cancel."

    def utility(self, task: Task, number: float) -> float:
        return number

    def number(self, task: Task, utility: float) -> float:
        return utility

    def value(self, task: Task, number: float) -> float:
        return 1.0 - number / 100.0


_STYLES = {  # first offer, concession rate, accept-if-within, blind step
    "weak": (25, 0.7, 15, 15),
    "medium": (15, 0.6, 10, 12),
    "strong": (5, 0.5, 10, 12),
}


def agent(task: Task, max_turns: int, style: str = "medium") -> Conceder:
    """A scripted retention agent: start with a small discount, raise it toward the
    subscriber's stated ask (or by fixed steps when they do not say), accept the ask
    when close or at the deadline."""
    first, rate, close, step = _STYLES[check_style(style)]
    return Conceder(
        fmt=RetentionEnv.FORMAT,
        max_turns=max_turns,
        sign=-1,
        rate=rate,
        close=close,
        blind_step=step,
        low=0,
        high=100,
        anchor=first,
    )


def demonstration(task: Task, style: str = "medium", **env_kwargs: Any) -> list[Message]:
    """A full scripted retention call on ``task`` (observations from a real env)."""
    env = RetentionEnv(**env_kwargs)
    messages, _ = play(env, task, agent(task, env.max_turns, style))
    return messages
