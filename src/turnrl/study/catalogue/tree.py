"""Tree rollouts against flat rollouts (docs/tree-rollouts.md)."""

from __future__ import annotations

from turnrl.study.declaration import (
    Arm,
    Metric,
    Setting,
    Study,
    Table,
    WarmStarts,
)

TREE_METRICS = (
    Metric("eval_success", "eval success", digits=3),
    Metric("eval_success", "mean over evals", "mean_after_first", digits=3),
)

TREE_ROLLOUTS = Study(
    name="tree-rollouts",
    title="Tree rollouts on FrozenLake 3x3: independent vs PATR vs RTPO at equal env steps",
    config="examples/frozenlake_independent.toml",
    program=(
        "{python}",
        "examples/tree/run.py",
        "--budget",
        "6000",
        "--eval-every",
        "1000",
        "--cell",
    ),
    arms=(
        Arm("independent"),
        Arm("patr", config="examples/frozenlake_patr.toml"),
        Arm("rtpo", config="examples/frozenlake_rtpo.toml"),
    ),
    seeds=(0, 1, 2),
    settings=(Setting("lr3e-4"), Setting("lr1e-3", ("train.lr=1e-3",))),
    warm_starts=WarmStarts(
        count=3, per_seed=True, program=("{python}", "-m", "turnrl.cli", "train", "--quiet")
    ),
    overrides=("train.threads=1",),
    resume_flag=None,
    baseline="independent",
    doc="docs/tree-rollouts.md",
    tables=(
        Table("arms", "arms", TREE_METRICS),
        Table("paired", "paired", TREE_METRICS),
        Table("seeds", "seeds", TREE_METRICS[:1]),
    ),
    curve="eval_success",
    curve_x="env_steps_physical",
    minutes_per_cell=1.0,
)
