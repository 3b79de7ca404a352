"""``ultimatum``: an iterated ultimatum game, one round per agent turn.

Each round the agent splits 100: ``<offer>N</offer>`` gives the responder ``N``
and keeps ``100 - N`` if it answers "Yes." (both get nothing on "No."). There
are ``max_turns`` rounds. Hidden persona: a fairness ``threshold`` (5-45, the
least it accepts), a ``grudge`` (its threshold rises by this after each offer it
rejects), ``anchoring`` (after accepting ``N`` its threshold moves this fraction
of the way up to ``N``: generosity raises expectations), ``quit_after``
(2-4 rejections, then it quits the game) and ``warns`` ("Last chance." instead of
"No." when one rejection from quitting).

So probing low is costly later (grudges, quitting) and so is being generous early
(anchoring): every round's decision matters. A malformed reply loses its round.
``<end/>`` stops playing. The reward, paid at the end, is the agent's total over
all rounds / (100 * rounds).

Inspired by textarena's IteratedUltimatumGame (same rules with the agent fixed as
proposer, offer = the responder's amount), with a scripted responder; see
:mod:`.textarena_adapter` for that game itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from turnrl.envs.negotiation.actions import (
    LAST_CHANCE,
    Action,
    End,
    Offer,
    OfferFormat,
    format_offer,
    single_issue,
)
from turnrl.envs.negotiation.base import NegotiationEnv, Reply, check_style, make_tasks, play
from turnrl.types import Message, Task

POT = 100


def _draw(rng: random.Random) -> dict[str, Any]:
    persona = {
        "threshold": rng.randint(5, 45),
        "grudge": rng.randint(0, 10),
        "anchoring": round(rng.uniform(0.0, 0.5), 3),
        "quit_after": rng.randint(2, 4),
        "warns": rng.random() < 0.5,
    }
    return {"pot": POT, "persona": persona}


def ultimatum_tasks(n: int, seed: int) -> list[Task]:
    """``n`` iterated-ultimatum games (hidden responder persona) from ``seed``."""
    return make_tasks("ultimatum", n, seed, _draw)


@dataclass(frozen=True)
class Responder:
    """The responder's changing state, and the agent's winnings so far."""

    threshold: float
    rejections: int = 0
    total: float = 0.0


def judge(persona: dict[str, Any], responder: Responder, share: float) -> tuple[Responder, bool]:
    """Whether the responder accepts ``share``, and its new state (pure function).

    Accepts iff ``share >= threshold``; then the threshold is pulled toward the share
    by ``anchoring`` and the agent banks ``POT - share``. On a rejection the
    threshold rises by ``grudge`` and the rejection is counted.
    """
    if share >= responder.threshold:
        threshold = responder.threshold + persona["anchoring"] * (share - responder.threshold)
        return replace(responder, threshold=threshold, total=responder.total + POT - share), True
    threshold = min(POT, responder.threshold + persona["grudge"])
    return replace(responder, threshold=threshold, rejections=responder.rejections + 1), False


class UltimatumEnv(NegotiationEnv):
    """Propose a split of 100 each round: ``<offer>N</offer>`` gives the responder N."""

    FORMAT: OfferFormat = single_issue("share", 0, POT)
    ends_at_max_turns = True

    def offer_format(self, task: Task) -> OfferFormat:
        return self.FORMAT

    def system_prompt(self, task: Task) -> str:
        return f"Split {POT}, {self.max_turns} rounds. <offer>N</offer> gives them N. <end/>"

    def open(self, task: Task) -> tuple[Responder, str]:
        return Responder(threshold=float(task.payload["persona"]["threshold"])), "Your offer?"

    def _value(self, responder: Responder) -> float:
        return responder.total / (POT * self.max_turns)

    def on_timeout(self, task: Task, counterpart: Any) -> tuple[float, bool]:
        return self._value(counterpart), counterpart.total > 0

    def respond(self, task: Task, counterpart: Any, action: Action, turn: int) -> Reply:
        responder: Responder = counterpart
        persona = task.payload["persona"]
        if isinstance(action, End):
            value = self._value(responder)
            return Reply("Bye.", responder, outcome="ended", value=value, deal=value > 0)
        if not isinstance(action, Offer):
            return Reply("Your offer?", responder, invalid="you propose: <offer>N</offer>")
        responder, accepted = judge(persona, responder, action["share"])
        if accepted:
            return Reply("Yes.", responder, info={"accepted": True})
        if responder.rejections >= persona["quit_after"]:
            value = self._value(responder)
            return Reply("No. I quit.", responder, outcome="walkout", value=value, deal=value > 0)
        warn = persona["warns"] and responder.rejections == persona["quit_after"] - 1
        return Reply(LAST_CHANCE if warn else "No.", responder, info={"accepted": False})


# ----------------------------------------------------------------------------- demo

_STYLES = {  # first offer, raise after a rejection
    "weak": (50, 10),
    "medium": (35, 10),
    "strong": (30, 20),
}


@dataclass
class UltimatumAgent:
    """Scripted proposer: offer ``first``; after each rejection offer ``raise_by`` more;
    repeat an accepted offer. (Probing lower after a "Yes." loses on average here:
    grudges and anchoring punish it.)"""

    first: float
    raise_by: float
    offer: float | None = None

    def __call__(self, message: str) -> str:
        if self.offer is None:
            self.offer = self.first
        elif message != "Yes.":  # a rejection or a warning
            self.offer = min(POT, self.offer + self.raise_by)
        return format_offer(round(self.offer), UltimatumEnv.FORMAT)


def agent(task: Task, max_turns: int, style: str = "medium") -> UltimatumAgent:
    """The scripted proposer (the game has no public facts beyond the rules)."""
    del task, max_turns
    return UltimatumAgent(*_STYLES[check_style(style)])


def demonstration(task: Task, style: str = "medium", **env_kwargs: Any) -> list[Message]:
    """A full scripted iterated ultimatum game on ``task`` (observations from a real env)."""
    env = UltimatumEnv(**env_kwargs)
    messages, _ = play(env, task, agent(task, env.max_turns, style))
    return messages
