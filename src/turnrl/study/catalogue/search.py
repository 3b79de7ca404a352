"""The search agent against the papers' estimators (docs/search-agent.md)."""

from __future__ import annotations

from turnrl.study.catalogue.grouping import estimator_arm
from turnrl.study.declaration import (
    Metric,
    Study,
    Table,
    WarmStarts,
)

SEARCH_ARMS = (
    ("grpo", "grpo", "{}"),
    ("igpo", "igpo", "{}"),
    ("a2tgpo", "a2tgpo", "{}"),
    ("gigpo", "gigpo", "{}"),
    ("turn_group", "turn_group", "{}"),
    ("a2tgpo_joint", "a2tgpo", '{ig_norm = "joint"}'),
    ("a2tgpo_no_rescale", "a2tgpo", "{rescale = false}"),
    ("a2tgpo_no_clip", "a2tgpo", "{beta = 0.0}"),
)

SEARCH_METRICS = (
    Metric("eval_success", "success"),
    Metric("eval_success_hop1", "1-hop"),
    Metric("eval_success_hop2", "2-hop"),
    Metric("eval_success_hop3", "3-hop"),
    Metric("eval_tool_calls", "searches"),
    Metric("eval_turns", "turns"),
)
"""Held-out (greedy) success overall and by hop count, searches and turns per question."""

SEARCH_AGENT = Study(
    name="search-agent",
    title="Search agent (lookup): credit estimators, equal episodes",
    config="examples/lookup.toml",
    arms=tuple(estimator_arm(*arm) for arm in SEARCH_ARMS),
    seeds=(0, 1, 2),
    # one warm start per seed: the seed spread then includes the warm start's (the
    # tables in the doc used one shared warm start: RL spread only)
    warm_starts=WarmStarts(count=1, per_seed=True),
    overrides=("train.threads=1",),
    baseline="grpo",
    doc="docs/search-agent.md",
    tables=(
        Table("arms", "arms", SEARCH_METRICS),
        Table("paired", "paired", SEARCH_METRICS[:1] + SEARCH_METRICS[4:5]),
    ),
    doc_tables=("details",),
    curve="eval_success",
    minutes_per_cell=5.0,
    regenerated="python examples/lookup/run.py (one warm start shared by all seeds)",
)
