"""The grouping experiment's learning runs: grpo_mixed vs grpo vs node on the built-in
tool environment (docs/grouping-experiment.md), and the estimator arm other studies share."""

from __future__ import annotations

from turnrl.study.declaration import (
    Arm,
    Metric,
    Setting,
    Study,
    Table,
    WarmStarts,
)

TOOL_OPEN = Metric("eval_tool_open_rate", "turn-0 tool rate", digits=3)
GROUPING_OUTCOMES = (
    TOOL_OPEN,
    Metric("eval_return", "return", digits=3),
    Metric("eval_success", "success", digits=3),
    Metric("eval_turns", "turns", digits=3),
)


def estimator_arm(name: str, estimator: str, params: str = "{}", *extra: str) -> Arm:
    return Arm(
        name,
        (f"label={name}", f"credit.estimator={estimator}", f"credit.params={params}", *extra),
    )


GROUPING_LEARNING = Study(
    name="grouping-learning",
    title="Grouping experiment, learning runs: grpo_mixed vs grpo vs node (token-mean, all turns)",
    config="examples/grouping/medium.toml",
    arms=tuple(
        estimator_arm(name, name, "{}", "train.aggregation=token-mean")
        for name in ("grpo_mixed", "grpo", "node")
    ),
    seeds=tuple(range(5)),
    settings=(
        Setting("cost0.4-steps60", ("env.env_kwargs.turn_cost=0.4", "train.steps=60")),
        Setting("cost0.4-steps30", ("env.env_kwargs.turn_cost=0.4", "train.steps=30")),
        Setting("cost0.2-steps60", ("env.env_kwargs.turn_cost=0.2", "train.steps=60")),
    ),
    # the frozen warm start of examples/grouping/gradient.py (same recipe, same seed)
    warm_starts=WarmStarts(count=1),
    overrides=("train.threads=1",),
    baseline="grpo_mixed",
    doc="docs/grouping-experiment.md",
    tables=(
        Table("arms", "arms", GROUPING_OUTCOMES),
        Table("paired", "paired", GROUPING_OUTCOMES),
    ),
    curve="eval_tool_open_rate",
    minutes_per_cell=1.0,
)
