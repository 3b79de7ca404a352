"""The warm start's check before RL: teacher-forced accuracy per kind and turn, and the
warning that names a copy failure (issue #25), on hand-built records."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest

from turnrl.errors import InputError
from turnrl.train.agent.warm_quality import (
    WARM_CHECK_FILE,
    TurnCheck,
    check_warm_start,
    quality_warnings,
    replace_recorded_check,
    teacher_forced_accuracy,
    teacher_forced_checks,
    turn_positions,
)
from turnrl.types import Sample, Task, TurnRecord


def record(
    traj: str,
    turn: int,
    task: str,
    prompt: tuple[int, ...],
    response: tuple[int, ...],
    role: str = "agent",
    call: bool | None = None,
):
    return TurnRecord(
        task_id=task,
        traj_id=traj,
        turn=turn,
        role=role,
        prompt_ids=prompt,
        response_ids=response,
        tool_call=call,
    )


@dataclass
class ScriptedPolicy:
    """Greedy "decoding": the response scripted for each context, and the calls seen."""

    replies: dict[tuple[int, ...], list[int]]
    calls: list[tuple[int, float]]

    def sample(self, contexts, *, max_new_tokens: int, temperature: float = 1.0, seed=None):
        self.calls.append((max_new_tokens, temperature))
        return [
            Sample(self.replies[tuple(c)], [0.0] * len(self.replies[tuple(c)]), "stop", "")
            for c in contexts
        ]


# a hard task called through the tool (call, then result), an easy one answered directly
RECORDS = [
    record("w-0-v0", 0, "h", (1, 2), (5, 6, 0)),  # call: operands copied
    record("w-0-v0", 1, "h", (1, 2, 5, 6, 0, 9), (7, 0)),  # result copied
    record("w-1-v0", 0, "h2", (1, 3), (5, 7, 0)),  # call
    record("w-1-v0", 1, "h2", (1, 3, 5, 7, 0, 9), (8, 0)),  # result
    record("w-2-v1", 0, "e", (1, 4), (4, 0)),  # direct answer
]
TASKS = [Task("h", {}, ("hard",)), Task("h2", {}, ("hard",)), Task("e", {}, ("easy",))]


def test_turn_positions_follow_each_rollout_s_turns() -> None:
    assert turn_positions(RECORDS) == ["call", "result", "call", "result", "direct"]


# examples/agents/solver_checker.py's teacher: on a hard problem the solver guesses, the
# checker says no, the solver calls the tool (turn 2) and answers; an easy one answered
SOLVER_CHECKER = [
    record("t0", 0, "h", (1, 2), (6,), "solver", False),  # the guess
    record("t0", 1, "h", (1, 2, 6), (3,), "checker", False),  # "no"
    record("t0", 2, "h", (1, 2, 6, 3), (5, 6, 0), "solver", True),
    record("t0", 3, "h", (1, 2, 6, 3, 5, 6, 0, 9), (7,), "solver", False),
    record("t1", 0, "e", (1, 4), (4,), "solver", False),
    record("t1", 1, "e", (1, 4, 4), (2,), "checker", False),  # "yes"
]


def test_positions_come_from_the_records_tool_calls_per_role() -> None:
    """The solver's call is its second turn (turn 2 of the rollout): a call, not a
    result; the guess before it and the checker's verdicts are direct answers."""
    assert turn_positions(SOLVER_CHECKER) == [
        "direct",
        "direct",
        "call",
        "result",
        "direct",
        "direct",
    ]
    # records that do not say whether they called: each rollout's first of several turns
    unknown = [replace(r, tool_call=None) for r in SOLVER_CHECKER]
    assert turn_positions(unknown) == ["call", "result", "result", "result", "call", "result"]


def test_a_program_of_several_roles_is_checked_per_role() -> None:
    replies = {
        (1, 2): [6],  # the guess, as the teacher's
        (1, 2, 6): [3],  # the checker's no
        (1, 2, 6, 3): [5, 8, 0],  # the call's operands miscopied
        (1, 2, 6, 3, 5, 6, 0, 9): [7],  # the result copied
        (1, 4): [4],
        (1, 4, 4): [2],
    }
    tasks = [Task("h", {}, ("hard",)), Task("e", {}, ("easy",))]
    metrics, lines = check_warm_start(
        ScriptedPolicy(replies, []),
        SOLVER_CHECKER,
        tasks,
        {"eval_success_hard": 0.0},
        max_new_tokens=8,
    )
    assert {k: v for k, v in metrics.items() if not k.endswith(("_n", "_other", "_forced"))} == {
        "warm_tf_easy_checker_direct": 1.0,
        "warm_tf_easy_solver_direct": 1.0,
        "warm_tf_hard_checker_direct": 1.0,
        "warm_tf_hard_solver_call": 0.0,
        "warm_tf_hard_solver_direct": 1.0,
        "warm_tf_hard_solver_result": 1.0,
    }
    assert lines == [
        "warm start fails on hard problems: solver: operands miscopied into the tool call "
        "(0.00 of 1 teacher-forced call turns exact); greedy decoding never solves one "
        "(eval_success 0.00) - RL sees zero-advantage groups there"
    ]


def test_greedy_from_the_teacher_s_context_is_compared_token_for_token() -> None:
    replies = {
        (1, 2): [5, 6, 0],  # exact
        (1, 2, 5, 6, 0, 9): [7, 1, 0],  # the result miscopied
        (1, 3): [5, 8, 0],  # the call's operand miscopied
        (1, 3, 5, 7, 0, 9): [8],  # truncated: not exact
        (1, 4): [5, 6, 0],  # a call where the teacher answered: another decision
        (1, 4, 4): [0],  # ... but with the teacher's first token forced, its answer
    }
    policy = ScriptedPolicy(replies, [])
    kinds = {"h": "hard", "h2": "hard", "e": "easy"}
    checks = teacher_forced_checks(policy, RECORDS, kinds, max_new_tokens=24, batch=2)
    assert checks == [
        TurnCheck("hard", "call", True, True),
        TurnCheck("hard", "result", False, True),
        TurnCheck("hard", "call", False, True),
        TurnCheck("hard", "result", False, True),
        TurnCheck("easy", "direct", False, False, forced_exact=True),
    ]
    assert [c.copied for c in checks] == [True, False, False, False, True]
    # batches of 2, 2, 1, greedy; then the one undecided turn, one token shorter
    assert policy.calls == [(24, 0.0)] * 3 + [(23, 0.0)]


def test_accuracy_per_kind_and_turn() -> None:
    checks = [
        TurnCheck("hard", "call", True),
        TurnCheck("hard", "call", False),
        TurnCheck("hard", "call", False),
        TurnCheck("hard", "call", True),
        TurnCheck("hard", "result", False),
        TurnCheck("easy", "direct", True),
        TurnCheck("easy", "direct", True),
        TurnCheck("easy", "direct", False),
        TurnCheck("easy", "direct", False, False, True),  # decided otherwise: apart
        TurnCheck("easy", "call", False, False, False),
    ]
    assert teacher_forced_accuracy(checks) == {
        "warm_tf_easy_call_n": 0.0,  # no accuracy without a turn decided as the teacher
        "warm_tf_easy_call_other": 1.0,
        "warm_tf_easy_call_forced": 0.0,
        "warm_tf_easy_direct": 2 / 3,
        "warm_tf_easy_direct_n": 3.0,
        "warm_tf_easy_direct_other": 0.25,
        "warm_tf_easy_direct_forced": 0.75,  # 2 decided and exact, 1 forced and exact
        "warm_tf_hard_call": 0.5,
        "warm_tf_hard_call_n": 4.0,
        "warm_tf_hard_call_other": 0.0,
        "warm_tf_hard_call_forced": 0.5,
        "warm_tf_hard_result": 0.0,
        "warm_tf_hard_result_n": 1.0,
        "warm_tf_hard_result_other": 0.0,
        "warm_tf_hard_result_forced": 0.0,
    }


def test_a_kind_never_decided_as_the_teacher_is_judged_with_the_decision_forced() -> None:
    accuracy = {
        "warm_tf_hard_call_n": 0.0,
        "warm_tf_hard_call_other": 1.0,
        "warm_tf_hard_call_forced": 0.25,
        "warm_tf_easy_call_n": 0.0,
        "warm_tf_easy_call_other": 1.0,
        "warm_tf_easy_call_forced": 0.75,  # copied given the decision: no warning
    }
    assert quality_warnings(accuracy, {"eval_success_hard": 0.25}, ["easy", "hard"]) == [
        "warm start fails on hard problems: operands miscopied into the tool call (0.25 of "
        "the call turns exact with the teacher's decision forced; greedy decoding never "
        "takes it) - RL sees zero-advantage groups there"
    ]


def test_an_untaken_route_that_fails_is_no_warning_where_greedy_solves_the_kind() -> None:
    """SmolLM2's warm start (agents-smol-489): greedy decoding calls on every hard problem
    and solves it; a direct answer to a 6-digit product, forced, is wrong, as it must be."""
    accuracy = {
        "warm_tf_hard_call": 1.0,
        "warm_tf_hard_call_n": 31.0,
        "warm_tf_hard_direct_n": 0.0,
        "warm_tf_hard_direct_other": 1.0,
        "warm_tf_hard_direct_forced": 0.0,
    }
    assert quality_warnings(accuracy, {"eval_success_hard": 1.0}, ["hard"]) == []
    assert quality_warnings(accuracy, {"eval_success_hard": 0.25}, ["hard"]) == [
        "warm start fails on hard problems: the direct answer wrong (0.00 of the direct "
        "turns exact with the teacher's decision forced; greedy decoding never takes it) - "
        "RL sees zero-advantage groups there"
    ]


def test_a_failing_kind_is_named_with_how_it_fails() -> None:
    accuracy = {
        "warm_tf_hard_call": 0.25,
        "warm_tf_hard_call_n": 8.0,
        "warm_tf_hard_result": 0.5,  # at the threshold: passes
        "warm_tf_hard_result_n": 8.0,
        "warm_tf_easy_direct": 1.0,
        "warm_tf_easy_direct_n": 4.0,
        "warm_tf_easy_result": 0.0,
        "warm_tf_easy_result_n": 2.0,
    }
    greedy = {"eval_success_hard": 0.0, "eval_success_easy": 0.75}
    assert quality_warnings(accuracy, greedy, ["easy", "hard"]) == [
        "warm start fails on easy problems: the tool's result miscopied into the answer "
        "(0.00 of 2 teacher-forced result turns exact) - RL sees zero-advantage groups there",
        "warm start fails on hard problems: operands miscopied into the tool call "
        "(0.25 of 8 teacher-forced call turns exact); greedy decoding never solves one "
        "(eval_success 0.00) - RL sees zero-advantage groups there",
    ]


def test_a_good_warm_start_gets_no_warning() -> None:
    accuracy = {"warm_tf_hard_call": 0.9, "warm_tf_hard_call_n": 10.0}
    assert quality_warnings(accuracy, {"eval_success_hard": 0.1}, ["hard", "easy"]) == []


def test_the_check_end_to_end_on_hand_built_records() -> None:
    replies = {
        (1, 2): [5, 9, 0],  # operands miscopied
        (1, 2, 5, 6, 0, 9): [7, 0],
        (1, 3): [5, 8, 0],  # operands miscopied
        (1, 3, 5, 7, 0, 9): [8, 0],
        (1, 4): [4, 0],
    }
    metrics, lines = check_warm_start(
        ScriptedPolicy(replies, []), RECORDS, TASKS, {"eval_success_hard": 0.25}, max_new_tokens=8
    )
    assert metrics["warm_tf_hard_call"] == 0.0
    assert metrics["warm_tf_hard_call_other"] == 0.0
    assert metrics["warm_tf_hard_result"] == 1.0
    assert metrics["warm_tf_easy_direct"] == 1.0
    assert lines == [
        "warm start fails on hard problems: operands miscopied into the tool call "
        "(0.00 of 2 teacher-forced call turns exact) - RL sees zero-advantage groups there"
    ]


def test_without_teacher_records_only_the_greedy_check_speaks() -> None:
    metrics, lines = check_warm_start(
        ScriptedPolicy({}, []), [], TASKS, {"eval_success_hard": 0.0}, max_new_tokens=8
    )
    assert metrics == {}
    assert lines == [
        "warm start fails on hard problems: greedy decoding never solves one "
        "(eval_success 0.00) - RL sees zero-advantage groups there"
    ]


def test_a_recomputed_check_replaces_the_recorded_one_and_nothing_else(tmp_path) -> None:
    rows = [
        {"step": 0, "eval_success": 0.5, "warm_tf_hard_call": 0.25, "warm_tf_hard_call_n": 4.0},
        {"step": 1, "success": 0.75},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    new = {"warm_tf_hard_solver_call": 0.5, "warm_tf_hard_solver_call_n": 2.0}
    replace_recorded_check(tmp_path, new, ["a warning"], by="a script")
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 0, "eval_success": 0.5, **new},  # the old check's keys are gone
        {"step": 1, "success": 0.75},
    ]
    assert json.loads((tmp_path / WARM_CHECK_FILE).read_text()) == {
        "metrics": new,
        "warnings": ["a warning"],
        "recomputed_by": "a script",
    }


def test_a_run_without_its_warm_start_row_is_refused_by_file_and_field(tmp_path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(InputError, match=r"metrics.jsonl: field 'step': no step-0 row"):
        replace_recorded_check(tmp_path, {}, [], by="a script")
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": \n')
    with pytest.raises(InputError, match=r"metrics.jsonl:2: not JSON"):
        replace_recorded_check(tmp_path, {}, [], by="a script")
    assert not (tmp_path / WARM_CHECK_FILE).exists()
