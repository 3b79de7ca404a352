"""#489 on Agent Lightning's calc_x stack (autogen + MCP calculator): its warm starts,
parity, the pipeline vs estimators and the held-out set (docs/agents.md,
docs/grouping-experiment.md)."""

from __future__ import annotations

from turnrl.study.catalogue.agents import WARM_METRICS
from turnrl.study.catalogue.agents_489 import PIPELINE_ARM, TOOL_PAYS
from turnrl.study.catalogue.demo import DEMO_METRICS
from turnrl.study.catalogue.grouping import estimator_arm
from turnrl.study.declaration import (
    Arm,
    Metric,
    Setting,
    Study,
    Table,
    WarmStarts,
)

CALC_X = "examples/agents/calc_x/calc_x.toml"
CALC_X_WARM_METRICS = (
    # greedy decoding takes the majority of a per-draw mix (60% direct): where it never
    # decides to call, warm_tf_*_call is absent and its share decided otherwise is 1
    Metric("warm_tf_hard_call_other", "hard calls decided otherwise", "first"),
    # ... so the copy is measured with the teacher's decision forced (every seed's run
    # logs it from 1f684f1 on; seeds 0-2 ran again there)
    Metric("warm_tf_hard_call_forced", "hard operands copied (forced)", "first"),
    Metric("warm_tf_easy_call_forced", "easy operands copied (forced)", "first"),
    WARM_METRICS[1],  # hard result exact
    WARM_METRICS[3],  # easy result exact
    Metric("warm_tf_easy_direct", "easy direct exact", "first"),
    *WARM_METRICS[4:],
)

AGENTS_CALC_X_WARM = Study(
    name="agents-calc-x-warm",
    title="calc_x (autogen + MCP) warm starts alone: which seeds copy operands and results",
    config=CALC_X,
    # each cell is the recipe's warm start only (train.steps=0): the teacher's rollouts
    # through the unchanged agent (one MCP server each), SFT, the step-0 greedy
    # evaluation and the teacher-forced check, as agents-warm for calc_openai
    arms=(Arm("recipe", ()),),
    seeds=(0, 1, 2, 3, 4, 5),
    overrides=("train.threads=1", "train.steps=0"),
    doc="docs/agents.md",
    tables=(Table("warm", "arms", CALC_X_WARM_METRICS),),
    minutes_per_cell=40.0,
)

CALC_X_TRAINING = (
    Metric("tool_rate", "sampled tool rate (5 steps)", "last:5"),
    Metric("success", "sampled success (5 steps)", "last:5"),
)
"""The rollouts RL samples (temperature 1), first 5 steps -> last 5 (80 episodes each).
The greedy held-out tool rate stays 0 while a call is less likely than an answer (the
warm start's per-draw mix calls on 40%), so it cannot show a drift either way."""
CALC_X_TRAINING_HARD = Metric("tool_rate_hard", "sampled tool rate, hard (5 steps)", "last:5")

CALC_X_WARM_STARTS = dict(cells_of=AGENTS_CALC_X_WARM, cells_arm="recipe")
"""The RL studies of calc_x start from agents-calc-x-warm's cells (half an hour each)."""

AGENTS_CALC_X_PARITY = Study(
    name="agents-calc-x-parity",
    title="The calc_x agent (autogen + MCP) with the measured recipe, from each warm start",
    config=CALC_X,
    # the recipe's RL (dr_grpo, lr 3e-4) from each seed's warm start of agents-calc-x-warm
    # (seed k from warm start k), cut to fit two cores as agents-calc-x-489: 20 steps
    # (320 episodes), evaluations at steps 0, 10 and 20
    arms=(Arm("dr_grpo", ("label=dr_grpo", "warm_start.teacher=none")),),
    seeds=AGENTS_CALC_X_WARM.seeds,
    warm_starts=WarmStarts(count=1, per_seed=True, **CALC_X_WARM_STARTS),
    overrides=("train.threads=1", "train.steps=20", "train.eval_every=10"),
    doc="docs/agents.md",
    tables=(Table("seeds", "seeds", (*DEMO_METRICS, *CALC_X_TRAINING, CALC_X_TRAINING_HARD)),),
    curve="tool_rate",
    minutes_per_cell=13.0,
)


AGENTS_CALC_X_489 = Study(
    name="agents-calc-x-489",
    title="#489 on the literal calc_x agent (autogen + MCP), reward = correctness, the tool"
    " pays: the pipeline vs grpo_mixed vs node",
    config=CALC_X,
    # the arms on the literal agent: the trained pipeline, grpo_mixed, and the
    # best arm of agents-489 on the warm start that passes (mean end success on ws6:
    # grpo_mixed 0.86, node 0.85, grpo 0.85, pipeline 0.84, turn_group 0.84, dr_grpo
    # 0.81; grpo_mixed is an arm already, so the runner-up, node)
    arms=(PIPELINE_ARM, *(estimator_arm(arm, arm) for arm in ("grpo_mixed", "node"))),
    seeds=(0, 1, 2, 3, 4),
    # the warm starts of agents-calc-x-warm that pass the check (docs/agents.md)
    warm_starts=WarmStarts(count=1, seeds=(0,), **CALC_X_WARM_STARTS),
    settings=(TOOL_PAYS,),
    # lr 3e-4 for every arm: chosen once, on calc_openai (agents-489). Cut to fit two
    # cores: 20 steps of the recipe's 4 problems x 4 rollouts (320 episodes a run), and
    # evaluations at steps 0, 10 and 20 only. Every rollout starts its own MCP server
    # (about 1-1.5 s of a core each, measured on the warm starts' teacher rollouts), so a
    # cell's 416 rollouts cost more than its updates.
    overrides=("train.threads=1", "train.lr=3e-4", "train.steps=20", "train.eval_every=10"),
    baseline="pipeline",
    doc="docs/grouping-experiment.md",
    tables=(
        Table("arms", "arms", (Metric("eval_success", "success"), *CALC_X_TRAINING)),
        Table(
            "paired",
            "paired",
            (Metric("eval_success", "success"), *CALC_X_TRAINING, CALC_X_TRAINING_HARD),
        ),
        Table("seeds", "seeds", (*DEMO_METRICS, *CALC_X_TRAINING, CALC_X_TRAINING_HARD)),
    ),
    curve="tool_rate",
    minutes_per_cell=13.0,
)

PIPELINE_VS_GRPO_MIXED = (PIPELINE_ARM, estimator_arm("grpo_mixed", "grpo_mixed"))
"""The two arms the issue names on the costly agents: the trained pipeline and grpo_mixed."""

TOOL_PAYS_HELD_OUT = Setting(
    "tool-pays-held-out", (*TOOL_PAYS.overrides, "warm_start.hold_out_teacher_tasks=true")
)
"""The tool pays, and RL never draws one of the warm start's teacher problems."""

AGENTS_CALC_X_HELD_OUT = Study(
    name="agents-calc-x-held-out",
    title="#489 on calc_x with the warm start's teacher problems held out of RL: the"
    " pipeline vs grpo_mixed",
    config=CALC_X,
    # agents-calc-x-489's pipeline and grpo_mixed arms, warm start, steps and lr, on the
    # 256 training problems the warm start never saw (it memorised its 256 teacher
    # problems' answers, on which a direct answer beat a call); 3 seeds, cut to fit
    arms=PIPELINE_VS_GRPO_MIXED,
    seeds=(0, 1, 2),
    warm_starts=AGENTS_CALC_X_489.warm_starts,
    settings=(TOOL_PAYS_HELD_OUT,),
    overrides=AGENTS_CALC_X_489.overrides,
    baseline="pipeline",
    doc="docs/grouping-experiment.md",
    tables=AGENTS_CALC_X_489.tables,
    curve="tool_rate",
    minutes_per_cell=13.0,
)
