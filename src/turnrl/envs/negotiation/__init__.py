"""Six offline negotiations against scripted counterparts with hidden, seeded personas.

The agent is the seller or proposer; the counterpart is a deterministic script
driven by a persona drawn from the task seed (reservation value, patience,
concession rate, preferences, style) and kept in ``Task.payload["persona"]``,
never shown to the agent. The counterpart reacts to every offer (its
counter-offers move toward the agent's, patience runs out on insults or stalls,
nothing worse than its reservation is ever accepted), so turn-level decisions
change the outcome. The reward is paid only when the conversation ends: the deal
value normalised to about [0, 1], 0 without a deal.

============  ==========================================  =================================
setting       the agent...                                inspired by (textarena)
============  ==========================================  =================================
haggle        sells an item to a buyer with a hidden max  SimpleNegotiation, UsedCarNegotiation
upsell        pitches add-ons; refusals annoy             (in-repo; SimpleNegotiation values)
retention     keeps a cancelling subscriber with a        TwoDollar (secret minimum roles)
              discount; each turn costs patience
multi_issue   sells a contract on price and term,         NewRecruit (multi-issue, integrative)
              hidden client weights: logrolling pays
ultimatum     proposes splits over rounds to a            IteratedUltimatumGame
              responder with a hidden fairness bar
split_money   splits 100 before a deadline with a         TwoDollar
              partner with a hidden minimum
============  ==========================================  =================================

None of these needs textarena: they are written here, with compact replies for
tiny character-level models. :mod:`.textarena_adapter` (optional, imports
textarena lazily) wraps textarena's own IteratedUltimatumGame with a scripted
responder.

The action language is in :mod:`.actions`, the shared episode loop in
:mod:`.base`, the concession model in :mod:`.concession`, scripted demonstration
agents (``style="weak"|"medium"|"strong"``) in :mod:`.scripted` and each setting's
module.
"""

from __future__ import annotations

from collections.abc import Callable

from turnrl.envs.negotiation import haggle, multi_issue, retention, split_money, ultimatum, upsell
from turnrl.envs.negotiation.actions import (
    Accept,
    End,
    Issue,
    Offer,
    OfferFormat,
    Reject,
    Say,
    format_offer,
    parse_action,
)
from turnrl.envs.negotiation.base import STYLES, NegotiationEnv, Reply, play
from turnrl.envs.negotiation.haggle import HaggleEnv, haggle_tasks
from turnrl.envs.negotiation.multi_issue import MultiIssueEnv, multi_issue_tasks
from turnrl.envs.negotiation.retention import RetentionEnv, retention_tasks
from turnrl.envs.negotiation.split_money import SplitMoneyEnv, split_money_tasks
from turnrl.envs.negotiation.ultimatum import UltimatumEnv, ultimatum_tasks
from turnrl.envs.negotiation.upsell import UpsellEnv, upsell_tasks

SETTINGS: dict[str, tuple[type[NegotiationEnv], Callable, Callable]] = {
    "haggle": (HaggleEnv, haggle_tasks, haggle.demonstration),
    "upsell": (UpsellEnv, upsell_tasks, upsell.demonstration),
    "retention": (RetentionEnv, retention_tasks, retention.demonstration),
    "multi_issue": (MultiIssueEnv, multi_issue_tasks, multi_issue.demonstration),
    "ultimatum": (UltimatumEnv, ultimatum_tasks, ultimatum.demonstration),
    "split_money": (SplitMoneyEnv, split_money_tasks, split_money.demonstration),
}
"""Registry name -> (env class, ``tasks(n, seed)``, ``demonstration(task, style=...)``)."""

__all__ = [
    "SETTINGS",
    "STYLES",
    "Accept",
    "End",
    "HaggleEnv",
    "Issue",
    "MultiIssueEnv",
    "NegotiationEnv",
    "Offer",
    "OfferFormat",
    "Reject",
    "Reply",
    "RetentionEnv",
    "Say",
    "SplitMoneyEnv",
    "UltimatumEnv",
    "UpsellEnv",
    "format_offer",
    "haggle_tasks",
    "multi_issue_tasks",
    "parse_action",
    "play",
    "retention_tasks",
    "split_money_tasks",
    "ultimatum_tasks",
    "upsell_tasks",
]
