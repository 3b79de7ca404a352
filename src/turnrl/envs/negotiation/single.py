"""One-number negotiations (a price, a discount, a share) on the shared concession model.

:class:`SingleIssueEnv` maps the agent's offer number to the counterpart's utility
and back, and phrases the counterpart's verdicts (see :mod:`.concession`):

* an offer gets ``"Deal."``, a counter-offer ``"No. 70?"`` (``"No."`` from a
  terse persona that never names its number), ``"Last chance. 70?"`` from a
  persona that warns when its patience is down to one, or the walk-out line;
* ``<accept/>`` closes at the counterpart's standing counter-offer (the rounded
  number it would say), which is never worse for it than its reservation;
* ``<reject/>`` and ``<say>`` are stalls; ``<end/>`` ends without a deal.

The counterpart's state is a frozen :class:`~.concession.Stance`.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from turnrl.envs.negotiation.actions import LAST_CHANCE, Accept, Action, End, Offer
from turnrl.envs.negotiation.base import NegotiationEnv, Reply
from turnrl.envs.negotiation.concession import Stance, Temper, Verdict, react, stall
from turnrl.envs.safe_math import format_number
from turnrl.types import Task


class SingleIssueEnv(NegotiationEnv):
    """A negotiation over one number; subclasses define the mapping and the persona."""

    walkout_text = "I'll leave."
    """What the counterpart says when it walks away."""
    issue = "price"

    # -- what a one-number setting supplies ----------------------------------------

    @abstractmethod
    def temper(self, task: Task) -> Temper:
        """The persona's parameters, in counterpart-utility units."""

    @abstractmethod
    def start(self, task: Task) -> Stance:
        """The counterpart's opening stance."""

    @abstractmethod
    def opening_text(self, task: Task, stance: Stance) -> str:
        """The counterpart's first line."""

    @abstractmethod
    def utility(self, task: Task, number: float) -> float:
        """The counterpart's utility of an offer number (higher: better for it)."""

    @abstractmethod
    def number(self, task: Task, utility: float) -> float:
        """The offer number with counterpart utility ``utility`` (inverse of ``utility``)."""

    @abstractmethod
    def value(self, task: Task, number: float) -> float:
        """The agent's normalised value of a deal at ``number``."""

    def schedule(self, task: Task, turns_taken: int) -> float | None:
        """A deadline cap on the counterpart's aspiration after ``turns_taken`` turns."""
        return None

    def persona(self, task: Task) -> dict[str, Any]:
        return task.payload["persona"]

    # -- NegotiationEnv hooks ------------------------------------------------------

    def open(self, task: Task) -> tuple[Stance, str]:
        stance = self.start(task)
        return stance, self.opening_text(task, stance)

    def respond(self, task: Task, counterpart: Any, action: Action, turn: int) -> Reply:
        stance: Stance = counterpart
        if isinstance(action, End):
            return Reply("Bye.", stance, outcome="ended")
        if isinstance(action, Accept):
            price = self.counter_number(task, stance)
            return Reply("Deal.", stance, outcome="deal", value=self.value(task, price), deal=True)
        schedule = self.schedule(task, turn + 1)
        if isinstance(action, Offer):
            number = action[self.issue]
            stance, verdict = react(stance, self.temper(task), self.utility(task, number), schedule)
            if verdict is Verdict.ACCEPT:
                value = self.value(task, number)
                return Reply("Deal.", stance, outcome="deal", value=value, deal=True)
        else:  # Reject or Say: a turn without an offer
            stance, verdict = stall(stance, self.temper(task), schedule)
        if verdict is Verdict.WALKOUT:
            return Reply(self.walkout_text, stance, outcome="walkout")
        counter = self.counter_number(task, stance)
        return Reply(self.counter_text(task, stance, counter), stance, info={"counter": counter})

    # -- phrasing ------------------------------------------------------------------

    def counter_number(self, task: Task, stance: Stance) -> float:
        """The counter-offer the counterpart states: its aspiration, rounded."""
        return float(round(self.number(task, stance.aspiration)))

    def counter_text(self, task: Task, stance: Stance, counter: float) -> str:
        persona = self.persona(task)
        head = LAST_CHANCE if persona.get("warns") and stance.patience == 1 else "No."
        if persona.get("terse"):
            return head
        return f"{head} {format_number(counter)}?"
