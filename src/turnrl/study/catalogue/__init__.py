"""Every declared study of this repository, and the measurements that are not
``turnrl train`` matrices but write doc tables too: a table of contents, one module per
study family.

Paths are relative to the repository root (studies run from a checkout: their
recipes live in ``examples/``). ``turnrl study list`` prints them with their cell
counts and times; ``make study-<name>`` runs one and summarises it. Every doc table's
marker names an entry here.

- :mod:`.demo`: ``make demo``'s recipe over seeds;
- :mod:`.tree`: tree rollouts;
- :mod:`.grouping`: the grouping experiment's learning runs;
- :mod:`.search`: the search agent;
- :mod:`.agents`: agent frameworks through the gateway;
- :mod:`.iterative`: iterative GRPO on the negotiation games;
- :mod:`.agents_489`: #489 on calc_openai;
- :mod:`.calc_x`: #489 on Agent Lightning's calc_x stack;
- :mod:`.smol`: #489 with SmolLM2;
- :mod:`.mechanism`: #489's mechanism (cost x std x grouping) on the built-in calculator;
- :mod:`.asynchronous`: sampling ahead of the learner (``train.max_staleness``);
- :mod:`.measurements`: commands that write doc tables but are not matrices of runs.
"""

from __future__ import annotations

from turnrl.errors import UsageError
from turnrl.study.catalogue.agents import (
    AGENTS_CALC_OPENAI,
    AGENTS_PARITY,
    AGENTS_SOLVER_CHECKER,
    AGENTS_WARM,
)
from turnrl.study.catalogue.agents_489 import AGENTS_489, AGENTS_489_NO_PAY
from turnrl.study.catalogue.asynchronous import ASYNC_DEMO_SEEDS
from turnrl.study.catalogue.calc_x import (
    AGENTS_CALC_X_489,
    AGENTS_CALC_X_HELD_OUT,
    AGENTS_CALC_X_PARITY,
    AGENTS_CALC_X_WARM,
)
from turnrl.study.catalogue.demo import DEMO_SEEDS
from turnrl.study.catalogue.grouping import GROUPING_LEARNING
from turnrl.study.catalogue.iterative import ITERATIVE_GRPO, ITERATIVE_PERSONA
from turnrl.study.catalogue.measurements import MEASUREMENTS, Measurement
from turnrl.study.catalogue.mechanism import MECHANISM
from turnrl.study.catalogue.search import SEARCH_AGENT
from turnrl.study.catalogue.smol import AGENTS_SMOL_489, SMOL_489_ARMS
from turnrl.study.catalogue.tree import TREE_ROLLOUTS
from turnrl.study.declaration import Study

__all__ = ["MEASUREMENTS", "STUDIES", "Measurement", "get_study", "known_tables"]

STUDIES: dict[str, Study] = {
    s.name: s
    for s in (
        DEMO_SEEDS,
        TREE_ROLLOUTS,
        GROUPING_LEARNING,
        SEARCH_AGENT,
        AGENTS_CALC_OPENAI,
        AGENTS_PARITY,
        AGENTS_SOLVER_CHECKER,
        ITERATIVE_GRPO,
        ITERATIVE_PERSONA,
        AGENTS_WARM,
        AGENTS_489,
        AGENTS_489_NO_PAY,
        AGENTS_CALC_X_WARM,
        AGENTS_CALC_X_PARITY,
        AGENTS_CALC_X_489,
        AGENTS_CALC_X_HELD_OUT,
        AGENTS_SMOL_489,
        SMOL_489_ARMS,
        MECHANISM,
        ASYNC_DEMO_SEEDS,
    )
}


def get_study(name: str) -> Study:
    if name in MEASUREMENTS:
        raise UsageError(
            f"{name!r} is a measurement, not a matrix of runs: its command is "
            f"`{MEASUREMENTS[name].command}`"
        )
    if name not in STUDIES:
        raise UsageError(f"unknown study {name!r}; declared: {', '.join(STUDIES)}")
    return STUDIES[name]


def known_tables() -> dict[str, tuple[str, ...]]:
    """Marker name -> table names, for every study and measurement."""
    out = {name: study.table_names for name, study in STUDIES.items()}
    out.update({name: m.tables for name, m in MEASUREMENTS.items()})
    return out
