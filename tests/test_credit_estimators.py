"""Every estimator on small hand-built logs, with the arithmetic written out.

Expected values are written as the formulas of the definitions (with the issue's
``std + 1e-6``), so they match to ~1e-12; the comments give the rounded numbers.
Values are compared per ``(traj_id, turn)``, so the same expectations also hold
for a shuffled copy of each log.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from turnrl.credit import (
    compute_advantages,
    compute_credit,
    get_estimator,
    list_estimators,
    reference,
)
from turnrl.credit.estimators import grpo_mixed
from turnrl.errors import TurnRecordError
from turnrl.table import TurnTable

EPS = 1e-6
ALL = [
    "a2tgpo",
    "dr_grpo",
    "gigpo",
    "grpo",
    "grpo_mixed",
    "igpo",
    "node",
    "q",
    "rloo",
    "role_turn",
    "turn_group",
]


def rec(task: str, traj: str, turn: int, reward: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"task_id": task, "traj_id": traj, "turn": turn, "reward": reward, **extra}


def by_key(records: list[dict[str, Any]], values: np.ndarray) -> dict[tuple[str, int], float]:
    return {(r["traj_id"], r["turn"]): float(v) for r, v in zip(records, values, strict=True)}


def credit_by_key(records, estimator, **params) -> dict[tuple[str, int], float]:
    table = TurnTable.from_records(records)
    return by_key(records, compute_advantages(table, estimator, **params))


def assert_matches(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


def shuffled(records: list[dict[str, Any]], seed: int = 7) -> list[dict[str, Any]]:
    out = list(records)
    random.Random(seed).shuffle(out)
    return out


def sample_std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


# --------------------------------------------------------------------------
# A lone-row task next to a normal one: turnrl gives the lone row 0, verl its raw score.
LONE = [
    rec("solo", "s", 0, 0.7),  # a task with a single row (e.g. one rollout, one turn)
    rec("q", "a", 0),
    rec("q", "a", 1, 1.0),
    rec("q", "c", 0, -0.25),
]


@pytest.mark.parametrize("use_std", [True, False])
def test_grpo_mixed_lone_rule(use_std):
    # task q: rows scored [1, 1, -0.25]: mean 0.5833, deviations +5/12, +5/12, -5/6;
    # var = (2 * 25/144 + 100/144) / 2 = 150/288, std 0.7217.
    dev = {("a", 0): 5 / 12, ("a", 1): 5 / 12, ("c", 0): -5 / 6}
    std = math.sqrt(150 / 288)
    q_part = {k: v / (std + EPS) if use_std else v for k, v in dev.items()}
    zero = credit_by_key(LONE, "grpo_mixed", use_std=use_std)
    assert_matches(zero, {("s", 0): 0.0, **q_part})
    assert_matches(credit_by_key(LONE, "grpo_mixed", use_std=use_std, lone="zero"), zero)
    # verl: mean 0 and std 1 for a group of one -> (0.7 - 0) / (1 + 1e-6), or 0.7 - 0.
    raw = credit_by_key(LONE, "grpo_mixed", use_std=use_std, lone="raw")
    assert_matches(raw, {("s", 0): 0.7 / (1 + EPS) if use_std else 0.7, **q_part})
    rows = reference.rows_from_table(TurnTable.from_records(LONE))
    want = [raw[r["traj_id"], r["turn"]] for r in rows]
    assert reference.grpo_mixed(rows, use_std=use_std, lone="raw") == pytest.approx(want, rel=1e-12)


def test_grpo_mixed_lone_rule_rejects_unknown_values():
    with pytest.raises(TypeError, match="parameter 'lone'"):
        credit_by_key(LONE, "grpo_mixed", lone="one")
    with pytest.raises(ValueError, match="lone must be one of zero, raw; got 'one'"):
        grpo_mixed(TurnTable.from_records(LONE), lone="one")  # called directly


# --------------------------------------------------------------------------
# Agent Lightning #489: 4 rollouts of one question. a, b: tool call then answer
# (2 turns, reward 1 at the end); c, d: direct answer (1 turn, reward 0).
AL489 = [
    rec("q", "a", 0, node_id="root"),
    rec("q", "a", 1, 1.0, node_id="a1"),
    rec("q", "b", 0, node_id="root"),
    rec("q", "b", 1, 1.0, node_id="b1"),
    rec("q", "c", 0, node_id="root"),
    rec("q", "d", 0, node_id="root"),
]


@pytest.mark.parametrize("records", [AL489, shuffled(AL489)], ids=["ordered", "shuffled"])
def test_issue_489_mixed_vs_rollout_grouping(records):
    # grpo_mixed: rows scored [1, 1, 1, 1, 0, 0] (a and b count twice).
    # mean 4/6 = 0.667; deviations +1/3, -2/3; var = (4/9 + 2*4/9) / 5 = 12/45;
    # std = 0.516 -> +0.3333/0.5164 = +0.645 (tool rows), -0.6667/0.5164 = -1.291.
    std = math.sqrt(12 / 45)
    up, down = (1 / 3) / (std + EPS), (-2 / 3) / (std + EPS)
    got = credit_by_key(records, "grpo_mixed")
    assert_matches(got, {("a", 0): up, ("a", 1): up, ("b", 0): up, ("b", 1): up,
                         ("c", 0): down, ("d", 0): down})  # fmt: skip
    assert got["a", 0] == pytest.approx(0.645, abs=5e-4)
    assert got["c", 0] == pytest.approx(-1.291, abs=5e-4)

    # grpo: outcomes [1, 1, 0, 0] once each: mean 0.5, var = 4 * 0.25 / 3, std 0.577
    # -> +-0.5/0.5774 = +-0.866 on every turn of the trajectory.
    g = 0.5 / (math.sqrt(1 / 3) + EPS)
    expected_grpo = {("a", 0): g, ("a", 1): g, ("b", 0): g, ("b", 1): g, ("c", 0): -g, ("d", 0): -g}
    assert_matches(credit_by_key(records, "grpo"), expected_grpo)
    assert g == pytest.approx(0.866, abs=5e-4)

    # dr_grpo: outcome - 0.5 = +-0.5.  rloo: a: 1 - (1+0+0)/3 = 2/3; c: 0 - 2/3.
    half = {
        ("a", 0): 0.5,
        ("a", 1): 0.5,
        ("b", 0): 0.5,
        ("b", 1): 0.5,
        ("c", 0): -0.5,
        ("d", 0): -0.5,
    }
    assert_matches(credit_by_key(records, "dr_grpo"), half)
    third = {k: v * 4 / 3 for k, v in half.items()}  # 0.5 * 4/3 = 2/3
    assert_matches(credit_by_key(records, "rloo"), third)

    # turn_group: G_t = [a: 1, 1; b: 1, 1; c: 0; d: 0]. (q, 0): [1, 1, 0, 0] -> +-0.866;
    # (q, 1): [1, 1] constant -> 0.
    tg = {("a", 0): g, ("a", 1): 0.0, ("b", 0): g, ("b", 1): 0.0, ("c", 0): -g, ("d", 0): -g}
    assert_matches(credit_by_key(records, "turn_group"), tg)

    # node: "root" holds the four turn-0 rows, G = [1, 1, 0, 0], mean 0.5 -> +-0.5;
    # a1, b1 are singletons -> 0.
    nd = {
        ("a", 0): 0.5,
        ("a", 1): 0.0,
        ("b", 0): 0.5,
        ("b", 1): 0.0,
        ("c", 0): -0.5,
        ("d", 0): -0.5,
    }
    assert_matches(credit_by_key(records, "node"), nd)
    assert_matches(credit_by_key(records, "rtpo"), nd)


# --------------------------------------------------------------------------
# A tree: four trajectories branch from "r" at turn 0; x1, x2 share "n1" at
# turn 1, x3, x4 share "n2"; turn-2 nodes are distinct.
# rewards: x1 [0, 0, 1]; x2 [0, 0, 0]; x3 [0, -0.5, 2]; x4 [0, 1]
# G (gamma=1): x1 [1, 1, 1]; x2 [0, 0, 0]; x3 [1.5, 1.5, 2]; x4 [1, 1]
TREE = [
    rec("T", "x1", 0, node_id="r"),
    rec("T", "x1", 1, node_id="n1"),
    rec("T", "x1", 2, 1.0, node_id="x1-2"),
    rec("T", "x2", 0, node_id="r"),
    rec("T", "x2", 1, node_id="n1"),
    rec("T", "x2", 2, node_id="x2-2"),
    rec("T", "x3", 0, node_id="r"),
    rec("T", "x3", 1, -0.5, node_id="n2"),
    rec("T", "x3", 2, 2.0, node_id="x3-2"),
    rec("T", "x4", 0, node_id="r"),
    rec("T", "x4", 1, 1.0, node_id="n2"),
]


@pytest.mark.parametrize("records", [TREE, shuffled(TREE, 3)], ids=["ordered", "shuffled"])
def test_tree_node_groups(records):
    # r: G0 = [1, 0, 1.5, 1], mean 0.875 -> [0.125, -0.875, 0.625, 0.125]
    # n1: [1, 0] mean 0.5 -> [0.5, -0.5]; n2: [1.5, 1] mean 1.25 -> [0.25, -0.25]
    expected = {
        ("x1", 0): 0.125, ("x2", 0): -0.875, ("x3", 0): 0.625, ("x4", 0): 0.125,
        ("x1", 1): 0.5, ("x2", 1): -0.5, ("x3", 1): 0.25, ("x4", 1): -0.25,
        ("x1", 2): 0.0, ("x2", 2): 0.0, ("x3", 2): 0.0,
    }  # fmt: skip
    assert_matches(credit_by_key(records, "node"), expected)

    # gamma = 0.5: x1 G = [0.25, 0.5, 1]; x2 0; x3: G2 = 2, G1 = -0.5 + 1 = 0.5, G0 = 0.25;
    # x4: G1 = 1, G0 = 0.5.  r: [0.25, 0, 0.25, 0.5] mean 0.25; n1: [0.5, 0]; n2: [0.5, 1].
    expected = {
        ("x1", 0): 0.0, ("x2", 0): -0.25, ("x3", 0): 0.0, ("x4", 0): 0.25,
        ("x1", 1): 0.25, ("x2", 1): -0.25, ("x3", 1): -0.25, ("x4", 1): 0.25,
        ("x1", 2): 0.0, ("x2", 2): 0.0, ("x3", 2): 0.0,
    }  # fmt: skip
    assert_matches(credit_by_key(records, "node", gamma=0.5), expected)

    # use_std: n1 [1, 0] has std sqrt(0.5) -> +-0.5 / (0.7071 + 1e-6) = +-0.7071.
    got = credit_by_key(records, "node", use_std=True)
    assert got["x1", 1] == pytest.approx(0.5 / (math.sqrt(0.5) + EPS), rel=1e-12)
    assert got["x2", 1] == pytest.approx(-0.5 / (math.sqrt(0.5) + EPS), rel=1e-12)


@pytest.mark.parametrize("records", [TREE, shuffled(TREE, 5)], ids=["ordered", "shuffled"])
def test_tree_outcome_and_turn_estimators(records):
    outcomes = {"x1": 1.0, "x2": 0.0, "x3": 1.5, "x4": 1.0}
    turns = {"x1": 3, "x2": 3, "x3": 3, "x4": 2}
    # grpo: mean 0.875, deviations [0.125, -0.875, 0.625, 0.125],
    # var = (0.015625 + 0.765625 + 0.390625 + 0.015625) / 3 = 0.39583, std 0.62915.
    std = math.sqrt(1.1875 / 3)
    expected = {
        (t, k): (o - 0.875) / (std + EPS) for t, o in outcomes.items() for k in range(turns[t])
    }
    assert_matches(credit_by_key(records, "grpo"), expected)
    # rloo: x1: 1 - (0 + 1.5 + 1)/3 = 0.1667; x2: 0 - 3.5/3 = -1.1667;
    # x3: 1.5 - 2/3 = 0.8333; x4: 1 - 2.5/3 = 0.1667.
    total = sum(outcomes.values())
    expected = {(t, k): o - (total - o) / 3 for t, o in outcomes.items() for k in range(turns[t])}
    assert_matches(credit_by_key(records, "rloo"), expected)
    # grpo_mixed: rows scored [1,1,1, 0,0,0, 1.5,1.5,1.5, 1,1] (11 rows, sum 9.5).
    scores = [o for t, o in outcomes.items() for _ in range(turns[t])]
    mean, std = sum(scores) / 11, sample_std(scores)
    expected = {
        (t, k): (o - mean) / (std + EPS) for t, o in outcomes.items() for k in range(turns[t])
    }
    assert_matches(credit_by_key(records, "grpo_mixed"), expected)
    # turn_group: (T, 0) and (T, 1) both hold G = [1, 0, 1.5, 1] (same numbers as grpo);
    # (T, 2): [1, 0, 2], mean 1, std 1 -> [0, -1, 1] / (1 + 1e-6).
    std01 = math.sqrt(1.1875 / 3)
    expected = {(t, k): (o - 0.875) / (std01 + EPS) for t, o in outcomes.items() for k in (0, 1)}
    expected.update({("x1", 2): 0.0, ("x2", 2): -1 / (1 + EPS), ("x3", 2): 1 / (1 + EPS)})
    assert_matches(credit_by_key(records, "turn_group"), expected)


# --------------------------------------------------------------------------
# GiGPO anchor states. Task G: g1 states [s0, sA, sB] rewards [0, 0, 1];
# g2 states [s0, sA] rewards [0, 0]; g3 states [s0, none] rewards [0, 1].
# Task H (one trajectory) reuses the name "s0": states never group across tasks.
GIGPO = [
    rec("G", "g1", 0, state_key="s0"),
    rec("G", "g1", 1, state_key="sA"),
    rec("G", "g1", 2, 1.0, state_key="sB"),
    rec("G", "g2", 0, state_key="s0"),
    rec("G", "g2", 1, state_key="sA"),
    rec("G", "g3", 0, state_key="s0"),
    rec("G", "g3", 1, 1.0),
    rec("H", "h1", 0, 5.0, state_key="s0"),
]


@pytest.mark.parametrize("records", [GIGPO, shuffled(GIGPO, 11)], ids=["ordered", "shuffled"])
def test_gigpo_episode_plus_step(records):
    # A_E (dr_grpo): outcomes g1 1, g2 0, g3 1 -> mean 2/3 -> [1/3, -2/3, 1/3]; h1 alone -> 0.
    # G (gamma 0.95): g1 [0.9025, 0.95, 1]; g2 [0, 0]; g3 [0.95, 1]; h1 [5].
    # A_S: (G, s0) [0.9025, 0, 0.95] mean 0.6175 -> [0.285, -0.6175, 0.3325]
    #      (G, sA) [0.95, 0] mean 0.475 -> [0.475, -0.475]; sB, (H, s0) alone -> 0;
    #      g3 turn 1 has no state -> 0.
    s0_mean = (0.9025 + 0.0 + 0.95) / 3
    expected = {
        ("g1", 0): 1 / 3 + (0.9025 - s0_mean),  # 0.6183
        ("g1", 1): 1 / 3 + 0.475,  # 0.8083
        ("g1", 2): 1 / 3,
        ("g2", 0): -2 / 3 + (0.0 - s0_mean),  # -1.2842
        ("g2", 1): -2 / 3 - 0.475,  # -1.1417
        ("g3", 0): 1 / 3 + (0.95 - s0_mean),  # 0.6658
        ("g3", 1): 1 / 3,
        ("h1", 0): 0.0,
    }
    assert_matches(credit_by_key(records, "gigpo"), expected)
    # omega = 0.5 halves the step part only.
    got = credit_by_key(records, "gigpo", omega=0.5)
    assert got["g1", 1] == pytest.approx(1 / 3 + 0.5 * 0.475, rel=1e-12)
    # episode_use_std: A_E becomes grpo: +-(1/3)/(std + eps) with std = sqrt(1/3).
    got = credit_by_key(records, "gigpo", episode_use_std=True)
    assert got["g1", 2] == pytest.approx((1 / 3) / (math.sqrt(1 / 3) + EPS), rel=1e-12)
    # step_use_std: (G, sA) [0.95, 0] -> +-0.475 / (0.6718 + 1e-6) on top of A_E.
    got = credit_by_key(records, "gigpo", step_use_std=True)
    sa = 0.475 / (sample_std([0.95, 0.0]) + EPS)
    assert got["g2", 1] == pytest.approx(-2 / 3 - sa, rel=1e-12)


# --------------------------------------------------------------------------
# Roles (AT-GRPO). m1, m2: planner at turn 0, coder at turn 1; m3, m4: the reverse.
# rewards: m1 [0, 1]; m2 [0, 0]; m3 [1, 0]; m4 [0, 0] -> G: m1 [1, 1]; m2 0; m3 [1, 0]; m4 0.
ROLES = [
    rec("M", "m1", 0, role="planner"),
    rec("M", "m1", 1, 1.0, role="coder"),
    rec("M", "m2", 0, role="planner"),
    rec("M", "m2", 1, role="coder"),
    rec("M", "m3", 0, 1.0, role="coder"),
    rec("M", "m3", 1, role="planner"),
    rec("M", "m4", 0, role="coder"),
    rec("M", "m4", 1, role="planner"),
]


@pytest.mark.parametrize("records", [ROLES, shuffled(ROLES, 2)], ids=["ordered", "shuffled"])
def test_role_turn_groups_by_role(records):
    # (M, planner, 0): [1, 0]; (M, coder, 0): [1, 0]; (M, coder, 1): [1, 0]:
    # each +-0.5 / (sqrt(0.5) + 1e-6) = +-0.7071. (M, planner, 1): [0, 0] -> 0.
    r = 0.5 / (math.sqrt(0.5) + EPS)
    expected = {
        ("m1", 0): r, ("m2", 0): -r, ("m3", 0): r, ("m4", 0): -r,
        ("m1", 1): r, ("m2", 1): -r, ("m3", 1): 0.0, ("m4", 1): 0.0,
    }  # fmt: skip
    assert_matches(credit_by_key(records, "role_turn"), expected)
    # turn_group ignores roles: (M, 1) = [1, 0, 0, 0], mean 0.25, std 0.5 -> [1.5, -0.5, ...].
    got = credit_by_key(records, "turn_group")
    assert got["m1", 1] == pytest.approx(0.75 / (0.5 + EPS), rel=1e-12)
    assert got["m3", 1] == pytest.approx(-0.25 / (0.5 + EPS), rel=1e-12)
    assert got["m1", 0] == pytest.approx(0.5 / (math.sqrt(1 / 3) + EPS), rel=1e-12)


# --------------------------------------------------------------------------
# Iterative GRPO: three candidates at the logged state "root" with q [0.2, 0.5, 0.8].
QLOG = [
    rec("Q", "k1", 0, node_id="root", q=0.2),
    rec("Q", "k2", 0, node_id="root", q=0.5),
    rec("Q", "k3", 0, node_id="root", q=0.8),
    rec("Q", "k3", 1, 1.0, node_id="k3-1", q=0.9),
]


@pytest.mark.parametrize("records", [QLOG, shuffled(QLOG, 4)], ids=["ordered", "shuffled"])
def test_q_normalised_per_node(records):
    # mean 0.5, deviations [-0.3, 0, 0.3], std 0.3 -> [-1, 0, 1] * 0.3/(0.3 + 1e-6);
    # k3 turn 1 is alone at its node -> 0. Rewards play no role.
    k = 0.3 / (0.3 + EPS)
    expected = {("k1", 0): -k, ("k2", 0): 0.0, ("k3", 0): k, ("k3", 1): 0.0}
    got = credit_by_key(records, "q")
    assert got.keys() == expected.keys()
    for key, value in expected.items():  # 0.5 - 0.2 is not exactly 0.3 in floating point
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12)
    # mean only: [-0.3, 0, 0.3]
    assert credit_by_key(records, "q", use_std=False)["k1", 0] == pytest.approx(-0.3, rel=1e-9)
    # std floor 0.6 (above the std 0.3): [-0.3, 0, 0.3] / (0.6 + 1e-6); below it: plain std
    floored = credit_by_key(records, "q", std_floor=0.6)
    assert floored["k1", 0] == pytest.approx(-0.3 / (0.6 + EPS), rel=1e-9)
    assert floored["k3", 0] == pytest.approx(0.3 / (0.6 + EPS), rel=1e-9)
    assert credit_by_key(records, "q", std_floor=0.1)["k3", 0] == pytest.approx(k, rel=1e-9)


def test_q_rejects_a_negative_std_floor():
    with pytest.raises(ValueError, match="std_floor"):
        compute_credit(TurnTable.from_records(QLOG), "q", std_floor=-0.1)


def test_q_missing_names_line_and_field():
    records = [*QLOG[:2], rec("Q", "k3", 0, node_id="root"), rec("Q", "k4", 0, node_id="root")]
    table = TurnTable.from_records(records, source="log.jsonl")
    with pytest.raises(TurnRecordError, match=r"log\.jsonl:3: field 'q'") as info:
        compute_advantages(table, "q")
    assert info.value.line == 3 and info.value.field == "q"
    assert "2 of 4 rows" in str(info.value)


# --------------------------------------------------------------------------
# Information gain. Task A: a1 IG [0.4, 0.2, -] rewards [0, 0, 1];
# a2 IG [0.1, 0.0, -] rewards [0, 0, 0]; a3 IG [-0.2, -] rewards [0, 1].
IGLOG = [
    rec("A", "a1", 0, info_gain=0.4),
    rec("A", "a1", 1, info_gain=0.2),
    rec("A", "a1", 2, 1.0),
    rec("A", "a2", 0, info_gain=0.1),
    rec("A", "a2", 1, info_gain=0.0),
    rec("A", "a2", 2),
    rec("A", "a3", 0, info_gain=-0.2),
    rec("A", "a3", 1, 1.0),
]
# A^O (grpo): outcomes [1, 0, 1], mean 2/3, std sqrt(1/3) -> [0.5774, -1.1547, 0.5774]
AO = {t: (o - 2 / 3) / (math.sqrt(1 / 3) + EPS) for t, o in {"a1": 1, "a2": 0, "a3": 1}.items()}
# normIG: (A, 0): [0.4, 0.1, -0.2], mean 0.1, std 0.3 -> [k0, 0, -k0], k0 = 0.3/(0.3 + 1e-6)
#         (A, 1): [0.2, 0.0], mean 0.1, std sqrt(0.02) -> [k1, -k1], k1 = 0.1/(0.1414 + 1e-6)
K0 = (0.4 - 0.1) / (sample_std([0.4, 0.1, -0.2]) + EPS)
K1 = 0.1 / (math.sqrt(0.02) + EPS)


@pytest.mark.parametrize("records", [IGLOG, shuffled(IGLOG, 9)], ids=["ordered", "shuffled"])
def test_a2tgpo_advantages_and_clip(records):
    # D~ (gamma 1): a1 t0 (k0 + k1)/sqrt(2); a1 t1 k1; a2 t0 (0 - k1)/sqrt(2); a2 t1 -k1;
    # a3 t0 -k0 (one term). Answer turns (no IG) get A^O only.
    expected = {
        ("a1", 0): AO["a1"] + 0.3 * (K0 + K1) / math.sqrt(2),  # 0.5774 + 0.3621 = 0.9395
        ("a1", 1): AO["a1"] + 0.3 * K1,  # 0.5774 + 0.2121 = 0.7895
        ("a1", 2): AO["a1"],
        ("a2", 0): AO["a2"] + 0.3 * (-K1) / math.sqrt(2),  # -1.1547 - 0.15 = -1.3047
        ("a2", 1): AO["a2"] - 0.3 * K1,  # -1.3668
        ("a2", 2): AO["a2"],
        ("a3", 0): AO["a3"] - 0.3 * K0,  # 0.2774
        ("a3", 1): AO["a3"],
    }
    table = TurnTable.from_records(records)
    credit = compute_credit(table, "a2tgpo")
    got = by_key(records, credit.advantages)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key

    # clip factor: 1 + 0.3 * (2 sigmoid(normIG) - 1); no IG -> 1.
    def c(x: float, beta: float = 0.3) -> float:
        return 1 + beta * (2 / (1 + math.exp(-x)) - 1)

    clip = by_key(records, credit.clip_factor)
    expected_clip = {
        ("a1", 0): c(K0), ("a1", 1): c(K1), ("a1", 2): 1.0,
        ("a2", 0): c(0.0), ("a2", 1): c(-K1), ("a2", 2): 1.0,
        ("a3", 0): c(-K0), ("a3", 1): 1.0,
    }  # fmt: skip
    for key, value in expected_clip.items():
        assert clip[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert clip["a1", 0] == pytest.approx(1.1386, abs=1e-4)  # 1 + 0.3 * tanh(0.5)
    # alpha, gamma and beta are options.
    other = by_key(records, compute_advantages(table, "a2tgpo", alpha=1.0, gamma=0.5))
    assert other["a1", 0] == pytest.approx(AO["a1"] + (K0 + 0.5 * K1) / math.sqrt(2), rel=1e-9)
    wide = by_key(records, compute_credit(table, "a2tgpo", beta=1.0).clip_factor)
    assert wide["a1", 0] == pytest.approx(c(K0, 1.0), rel=1e-9)


@pytest.mark.parametrize("records", [IGLOG, shuffled(IGLOG, 5)], ids=["ordered", "shuffled"])
def test_a2tgpo_ablations(records):
    table = TurnTable.from_records(records)
    # joint: IG normalised over all of A's IG rows at once: [0.4, 0.2, 0.1, 0.0, -0.2],
    # mean 0.1, deviations [0.3, 0.1, 0, -0.1, -0.3], std sqrt(0.2 / 4) = 0.2236.
    s = math.sqrt(0.05) + EPS
    joint = compute_credit(table, "a2tgpo", ig_norm="joint")
    expected = {
        ("a1", 0): AO["a1"] + 0.3 * (0.3 + 0.1) / s / math.sqrt(2),  # 0.5774 + 0.3795
        ("a1", 1): AO["a1"] + 0.3 * 0.1 / s,
        ("a1", 2): AO["a1"],
        ("a2", 0): AO["a2"] + 0.3 * (0.0 - 0.1) / s / math.sqrt(2),
        ("a2", 1): AO["a2"] - 0.3 * 0.1 / s,
        ("a2", 2): AO["a2"],
        ("a3", 0): AO["a3"] - 0.3 * 0.3 / s,
        ("a3", 1): AO["a3"],
    }
    assert_matches(by_key(records, joint.advantages), expected)
    clip = by_key(records, joint.clip_factor)
    assert clip["a1", 0] == pytest.approx(1 + 0.3 * math.tanh(0.3 / s / 2), rel=1e-9)
    assert clip["a3", 0] == pytest.approx(1 - 0.3 * math.tanh(0.3 / s / 2), rel=1e-9)
    # no variance rescaling: D_t itself (turn groups as in the default).
    plain = credit_by_key(records, "a2tgpo", rescale=False)
    assert plain["a1", 0] == pytest.approx(AO["a1"] + 0.3 * (K0 + K1), rel=1e-9)
    assert plain["a2", 0] == pytest.approx(AO["a2"] - 0.3 * K1, rel=1e-9)
    assert plain["a1", 1] == pytest.approx(AO["a1"] + 0.3 * K1, rel=1e-9)  # one term: as before
    # no adaptive clipping: beta 0 gives c = 1 on every row, advantages unchanged.
    flat = compute_credit(table, "a2tgpo", beta=0.0)
    assert np.all(flat.clip_factor == 1.0)
    np.testing.assert_array_equal(flat.advantages, compute_advantages(table, "a2tgpo"))
    with pytest.raises(ValueError, match="ig_norm"):
        compute_credit(table, "a2tgpo", ig_norm="task")


def test_a2tgpo_discounts_by_turn_distance_across_a_missing_ig():
    # b1 IG [1, -, 3], b2 IG [2, -, 1], no rewards (A^O = 0).
    # (B, 0): [1, 2] -> [-k0, k0], k0 = 0.5 / (sqrt(0.5) + 1e-6) = 0.7071;
    # (B, 2): [3, 1] -> [k2, -k2], k2 = 1 / (sqrt(2) + 1e-6) = 0.7071.
    # gamma 0.5: b1 t0: D = -k0 + 0.5^2 * k2 over 2 terms -> 0.3 * D / sqrt(2) = -0.1125.
    records = [
        rec("B", "b1", 0, info_gain=1.0),
        rec("B", "b1", 1),
        rec("B", "b1", 2, info_gain=3.0),
        rec("B", "b2", 0, info_gain=2.0),
        rec("B", "b2", 1),
        rec("B", "b2", 2, info_gain=1.0),
    ]
    k0 = 0.5 / (math.sqrt(0.5) + EPS)
    k2 = 1.0 / (math.sqrt(2.0) + EPS)
    got = credit_by_key(records, "a2tgpo", gamma=0.5)
    expected = {
        ("b1", 0): 0.3 * (-k0 + 0.25 * k2) / math.sqrt(2), ("b1", 1): 0.0, ("b1", 2): 0.3 * k2,
        ("b2", 0): 0.3 * (k0 - 0.25 * k2) / math.sqrt(2), ("b2", 1): 0.0, ("b2", 2): -0.3 * k2,
    }  # fmt: skip
    assert_matches(got, expected)


@pytest.mark.parametrize("records", [IGLOG, shuffled(IGLOG, 13)], ids=["ordered", "shuffled"])
def test_igpo_joint_normalisation_then_suffix_sum(records):
    # Signals (IG, else reward): a1 [0.4, 0.2, 1]; a2 [0.1, 0.0, 0]; a3 [-0.2, 1].
    # Over all 8 rows: sum 2.5, mean 0.3125; deviations
    # a1 [0.0875, -0.1125, 0.6875]; a2 [-0.2125, -0.3125, -0.3125]; a3 [-0.5125, 0.6875];
    # squares sum 1.46875 -> std sqrt(1.46875 / 7) = 0.4581.
    s = math.sqrt(1.46875 / 7) + EPS
    expected = {
        ("a1", 2): 0.6875 / s,  # 1.5009
        ("a1", 1): (-0.1125 + 0.6875) / s,  # 1.2553
        ("a1", 0): (0.0875 - 0.1125 + 0.6875) / s,  # 1.4463
        ("a2", 2): -0.3125 / s,
        ("a2", 1): -0.625 / s,
        ("a2", 0): -0.8375 / s,
        ("a3", 1): 0.6875 / s,
        ("a3", 0): (-0.5125 + 0.6875) / s,
    }
    got = credit_by_key(records, "igpo")
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    # gamma 0.5, mean only: a1 t0 = 0.0875 + 0.5 * -0.1125 + 0.25 * 0.6875.
    got = credit_by_key(records, "igpo", gamma=0.5, use_std=False)
    assert got["a1", 0] == pytest.approx(0.0875 - 0.05625 + 0.171875, rel=1e-9)


# --------------------------------------------------------------------------
def test_every_estimator_is_registered_with_its_group_key():
    keys = {name: get_estimator(name).group_key for name in ALL}
    assert keys == {
        "a2tgpo": "turn", "dr_grpo": "rollout", "gigpo": "state", "grpo": "rollout",
        "grpo_mixed": "task", "igpo": "task", "node": "node", "q": "node",
        "rloo": "rollout", "role_turn": "role_turn", "turn_group": "turn",
    }  # fmt: skip
    assert set(ALL) <= set(list_estimators())
    assert get_estimator("rtpo").name == "node"


@pytest.mark.parametrize("name", ALL)
def test_reference_has_the_same_options_and_defaults(name):
    import inspect

    ref = inspect.signature(reference.REFERENCE[name]).parameters
    ref_params = {k: p.default for k, p in ref.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert ref_params == get_estimator(name).params()


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("log", ["AL489", "TREE", "GIGPO", "ROLES", "QLOG", "IGLOG"])
def test_hand_logs_agree_with_reference(name, log):
    records = globals()[log]
    table = TurnTable.from_records(records)
    if name == "q" and log != "QLOG":
        with pytest.raises(TurnRecordError, match="field 'q'"):
            compute_advantages(table, name)
        return
    got = compute_advantages(table, name)
    want = reference.REFERENCE[name](reference.rows_from_table(table))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert got.dtype == np.float64 and got.shape == (len(records),)


def test_only_a2tgpo_returns_a_clip_factor():
    table = TurnTable.from_records(IGLOG)
    for name in ALL:
        credit = compute_credit(table, name) if name != "q" else None
        if credit is not None:
            assert (credit.clip_factor is not None) == (name == "a2tgpo"), name
    rows = reference.rows_from_table(table)
    np.testing.assert_allclose(
        compute_credit(table, "a2tgpo").clip_factor, reference.a2tgpo_clip_factor(rows), rtol=1e-12
    )


def test_unknown_option_is_an_error_naming_the_allowed_ones():
    table = TurnTable.from_records(AL489)
    with pytest.raises(TypeError, match=r"no parameter\(s\) gamma; allowed: use_std=True"):
        compute_advantages(table, "grpo", gamma=0.9)
    with pytest.raises(TypeError, match="allowed: none"):
        compute_advantages(table, "rloo", use_std=False)


def test_single_trajectory_and_single_row_tasks_get_zero():
    records = [rec("solo", "s", 0, 1.0, node_id="n", q=3.0, info_gain=0.5, state_key="x"),
               rec("solo", "s", 1, 2.0, node_id="m", q=1.0, state_key="y")]  # fmt: skip
    table = TurnTable.from_records(records)
    for name in ALL:
        if name == "igpo":  # normalises over rows: [0.5 (IG), 2.0 (reward)] is a real group
            continue
        credit = compute_credit(table, name)
        assert np.all(credit.advantages == 0.0), name
        if credit.clip_factor is not None:
            assert np.all(credit.clip_factor == 1.0)
    one_row = TurnTable.from_records(records[:1])
    for name in ALL:
        assert np.all(compute_advantages(one_row, name) == 0.0), name
