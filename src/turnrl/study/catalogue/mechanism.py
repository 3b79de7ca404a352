"""#489's mechanism, tested (issue #40): is it the per-turn cost and the std-divided group
that push the agent away from a paying tool? The built-in tool environment
(docs/grouping-experiment.md, "The mechanism, tested")."""

from __future__ import annotations

from turnrl.study.catalogue.grouping import estimator_arm
from turnrl.study.declaration import Metric, Setting, Study, Table, WarmStarts

TOOL_RATE = Metric("eval_tool_open_rate", "sampled turn-0 tool rate", digits=3)
"""The pre-registered outcome: the sampled (T = 1) turn-0 tool rate on the 64 held-out
medium tasks, 4 samples each, at the end of RL. Every arm of a (warm start, seed) pair
starts from the same warm start and draws the same evaluation at step 0, so ``arm −
grpo_mixed`` of the end value is the difference of the changes from step 0."""
SUCCESS = Metric("eval_success", "success", digits=3)
RETURN = Metric("eval_return", "return", digits=3)
MECHANISM_OUTCOMES = (TOOL_RATE, SUCCESS, RETURN)
MALFORMED = Metric("eval_malformed_rate", "malformed turns", digits=3)

ECONOMICS = (
    Metric("eval_tool_open_rate", "opened with a call", "first", 3),
    Metric("eval_opened_tool_success", "right after a call", "first", 3),
    Metric("eval_opened_no_tool_success", "right without a call", "first", 3),
    Metric("eval_success", "success", "first", 3),
    Metric("eval_return", "return", "first", 3),
)
"""Each warm start's tool/direct economics at step 0 (before any RL step): how often it
opens with a call, how often an episode that did is right and how often one that did not
(a direct answer; a malformed first turn counts here too) is, and the return at the
setting's cost."""

MECHANISM_STEPS = 30
"""RL steps per cell (8 tasks x 8 rollouts each): grouping-learning's short length,
where every arm had already settled at cost 0.4; cut from 60 to fit the time left."""

MECHANISM = Study(
    name="mechanism",
    title="#489's mechanism, tested: per-turn cost {0, 0.2} x five estimators x three warm"
    " starts, built-in calculator, 105k-parameter character model",
    config="examples/grouping/medium.toml",
    # grouping-learning's three arms and the two that separate the std from the grouping:
    # dr_grpo is grpo without the std (per rollout), grpo_mixed without the std is the
    # mixed grouping without it; node is mean-only at exact decision points
    arms=(
        estimator_arm("grpo_mixed", "grpo_mixed", "{}", "train.aggregation=token-mean"),
        estimator_arm(
            "grpo_mixed_no_std",
            "grpo_mixed",
            "{use_std = false}",
            "train.aggregation=token-mean",
        ),
        *(
            estimator_arm(name, name, "{}", "train.aggregation=token-mean")
            for name in ("grpo", "dr_grpo", "node")
        ),
    ),
    seeds=(0, 1),
    settings=(
        Setting("cost0", ("env.env_kwargs.turn_cost=0.0",)),
        Setting("cost0.2", ("env.env_kwargs.turn_cost=0.2",)),
    ),
    # three warm starts of the recipe (its 1500 SFT steps at train.seed 0, 1, 2): the
    # unit of inference; seeds within a warm start are not independent of it
    warm_starts=WarmStarts(count=3),
    overrides=(
        "train.threads=1",
        f"train.steps={MECHANISM_STEPS}",
        "train.eval_every=10",
        "train.checkpoint_every=10",
    ),
    baseline="grpo_mixed",
    outcome="eval_tool_open_rate",
    doc="docs/grouping-experiment.md",
    tables=(
        Table("economics", "seeds", (), extra=ECONOMICS, arms=("grpo_mixed",)),
        Table("arms", "arms", MECHANISM_OUTCOMES),
        Table("paired", "paired", MECHANISM_OUTCOMES),
        Table("std", "paired", (TOOL_RATE,), arms=("grpo", "dr_grpo"), baseline="grpo"),
        # malformed turns added after seed 0 of warm start 0 ran: two arms' outputs broke
        # down at cost 0, which the tool rate alone would read as dropping the tool
        Table("seeds", "seeds", (TOOL_RATE, SUCCESS, MALFORMED)),
    ),
    curve="eval_tool_open_rate",
    minutes_per_cell=1.5,
)
