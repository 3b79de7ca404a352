"""Property tests of every estimator on generated valid logs (hypothesis).

Generated logs have random tasks, trajectories (1-4 turns), rewards, roles, state
keys, node ids, information gain and q values, in random row order. Checked:
agreement with the per-row reference implementation (rtol 1e-9), zero group
means where the definition implies them, finite output, invariance to row order,
and exact zeros for singleton and constant-score groups.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnrl.credit import compute_advantages, compute_credit, list_estimators, reference
from turnrl.table import TurnTable

ESTIMATORS = list_estimators()
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

rewards = st.one_of(
    st.sampled_from([0.0, 0.0, 1.0, -1.0, 0.5]),
    st.floats(-10, 10, allow_nan=False, allow_infinity=False),
)
optional_float = st.one_of(st.none(), st.floats(-5, 5, allow_nan=False, allow_infinity=False))


@st.composite
def logs(
    draw: st.DrawFn,
    *,
    max_tasks: int = 4,
    max_trajs: int = 4,
    constant_outcome: bool = False,
) -> list[dict[str, Any]]:
    """A valid turn log in random row order."""
    records = []
    for t in range(draw(st.integers(1, max_tasks))):
        final = draw(rewards)
        for j in range(draw(st.integers(1, max_trajs))):
            length = draw(st.integers(1, 4))
            for k in range(length):
                last = k == length - 1
                reward = (final if last else 0.0) if constant_outcome else draw(rewards)
                records.append(
                    {
                        "task_id": f"t{t}",
                        "traj_id": f"t{t}-{j}",
                        "turn": k,
                        "role": draw(st.sampled_from(["planner", "coder"])),
                        "reward": reward,
                        "state_key": draw(st.sampled_from([None, "s0", "s1", "s2"])),
                        # Branch points: a few candidate nodes per (task, turn).
                        "node_id": f"t{t}/{k}/{draw(st.integers(0, 1))}",
                        "info_gain": None if last else draw(optional_float),
                        "q": draw(st.floats(-3, 3, allow_nan=False)),
                    }
                )
    return draw(st.permutations(records))


options = {
    "grpo_mixed": st.fixed_dictionaries(
        {"use_std": st.booleans(), "lone": st.sampled_from(["zero", "raw"])}
    ),
    "grpo": st.fixed_dictionaries({"use_std": st.booleans()}),
    "dr_grpo": st.just({}),
    "rloo": st.just({}),
    "turn_group": st.fixed_dictionaries({"gamma": st.floats(0, 1), "use_std": st.booleans()}),
    "role_turn": st.fixed_dictionaries({"gamma": st.floats(0, 1), "use_std": st.booleans()}),
    "gigpo": st.fixed_dictionaries(
        {
            "gamma": st.floats(0, 1),
            "omega": st.floats(0, 2),
            "episode_use_std": st.booleans(),
            "step_use_std": st.booleans(),
        }
    ),
    "node": st.fixed_dictionaries({"gamma": st.floats(0, 1), "use_std": st.booleans()}),
    "q": st.fixed_dictionaries({"use_std": st.booleans(), "std_floor": st.floats(0, 2)}),
    "a2tgpo": st.fixed_dictionaries(
        {
            "alpha": st.floats(0, 1),
            "gamma": st.floats(0, 1),
            "beta": st.floats(0, 1),
            "ig_norm": st.sampled_from(["turn", "joint"]),
            "rescale": st.booleans(),
        }
    ),
    "igpo": st.fixed_dictionaries({"gamma": st.floats(0, 1), "use_std": st.booleans()}),
}


def group_sums(values: np.ndarray, keys: list[Hashable | None]) -> list[tuple[float, float]]:
    """Per group: (sum of values, tolerance scaled by size and magnitude)."""
    members: dict[Hashable, list[float]] = defaultdict(list)
    for value, key in zip(values, keys, strict=True):
        if key is not None:
            members[key].append(float(value))
    return [(sum(v), 1e-9 * len(v) * (1 + max(abs(x) for x in v))) for v in members.values()]


def assert_zero_mean(values: np.ndarray, keys: list[Hashable | None]) -> None:
    for total, tol in group_sums(values, keys):
        assert abs(total) <= tol, (total, tol)


def first_row_per_traj(records: list[dict[str, Any]]) -> np.ndarray:
    seen: set[str] = set()
    mask = []
    for r in records:
        mask.append(r["traj_id"] not in seen)
        seen.add(r["traj_id"])
    return np.array(mask)


def test_every_estimator_is_covered():
    assert sorted(options) == sorted(ESTIMATORS)


@SETTINGS
@given(records=logs(), data=st.data())
def test_agrees_with_reference_and_is_finite(records, data):
    table = TurnTable.from_records(records)
    rows = reference.rows_from_table(table)
    for name in ESTIMATORS:
        params = data.draw(options[name], label=name)
        credit = compute_credit(table, name, **params)
        assert credit.advantages.dtype == np.float64
        assert credit.advantages.shape == (len(records),)
        assert np.all(np.isfinite(credit.advantages)), name
        want = reference.REFERENCE[name](rows, **params)
        np.testing.assert_allclose(credit.advantages, want, rtol=1e-9, atol=1e-9, err_msg=name)
        if name == "a2tgpo":
            clip = reference.a2tgpo_clip_factor(
                rows, beta=params["beta"], ig_norm=params["ig_norm"]
            )
            np.testing.assert_allclose(credit.clip_factor, clip, rtol=1e-9, atol=1e-12)


@SETTINGS
@given(records=logs(), data=st.data())
def test_row_order_does_not_matter(records, data):
    permuted = data.draw(st.permutations(range(len(records))), label="permutation")
    table = TurnTable.from_records(records)
    moved = TurnTable.from_records([records[i] for i in permuted])
    for name in ESTIMATORS:
        params = data.draw(options[name], label=name)
        base = compute_credit(table, name, **params)
        other = compute_credit(moved, name, **params)
        np.testing.assert_allclose(
            other.advantages, base.advantages[permuted], rtol=1e-9, atol=1e-12, err_msg=name
        )
        if base.clip_factor is not None:
            np.testing.assert_allclose(other.clip_factor, base.clip_factor[permuted], rtol=1e-9)


@SETTINGS
@given(records=logs(), use_std=st.booleans(), gamma=st.floats(0, 1))
def test_zero_mean_within_the_defined_groups(records, use_std, gamma):
    table = TurnTable.from_records(records)
    adv = {
        name: compute_advantages(table, name, **params)
        for name, params in [
            ("grpo", {"use_std": use_std}),
            ("dr_grpo", {}),
            ("rloo", {}),
            ("grpo_mixed", {"use_std": use_std}),
            ("turn_group", {"gamma": gamma, "use_std": use_std}),
            ("role_turn", {"gamma": gamma, "use_std": use_std}),
            ("node", {"gamma": gamma, "use_std": use_std}),
            ("q", {"use_std": use_std}),
            ("gigpo", {"gamma": gamma}),
            ("igpo", {"gamma": 0.0, "use_std": use_std}),  # gamma 0: the normalised signal
            ("a2tgpo", {"gamma": gamma, "alpha": 0.0}),
        ]
    }
    task = [r["task_id"] for r in records]
    first = first_row_per_traj(records)
    # Outcome estimators: zero mean over the task's trajectories, each counted once.
    for name in ("grpo", "dr_grpo", "rloo"):
        assert_zero_mean(adv[name][first], [t for t, f in zip(task, first, strict=True) if f])
    assert_zero_mean(adv["grpo_mixed"], task)
    assert_zero_mean(adv["igpo"], task)
    assert_zero_mean(adv["turn_group"], [(r["task_id"], r["turn"]) for r in records])
    assert_zero_mean(adv["role_turn"], [(r["task_id"], r["role"], r["turn"]) for r in records])
    assert_zero_mean(adv["node"], [r["node_id"] for r in records])
    assert_zero_mean(adv["q"], [r["node_id"] for r in records])
    # GiGPO's step part (gigpo - dr_grpo) has zero mean per (task, state), 0 without state.
    step = adv["gigpo"] - adv["dr_grpo"]
    states = [None if r["state_key"] is None else (r["task_id"], r["state_key"]) for r in records]
    assert_zero_mean(step, states)
    assert np.all(step[[s is None for s in states]] == 0.0)
    # alpha = 0: A2TGPO is trajectory GRPO.
    np.testing.assert_array_equal(adv["a2tgpo"], compute_advantages(table, "grpo"))
    # normIG (recovered from the clip factor, beta = 1: c = 1 + tanh(normIG / 2)) has zero
    # mean per (task, turn) over the rows that have IG.
    clip = compute_credit(table, "a2tgpo", beta=1.0).clip_factor
    norm_ig = 2 * np.arctanh(np.clip(clip - 1, -1 + 1e-15, 1 - 1e-15))
    has_ig = [r["info_gain"] is not None for r in records]
    assert_zero_mean(norm_ig, [(r["task_id"], r["turn"]) if h else None
                               for r, h in zip(records, has_ig, strict=True)])  # fmt: skip
    assert np.all(clip[~np.array(has_ig)] == 1.0)


@SETTINGS
@given(records=logs(max_trajs=1), data=st.data())
def test_singleton_groups_give_zero(records, data):
    # One trajectory per task; every row its own node and no repeated state.
    for i, r in enumerate(records):
        r["node_id"] = f"row{i}"
        r["state_key"] = None if r["state_key"] is None else f"s{i}"
    table = TurnTable.from_records(records)
    for name in ESTIMATORS:
        if name == "igpo":  # normalises over rows of the task, not over trajectories
            continue
        params = data.draw(options[name], label=name)
        if name == "grpo_mixed":
            params["lone"] = "zero"  # "raw" (verl's rule) keeps a lone row's score
        if name == "a2tgpo":  # joint IG normalisation also pools a trajectory's own turns
            params["ig_norm"] = "turn"
        credit = compute_credit(table, name, **params)
        assert np.all(credit.advantages == 0.0), name
        if credit.clip_factor is not None:
            assert np.all(credit.clip_factor == 1.0)


@SETTINGS
@given(records=logs(constant_outcome=True), data=st.data())
def test_constant_score_groups_give_exactly_zero(records, data):
    # Every trajectory of a task has the same outcome, paid on its last turn, so at
    # gamma 1 every row of the task has G_t = that outcome; q is constant per node.
    for r in records:
        r["info_gain"] = None
        r["q"] = sum(map(ord, r["node_id"])) / 7.0
    table = TurnTable.from_records(records)
    for name in ESTIMATORS:
        if name == "igpo":  # non-final signals are 0, the final one is the outcome
            continue
        params = data.draw(options[name], label=name)
        if "gamma" in params:
            params["gamma"] = 1.0
        if name == "grpo_mixed":
            params["lone"] = "zero"  # "raw" (verl's rule) keeps a lone row's score
        adv = compute_advantages(table, name, **params)
        assert np.all(adv == 0.0), (name, adv)


@SETTINGS
@given(records=logs())
def test_grpo_mixed_equals_grpo_when_every_trajectory_has_one_turn(records):
    one_turn = [dict(r, turn=0) for r in records if r["turn"] == 0]
    table = TurnTable.from_records(one_turn)
    np.testing.assert_allclose(
        compute_advantages(table, "grpo_mixed"), compute_advantages(table, "grpo"), atol=1e-12
    )


@SETTINGS
@given(records=logs(), use_std=st.booleans())
def test_grpo_mixed_raw_lone_rule_changes_only_one_row_tasks(records, use_std):
    table = TurnTable.from_records(records)
    zero = compute_advantages(table, "grpo_mixed", use_std=use_std)
    raw = compute_advantages(table, "grpo_mixed", use_std=use_std, lone="raw")
    rows_of_task = np.bincount(table.task_code)[table.task_code]
    alone = rows_of_task == 1
    np.testing.assert_array_equal(raw[~alone], zero[~alone])
    outcome = {}
    for r in records:
        outcome[r["traj_id"]] = outcome.get(r["traj_id"], 0.0) + r["reward"]
    score = np.array([outcome[r["traj_id"]] for r in records])
    scale = 1 / (1 + 1e-6) if use_std else 1.0
    np.testing.assert_allclose(raw[alone], score[alone] * scale, rtol=1e-12, atol=0)


def test_large_values_stay_finite():
    records = [
        {"task_id": "t", "traj_id": f"j{j}", "turn": 0, "reward": 1e150 * (j - 1.5),
         "info_gain": 1e150 * j, "q": 1e150 * j, "node_id": "n", "state_key": "s"}
        for j in range(4)
    ]  # fmt: skip
    table = TurnTable.from_records(records)
    for name in ESTIMATORS:
        credit = compute_credit(table, name)
        assert np.all(np.isfinite(credit.advantages)), name
        if credit.clip_factor is not None:
            assert np.all(np.isfinite(credit.clip_factor))
    assert math.isfinite(float(compute_advantages(table, "grpo")[0]))
