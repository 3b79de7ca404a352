"""#489 with SmolLM2 through calc_openai (docs/grouping-experiment.md)."""

from __future__ import annotations

from turnrl.study.catalogue.agents_489 import PIPELINE_ARM, TOOL_PAYS
from turnrl.study.catalogue.calc_x import (
    CALC_X_TRAINING,
    CALC_X_TRAINING_HARD,
    PIPELINE_VS_GRPO_MIXED,
)
from turnrl.study.catalogue.demo import DEMO_METRICS
from turnrl.study.catalogue.grouping import estimator_arm
from turnrl.study.catalogue.mechanism import ECONOMICS
from turnrl.study.declaration import (
    Arm,
    Metric,
    Setting,
    Study,
    Table,
    WarmStarts,
)

SMOL = "examples/agents/calc_openai_smollm2.toml"

AGENTS_SMOL_489 = Study(
    name="agents-smol-489",
    title="#489 on a real model: the calc_openai agent on SmolLM2-135M-Instruct (LoRA),"
    " reward = correctness, the tool pays: the pipeline vs grpo_mixed",
    config=SMOL,
    # the pipeline and the best arm of agents-489 on the warm start that can use the tool
    # (mean end success on ws6: grpo_mixed 0.86)
    arms=PIPELINE_VS_GRPO_MIXED,
    seeds=(0, 1, 2),
    warm_starts=WarmStarts(count=1, seeds=(0,)),
    settings=(TOOL_PAYS,),
    # lr 2e-5 for both arms: the SmolLM2 LoRA recipe's (examples/calculator_smollm2.toml,
    # where 5e-4 collapsed the policy within one step), not tuned here. Cut to fit two
    # cores: 16 steps of 4 problems x 4 rollouts (256 episodes a run), evaluations at
    # steps 0, 8 and 16.
    overrides=("train.threads=1", "train.steps=16", "train.eval_every=8"),
    baseline="pipeline",
    doc="docs/grouping-experiment.md",
    tables=(
        Table(
            "arms",
            "arms",
            (
                Metric("eval_success", "success"),
                Metric("eval_tool_rate", "tool rate"),
                *CALC_X_TRAINING,
            ),
        ),
        Table(
            "paired",
            "paired",
            (
                Metric("eval_success", "success"),
                Metric("eval_tool_rate", "tool rate"),
                *CALC_X_TRAINING,
                CALC_X_TRAINING_HARD,
            ),
        ),
        Table("seeds", "seeds", (*DEMO_METRICS, *CALC_X_TRAINING, CALC_X_TRAINING_HARD)),
    ),
    curve="tool_rate",
    minutes_per_cell=16.0,
)


AGL1_ARM = Arm(
    "agl1",
    ("label=agl1", "credit.estimator=grpo", "credit.params={}", "train.aggregation=rollout-mean"),
)
"""Agent Lightning 1.0's defaults (docs/integrations-agentlightning.md): the rollout-level
advantage (one value per rollout, grouped by task: turnrl's ``grpo``) and the
``per_rollout_mean`` loss (each rollout weighs the same: ``rollout-mean``)."""

WORKED_WARM_START = (
    "warm_start.teacher=examples/agents/calc_teacher.py:teach_worked",
    "warm_start.teacher_tasks=256",
    "warm_start.steps=64",
    "warm_start.lr=5e-4",
    "warm_start.tool_fraction=0.5",
    "warm_start.easy_tool_fraction=0.5",
)
"""The warm start of ``smol-489-arms``: direct answers written out, half of each kind of
problem solved with the tool, a gentle rate (see the study's comment)."""

SAMPLED_TOOL_RATE = Metric("eval_tool_rate", "sampled tool rate", digits=3)
"""The pre-registered outcome: the held-out tool rate sampled at T = 1 (32 problems x 4
samples) at the end of RL. Every arm of a (warm start, seed) pair starts from the same
warm start, but its step-0 evaluation is not the same draw: the agent loop's sampling
depends on which calls share a gateway batch, so the arms' step-0 values differ by
sampling noise (warm start 0, seed 0: 0.617 to 0.734 over the seven arms). ``arm -
baseline`` of the end value therefore carries that noise too; the summary's tables
show each arm's start beside its end."""
SAMPLED_SUCCESS = Metric("eval_success", "sampled success", digits=3)
"""The second outcome: held-out success, sampled the same way."""

SMOL_489_ARMS = Study(
    name="smol-489-arms",
    title="#489 on a real model below the ceiling: calc_openai on SmolLM2-135M-Instruct"
    " (LoRA), sampled evaluation, per-call cost {0, 0.2} x seven arms x three warm starts",
    config=SMOL,
    # the arms: both Agent Lightning pipelines, and the five estimators
    arms=(
        PIPELINE_ARM,
        AGL1_ARM,
        *(
            estimator_arm(arm, arm)
            for arm in ("grpo_mixed", "grpo", "dr_grpo", "turn_group", "node")
        ),
    ),
    seeds=(0, 1, 2, 3),
    # Warm starts below the ceiling (pilot of 2026-12-07, seed 0, one run each,
    # docs/grouping-experiment.md "A real model"): the teacher writes direct answers out
    # ("2 + 8 = 10", teach_worked) and calls the tool on half of the easy and half of the
    # hard problems; 64 SFT steps over 256 teacher tasks at lr 5e-4. Sampled at T = 1 it
    # opens with a call 0.67 of the time; direct answers are right 23 of 42 (easy 23 of
    # 26, hard 0 of 16), calls 86 of 86. The recipe's warm start (lr 2e-3, numbers only)
    # calls 0.79 of the time and its direct answers are right 0.15; at lr 2e-3 the
    # worked answers were right 0 of 58: that rate erases what the model knows of sums.
    warm_starts=WarmStarts(count=3, overrides=("train.steps=0", *WORKED_WARM_START)),
    settings=(
        Setting("cost0", ("warm_start.teacher=none", "agent.turn_cost=0.0")),
        Setting("cost0.2", ("warm_start.teacher=none", "agent.turn_cost=0.2")),
    ),
    # lr 2e-5: the recipe's (agents-smol-489). The sampler is transformers, not vLLM:
    # a study cell runs `turnrl train` of the main venv (docs/studies.md).
    overrides=(
        "train.threads=1",
        "train.steps=16",
        "train.eval_every=16",
        "train.eval_temperature=1.0",
        "train.eval_samples=4",
    ),
    baseline="grpo_mixed",
    outcome="eval_tool_rate",
    # cut to seed 0 (39 cells archived in studies/smol-489-arms.cells.jsonl; seeds 1-3
    # not run, the power lost said in the doc): its tables in
    # docs/grouping-experiment.md are this summary's
    doc="docs/grouping-experiment.md",
    tables=(
        Table("economics", "seeds", (), extra=ECONOMICS, arms=("grpo_mixed",)),
        Table("arms", "arms", (SAMPLED_TOOL_RATE, SAMPLED_SUCCESS)),
        Table("paired", "paired", (SAMPLED_TOOL_RATE, SAMPLED_SUCCESS)),
        Table("seeds", "seeds", (SAMPLED_TOOL_RATE, SAMPLED_SUCCESS)),
    ),
    curve="tool_rate",
    minutes_per_cell=21.0,  # the pilot: 42 s a step, 4-4.5 min an evaluation (steps 0, 16)
)
