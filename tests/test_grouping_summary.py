"""The grouping experiment's summaries: the verdict rule of the learning runs and the
projection tables (examples/grouping/run.py, gradient.py) on hand-built numbers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grouping"


def _load(name: str):
    """The example script as a module under a unique name (other examples have a run.py)."""
    spec = importlib.util.spec_from_file_location(f"grouping_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gradient = _load("gradient")
run = _load("run")

MIXED, GRPO, NODE = run.DEFAULT_ARMS


def test_verdict_reproduced_only_when_mixed_falls_and_both_others_rise() -> None:
    change = {
        MIXED: np.array([-0.2, -0.3, -0.25]),
        GRPO: np.array([0.2, 0.3, 0.25]),
        NODE: np.array([0.1, 0.2, 0.15]),
    }
    paired = {GRPO: change[MIXED] - change[GRPO], NODE: change[MIXED] - change[NODE]}
    assert run.verdict(change, paired).startswith("reproduced")
    change[NODE] = np.array([-0.1, 0.2, 0.0])  # node within its spread: not a rise
    assert run.verdict(change, paired).startswith("neither")


def test_verdict_refuted_when_paired_differences_stay_within_the_seed_spread() -> None:
    change = {
        MIXED: np.array([-0.2, -0.3, -0.25]),
        GRPO: np.array([-0.25, -0.2, -0.3]),
        NODE: np.array([-0.3, -0.25, -0.2]),
    }
    paired = {GRPO: np.array([0.05, -0.1, 0.05]), NODE: np.array([0.1, -0.05, -0.05])}
    assert run.verdict(change, paired).startswith("refuted")
    paired[NODE] = np.array([0.3, 0.31, 0.29])  # a consistent paired difference
    assert run.verdict(change, paired).startswith("neither")


def test_verdict_needs_the_three_default_arms() -> None:
    assert run.verdict({MIXED: np.array([0.1, 0.2])}, {}).startswith("no verdict")


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
