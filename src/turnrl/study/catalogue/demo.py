"""`make demo`'s recipe over seeds (the README's table)."""

from __future__ import annotations

from turnrl.study.declaration import (
    Arm,
    Metric,
    Study,
    Table,
)

DEMO_METRICS = (
    Metric("eval_success", "success"),
    Metric("eval_success_easy", "easy"),
    Metric("eval_success_hard", "hard"),
    Metric("eval_tool_rate", "tool rate"),
)

DEMO_SEEDS = Study(
    name="demo-seeds",
    title="`make demo`'s recipe over six seeds",
    config="examples/calculator.toml",
    arms=(Arm("calculator"),),
    seeds=tuple(range(6)),
    doc="README.md",
    tables=(
        Table(
            "seeds",
            "seeds",
            DEMO_METRICS,
            extra=(Metric("eval_success", "lowest success after step 0", "min_after_first"),),
        ),
        Table("arms", "arms", DEMO_METRICS[:1]),
    ),
    curve="eval_success",
    minutes_per_cell=2.5,
)
