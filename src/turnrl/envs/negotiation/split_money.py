"""``split_money``: split 100 with a partner who has a hidden minimum, before a deadline.

``<offer>N</offer>`` proposes that the partner gets ``N`` and the agent ``100 - N``.
After ``max_turns`` agent turns without agreement both get nothing. Hidden
persona: ``minimum`` (10-60, the least it agrees to, like TwoDollar's secret
"you must get at least $1.20" roles), ``demand`` (its opening ask), ``shape`` of
its deadline concession (above 1: holds out until late; below 1: concedes
early), ``rate`` of reciprocity (each offer pulls its demand toward the offer),
``patience`` (2-3 insults, offers below half its minimum, before it walks away)
and ``warns``.

The partner's demand is the lower of its reciprocal demand and its deadline
schedule, which reaches its minimum on the last turn: it would rather take its
minimum than nothing, and the agent knows the deadline too. Reward: the agent's
share / 100, 0 without a deal.

Inspired by textarena's TwoDollar (split $2.00 with secret role constraints and a
round limit), with a scripted partner.
"""

from __future__ import annotations

import random
from typing import Any

from turnrl.envs.negotiation.actions import OfferFormat, single_issue
from turnrl.envs.negotiation.base import check_style, make_tasks, play
from turnrl.envs.negotiation.concession import Stance, Temper, deadline_schedule
from turnrl.envs.negotiation.scripted import Conceder
from turnrl.envs.negotiation.single import SingleIssueEnv
from turnrl.types import Message, Task

POT = 100


def _draw(rng: random.Random) -> dict[str, Any]:
    minimum = rng.randint(10, 60)
    persona = {
        "minimum": minimum,
        "demand": rng.randint(max(minimum + 10, 55), 90),
        "shape": round(rng.uniform(0.5, 3.0), 3),
        "rate": round(rng.uniform(0.1, 0.4), 3),
        "patience": rng.randint(2, 3),
        "warns": rng.random() < 0.5,
    }
    return {"pot": POT, "persona": persona}


def split_money_tasks(n: int, seed: int) -> list[Task]:
    """``n`` split-the-money tasks (hidden partner persona) from ``seed``."""
    return make_tasks("split_money", n, seed, _draw)


class SplitMoneyEnv(SingleIssueEnv):
    """Split 100 before the deadline: ``<offer>N</offer>`` gives the partner N."""

    FORMAT: OfferFormat = single_issue("share", 0, POT)
    issue = "share"
    walkout_text = "Forget it."

    def offer_format(self, task: Task) -> OfferFormat:
        return self.FORMAT

    def system_prompt(self, task: Task) -> str:
        return (
            f"Split {POT}. <offer>N</offer> gives them N. {self.max_turns} turns, "
            "then both get 0. <accept/> <end/>"
        )

    def temper(self, task: Task) -> Temper:
        persona = self.persona(task)
        minimum = float(persona["minimum"])
        return Temper(reservation=minimum, rate=persona["rate"], tolerance=1.0, insult=minimum / 2)

    def schedule(self, task: Task, turns_taken: int) -> float | None:
        persona = self.persona(task)
        return deadline_schedule(
            float(persona["demand"]),
            float(persona["minimum"]),
            turns_taken,
            self.max_turns,
            persona["shape"],
        )

    def start(self, task: Task) -> Stance:
        persona = self.persona(task)
        return Stance(aspiration=float(persona["demand"]), patience=persona["patience"])

    def opening_text(self, task: Task, stance: Stance) -> str:
        return f"I want {round(stance.aspiration)}."

    def utility(self, task: Task, number: float) -> float:
        return number

    def number(self, task: Task, utility: float) -> float:
        return utility

    def value(self, task: Task, number: float) -> float:
        return (POT - number) / POT


_STYLES = {  # first offer (their share), concession rate, accept-if-within
    "weak": (45, 0.6, 12),
    "medium": (30, 0.4, 6),
    "strong": (25, 0.25, 2),
}


def agent(task: Task, max_turns: int, style: str = "medium") -> Conceder:
    """A scripted splitter: offer the partner a small share, concede toward its demand,
    take its demand when close or at the deadline."""
    first, rate, close = _STYLES[check_style(style)]
    return Conceder(
        fmt=SplitMoneyEnv.FORMAT,
        max_turns=max_turns,
        sign=-1,
        rate=rate,
        close=close,
        blind_step=10,
        low=0,
        high=POT,
        anchor=first,
    )


def demonstration(task: Task, style: str = "medium", **env_kwargs: Any) -> list[Message]:
    """A full scripted split on ``task`` (observations from a real env)."""
    env = SplitMoneyEnv(**env_kwargs)
    messages, _ = play(env, task, agent(task, env.max_turns, style))
    return messages
