"""Group operations and discounted sums that every estimator is built on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.credit.returns import discounted_suffix_sum, return_to_go, trajectory_outcome
from turnrl.credit.segments import dense_codes, leave_one_out, normalise_in_groups
from turnrl.table import TurnTable


def test_normalise_matches_the_issue_formula():
    # [1, 1, 0, 1, 1, 0]: mean 2/3, sample std sqrt(4/15) = 0.5164 -> +0.6455 / -1.2910
    out = normalise_in_groups(np.array([1.0, 1, 0, 1, 1, 0]), np.zeros(6, dtype=np.int64))
    std = np.sqrt(4 / 15)
    np.testing.assert_allclose(out[:2], (1 / 3) / (std + 1e-6), rtol=1e-12)
    np.testing.assert_allclose(out[2], (-2 / 3) / (std + 1e-6), rtol=1e-12)


def test_singletons_and_rows_without_group_get_zero():
    out = normalise_in_groups(np.array([1.0, 2.0, 4.0, 5.0]), np.array([0, -1, 0, 1]))
    k = 1.5 / (np.sqrt(4.5) + 1e-6)
    np.testing.assert_allclose(out, [-k, 0.0, k, 0.0], rtol=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    value=st.floats(-1e6, 1e6, allow_nan=False),
    n=st.integers(2, 50),
    use_std=st.booleans(),
)
def test_constant_groups_are_exactly_zero(value, n, use_std):
    codes = np.zeros(n, dtype=np.int64)
    scores = np.full(n, value)
    assert np.all(normalise_in_groups(scores, codes, 1, use_std=use_std) == 0.0)
    assert np.all(leave_one_out(scores, codes, 1) == 0.0)


def test_leave_one_out():
    # group 0: [1, 2, 4]: 1 - 3 = -2, 2 - 2.5 = -0.5, 4 - 1.5 = 2.5; group 1 alone -> 0
    out = leave_one_out(np.array([1.0, 2, 4, 5]), np.array([0, 0, 0, 1]), 2)
    np.testing.assert_allclose(out, [-2.0, -0.5, 2.5, 0.0], rtol=1e-12)


@pytest.mark.parametrize("scale", [1, 10**6], ids=["lookup", "unique"])
def test_dense_codes_numbers_distinct_tuples(scale):
    # scale 10**6 makes the key space larger than 4 * rows: the np.unique path.
    a = np.array([0, 1, 0, 1, 2, -1]) * scale
    a[5] = -1
    b = np.array([3, 3, 3, 4, 3, 3])
    codes, n = dense_codes(a, b)
    assert n == 4
    assert codes[5] == -1
    assert codes[0] == codes[2]
    assert len({codes[0], codes[1], codes[3], codes[4]}) == 4
    assert set(codes[:5]) == set(range(4))


def test_discounted_suffix_sum_with_mask_discounts_by_turn_distance():
    # One trajectory, values [1, 2, 4, 8], mask [T, F, T, F], gamma 0.5:
    # t0: 1 + 0.25 * 4 = 2 (2 terms); t1: 0.5 * 4 = 2 (1 term); t2: 4 (1); t3: 0 (0).
    table = TurnTable.from_arrays(task_id=[0] * 4, traj_id=[0] * 4, turn=[2, 0, 3, 1],
                                  reward=[0.0] * 4)  # fmt: skip
    values = np.array([4.0, 1.0, 8.0, 2.0])  # rows in the order of `turn` above
    mask = np.array([True, True, False, False])
    sums, terms = discounted_suffix_sum(table, values, 0.5, mask=mask)
    np.testing.assert_array_equal(sums, [4.0, 2.0, 0.0, 2.0])
    np.testing.assert_array_equal(terms, [1.0, 2.0, 0.0, 1.0])
    sums, terms = discounted_suffix_sum(table, values, 1.0)
    np.testing.assert_array_equal(sums, [12.0, 15.0, 8.0, 14.0])
    np.testing.assert_array_equal(terms, [2.0, 4.0, 1.0, 3.0])


def test_long_trajectory_returns_do_not_overflow():
    n = 5000
    table = TurnTable.from_arrays(task_id=[0] * n, traj_id=[0] * n, turn=np.arange(n),
                                  reward=np.ones(n))  # fmt: skip
    g = return_to_go(table, 0.9)
    assert np.all(np.isfinite(g))
    # G_t = (1 - 0.9^(n - t)) / (1 - 0.9)
    expected = (1 - 0.9 ** (n - np.arange(n))) / 0.1
    np.testing.assert_allclose(g, expected, rtol=1e-12)
    assert trajectory_outcome(table)[0] == n
