"""Agent frameworks through the gateway (docs/agents.md): calc_openai, parity with the
built-in calculator, the autogen + MCP warm start, the solver-checker pair."""

from __future__ import annotations

from turnrl.study.catalogue.demo import DEMO_METRICS
from turnrl.study.catalogue.grouping import estimator_arm
from turnrl.study.declaration import (
    Arm,
    Metric,
    Study,
    Table,
    WarmStarts,
)

AGENT_METRICS = (
    Metric("eval_success", "success"),
    Metric("eval_success_hard", "success (hard)"),
    Metric("eval_tool_rate_hard", "tool rate (hard)"),
)
CALC_OPENAI_METRICS = (
    *AGENT_METRICS,
    Metric("eval_success_easy", "success (easy)"),
    Metric("eval_tool_rate_easy", "tool rate (easy)"),
)
"""With the easy half: where 20 steps of RL moved anything in the study below."""

AGENTS_CALC_OPENAI = Study(
    name="agents-calc-openai",
    title="The openai-client calculator agent: grpo_mixed vs grpo vs node",
    config="examples/agents/calc_openai.toml",
    arms=tuple(
        estimator_arm(name, name, "{}", "warm_start.teacher=none")
        for name in ("grpo_mixed", "grpo", "node")
    ),
    seeds=(0, 1, 2),
    warm_starts=WarmStarts(
        count=1,
        overrides=("train.steps=0", "warm_start.teacher_tasks=512", "warm_start.steps=3000"),
    ),
    overrides=(
        "train.threads=1",
        "rollout.tasks_per_step=8",
        "rollout.group_size=4",
        "train.steps=20",
        "train.eval_every=10",
        "train.checkpoint_every=10",
    ),
    baseline="grpo_mixed",
    doc="docs/agents.md",
    tables=(
        Table("arms", "arms", CALC_OPENAI_METRICS),
        Table("paired", "paired", CALC_OPENAI_METRICS),
    ),
    curve="eval_success",
    minutes_per_cell=3.0,
)

CALCULATOR_SEEDS_TABLE = Table(
    "seeds", "seeds", (*DEMO_METRICS, Metric("eval_tool_rate_easy", "tool rate (easy)"))
)
"""Per seed: success (all, easy, hard) and tool rate (all, easy), start -> end."""

AGENTS_PARITY = Study(
    name="agents-parity",
    title="The calc_openai agent with the measured recipe: one warm start per seed",
    config="examples/agents/calc_openai.toml",
    # the recipe as it is: each cell trains its own warm start (train.seed = the seed:
    # teacher rollouts, SFT draws and initial weights), then 40 RL steps
    arms=(Arm("dr_grpo", ("label=dr_grpo",)),),
    seeds=(0, 1, 2, 3, 4),
    overrides=("train.threads=1",),
    doc="docs/agents.md",
    tables=(CALCULATOR_SEEDS_TABLE,),
    curve="eval_success",
    minutes_per_cell=6.0,
)

WARM_METRICS = (
    Metric("warm_tf_hard_call", "hard call exact", "first"),
    Metric("warm_tf_hard_result", "hard result exact", "first"),
    Metric("warm_tf_easy_call", "easy call exact", "first"),
    Metric("warm_tf_easy_result", "easy result exact", "first"),
    Metric("eval_success_hard", "greedy hard", "first"),
    Metric("eval_success_easy", "greedy easy", "first"),
    Metric("eval_tool_rate_hard", "tool rate (hard)", "first"),
)

AGENTS_WARM = Study(
    name="agents-warm",
    title="calc_openai warm starts alone: which recipe copies operands and results",
    config="examples/agents/calc_openai.toml",
    # each cell is a warm start only (train.steps=0): the teacher's rollouts, SFT, the
    # step-0 greedy evaluation and the teacher-forced check (warm_tf_*: the share of the
    # teacher's turns that greedy decoding reproduces exactly, per kind and turn)
    arms=(
        Arm("steps1100-draw", ("warm_start.steps=1100", "warm_start.mix=per_draw")),
        Arm("steps3000-draw", ("warm_start.steps=3000", "warm_start.mix=per_draw")),
        Arm("steps3000-task", ("warm_start.steps=3000", "warm_start.mix=per_task")),
    ),
    seeds=(0, 1, 2, 3, 4, 5, 6),
    overrides=("train.threads=1", "train.steps=0"),
    doc="docs/agents.md",
    tables=(Table("warm", "arms", WARM_METRICS),),
    minutes_per_cell=6.0,
)

AGENTS_SOLVER_CHECKER = Study(
    name="agents-solver-checker",
    title="Two roles (solver + checker) under role_turn with the measured recipe, per seed",
    config="examples/agents/solver_checker.toml",
    # the recipe as it is, as agents-parity: each cell trains its own warm start (the
    # scripted teacher's 512 problems, 3000 cosine SFT steps), then 40 RL steps of
    # role_turn without the std (AT-GRPO's groups, the dr_grpo form) at lr 3e-4
    arms=(Arm("role_turn", ("label=role_turn",)),),
    seeds=(0, 1, 2),
    overrides=("train.threads=1",),
    doc="docs/agents.md",
    tables=(
        Table(
            "seeds",
            "seeds",
            (*DEMO_METRICS, Metric("eval_tool_rate_hard", "tool rate (hard)")),
            # the warm start's teacher-forced check per role (warm_start_check.json),
            # given the teacher's decision: the solver's hard call (operands copied after
            # the checker's no), its answer after the tool, its direct easy answer
            extra=tuple(
                Metric(f"warm_tf_{kind}_solver_{turn}_forced", f"{kind} {turn} copied", "first")
                for kind, turn in (("hard", "call"), ("hard", "result"), ("easy", "direct"))
            ),
        ),
    ),
    curve="eval_tool_rate",
    minutes_per_cell=25.0,
)
