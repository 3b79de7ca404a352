"""Every declared study of this repository, and the measurements that are not
``turnrl train`` matrices but write doc tables too.

Paths are relative to the repository root (studies run from a checkout: their
recipes live in ``examples/``). ``turnrl study list`` prints them with their cell
counts and times; ``make study-<name>`` runs one and summarises it.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnrl.errors import UsageError
from turnrl.study.declaration import Arm, Metric, Setting, Study, Table, WarmStarts

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

STUDIES: dict[str, Study] = {s.name: s for s in (DEMO_SEEDS, TREE_ROLLOUTS)}


@dataclass(frozen=True)
class Measurement:
    """A command that writes doc tables but is not a matrix of training runs (a gradient
    measurement, a benchmark): its tables' markers name it, and it says how to rerun."""

    name: str
    command: str
    doc: str
    tables: tuple[str, ...]
    minutes: float


MEASUREMENTS: dict[str, Measurement] = {}


def get_study(name: str) -> Study:
    if name not in STUDIES:
        raise UsageError(f"unknown study {name!r}; declared: {', '.join(STUDIES)}")
    return STUDIES[name]


def known_tables() -> dict[str, tuple[str, ...]]:
    """Marker name -> table names, for every study and measurement."""
    out = {name: study.table_names for name, study in STUDIES.items()}
    out.update({name: m.tables for name, m in MEASUREMENTS.items()})
    return out
