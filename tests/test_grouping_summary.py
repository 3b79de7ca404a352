"""The grouping experiment: the learning runs' study declaration and the projection
tables (examples/grouping/gradient.py) on hand-built numbers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from turnrl.study.catalogue import STUDIES
from turnrl.study.declaration import cells

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grouping"


def _load(name: str):
    """The example script as a module under a unique name (other examples have a run.py)."""
    spec = importlib.util.spec_from_file_location(f"grouping_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gradient = _load("gradient")


def test_learning_runs_are_the_declared_study(tmp_path: Path) -> None:
    """The ``grouping-learning`` cells carry the overrides the old ``run.py`` passed
    (estimator, aggregation, cost, steps, one thread, the frozen warm start, the seed)."""
    study = STUDIES["grouping-learning"]
    cells_ = cells(study, tmp_path)
    warm, first = cells_[0], cells_[1]
    assert warm.is_warm_start and "train.steps=0" in warm.argv and "train.seed=0" in warm.argv
    assert first.key == "cost0.4-steps60/grpo_mixed/ws0-seed0"
    for override in (
        "credit.estimator=grpo_mixed",
        "credit.params={}",
        "train.aggregation=token-mean",
        "env.env_kwargs.turn_cost=0.4",
        "train.steps=60",
        "train.threads=1",
        "train.seed=0",
        f"warm_start.init_from={warm.run_dir}/warm_start",
    ):
        assert override in first.argv, override
    assert len(cells_) == 1 + 3 * 3 * 5
    assert study.baseline == "grpo_mixed"


def test_bootstrap_interval_brackets_the_mean_and_is_zero_width_for_constants() -> None:
    values = np.array([1.0, 2.0, 3.0, 4.0])
    mean, low, high = gradient.bootstrap(values)
    assert mean == 2.5
    assert 1.0 <= low <= mean <= high <= 4.0
    assert gradient.bootstrap(np.full(5, 0.25)) == (0.25, 0.25, 0.25)
    assert gradient.cell(np.full(3, -0.002), 1e3) == "-2.00 [-2.00, -2.00] -"


def _rows(total_by_arm: dict[str, float], n: int = 4) -> list[dict]:
    """Batches where every arm's turn-0 part is its value and later part 0, at every cost."""
    names = [arm.name for arm in gradient.arms()]
    costs = {
        f"{c:g}": {name: [total_by_arm.get(name, 0.0), 0.0, 10] for name in names}
        for c in gradient.COSTS
    }
    return [{"projections": costs} for _ in range(n)]


def test_overview_and_contrasts_on_constant_batches() -> None:
    rows = _rows({"grpo_mixed/token-mean/all": 0.003, "grpo/token-mean/all": 0.001})
    overview = gradient.overview(rows, 1e3)
    assert overview[2].startswith("| grpo_mixed/token-mean/all | +3 [+3, +3] + |")
    assert "| grpo/token-mean/all | +1 [+1, +1] + |" in "\n".join(overview)
    assert len(overview) == 2 + len(gradient.arms())
    contrasts = dict(gradient.contrast_values(rows, "0"))
    group = contrasts["group statistics: grpo_mixed - grpo, turn-0 rows (token-mean, all)"]
    assert group == pytest.approx(np.full(4, 0.002))


adam = _load("adam")


def test_adam_table_reports_each_quantity_and_the_sign_agreement() -> None:
    """examples/grouping/adam.py's table on hand-built chains: the three quantities x 1000
    per cost, arm and update, and how many chains' Adam update has the gradient's sign."""

    def update(sgd: float, step: float, change: float) -> dict:
        return {"sgd": sgd, "adam": step, "change": change, "rows": 100, "optimizer_steps": 2}

    def chain(sign: float) -> dict:
        cells = {
            f"{cost:g}/{name}": [update(0.002, sign * 0.001, -0.0005), update(-0.004, -0.003, 0)]
            for cost in adam.COSTS
            for name, _, _ in adam.ARMS
        }
        return {"chain": 0, "updates": cells}

    lines = adam.table([chain(1.0), chain(-1.0), chain(1.0)])
    assert len(lines) == 2 + len(adam.COSTS) * len(adam.ARMS) * 2
    first, second = lines[2], lines[3]
    assert first.startswith("| 0 | grpo (std) | 1 | +2.0 [+2.0, +2.0] + | +0.3 [")
    assert first.endswith("| -0.5 [-0.5, -0.5] - | 2/3 |")
    assert second == (
        "| 0 | grpo (std) | 2 | -4.0 [-4.0, -4.0] - | -3.0 [-3.0, -3.0] - "
        "| +0.0 [+0.0, +0.0] 0 | 3/3 |"
    )
    assert lines[-1].startswith("| 0.4 | node (mean) | 2 |")


def test_adam_economics_sums_the_shared_batches() -> None:
    """Per opening: share of episodes, success, turns and the return at each cost."""
    rows = [
        {"stats": {"n_tool": 3, "success_tool": 3, "turns_tool": 6, "n_direct": 1}},
        {"stats": {"n_tool": 1, "success_tool": 0, "turns_tool": 2, "n_direct": 3}},
    ]
    for row in rows:
        row["stats"].update(success_direct=1, turns_direct=row["stats"]["n_direct"])
    assert adam.economics(rows)[2:] == [
        "| tool | 0.500 | 0.750 | 2.00 | +0.750 | -0.050 |",
        "| direct | 0.500 | 0.500 | 1.00 | +0.500 | +0.100 |",
    ]
