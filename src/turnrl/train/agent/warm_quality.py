"""Is the warm start good enough for RL? Teacher-forced and greedy accuracy per kind.

RL on 0/1 correctness learns nothing from a group whose rollouts all fail: when a
warm start never solves a hard problem (the operands miscopied into the tool call,
or the tool's result miscopied into the answer), most groups have zero advantage
and RL drifts (issue #25). This module checks a warm start before RL on the
teacher's own demonstrations and names the failure:

- **teacher-forced accuracy**: from the exact context of each teacher turn, does
  greedy decoding reproduce the teacher's turn token for token (exactly when every
  token is the most likely one after the teacher's own prefix)? Turns whose
  first token (at turn 0: the decision to call or answer) differs from the
  teacher's are counted apart, as another decision; each of them is decoded once
  more with the teacher's first token forced, so that ``..._forced`` says whether
  the turn is copied given the teacher's decision, over every turn of its position
  (under a per-draw mix whose call share is under one half, greedy decoding never
  decides to call, and only the forced share measures the copy). Per kind of
  problem (the task's first tag: ``easy``, ``hard``) and per turn:
  ``call`` (the first turn of a rollout that went on: the tool call, where
  operands are copied), ``result`` (a later turn: the answer after the tool's
  result, where the result is copied), ``direct`` (a rollout's only turn: the
  direct answer).
- **greedy accuracy**: the held-out evaluation at step 0 (``eval_success_KIND``),
  passed in by the trainer.

:func:`quality_warnings` turns those numbers into one line per failing kind.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from turnrl.types import Task, TurnRecord

FAILS_BELOW = 0.5
"""A kind's turn fails the check when fewer than this share are reproduced exactly."""

TURN_FAILURES = {
    "call": "operands miscopied into the tool call",
    "result": "the tool's result miscopied into the answer",
    "direct": "the direct answer wrong",
}
"""What a failing turn of each position means on the calculator agents."""


@dataclass(frozen=True)
class TurnCheck:
    """One teacher turn and whether greedy decoding from its context reproduced it.

    ``decided``: whether greedy decoding's first token is the teacher's. At turn 0
    (``call``, ``direct``) the first token is the decision (a call or an answer) and
    the per-draw mix demonstrates both from the same context, so a turn whose first
    token differs is another decision, not a copy failure: it is counted apart."""

    kind: str
    turn: str
    exact: bool
    decided: bool = True
    forced_exact: bool | None = None
    """Reproduced exactly with the teacher's first token forced (``None``: as ``exact``,
    which it equals on a decided turn: greedy decoding continues the same way)."""

    @property
    def copied(self) -> bool:
        """Exact given the teacher's decision (forced where greedy decided otherwise)."""
        return self.exact if self.forced_exact is None else self.forced_exact


def turn_positions(records: Sequence[TurnRecord]) -> list[str]:
    """``call``, ``result`` or ``direct`` for each record, from its rollout's turns."""
    turns_by_rollout: dict[str, int] = defaultdict(int)
    for record in records:
        turns_by_rollout[record.traj_id] += 1
    positions = []
    for record in records:
        if turns_by_rollout[record.traj_id] == 1:
            positions.append("direct")
        else:
            positions.append("call" if record.turn == 0 else "result")
    return positions


def teacher_forced_checks(
    policy: object,
    records: Sequence[TurnRecord],
    kind_by_task: Mapping[str, str],
    *,
    max_new_tokens: int,
    batch: int = 64,
) -> list[TurnCheck]:
    """Greedy-decode every teacher turn from its exact context and compare token ids;
    decode the turns decided otherwise again with the teacher's first token forced."""
    positions = turn_positions(records)
    contexts = [list(r.prompt_ids or ()) for r in records]
    targets = [list(r.response_ids or ()) for r in records]
    responses = _greedy(policy, contexts, max_new_tokens, batch)
    checks = []
    for record, target, response, turn in zip(records, targets, responses, positions, strict=True):
        decided = turn == "result" or response[:1] == target[:1]
        kind = kind_by_task.get(record.task_id, "all")
        checks.append(TurnCheck(kind, turn, response == target, decided))
    undecided = [i for i, check in enumerate(checks) if not check.decided and targets[i]]
    forced = _greedy(
        policy, [contexts[i] + targets[i][:1] for i in undecided], max_new_tokens - 1, batch
    )
    for i, continuation in zip(undecided, forced, strict=True):
        copied = targets[i][:1] + continuation == targets[i]
        checks[i] = dataclasses.replace(checks[i], forced_exact=copied)
    return checks


def _greedy(
    policy: object, contexts: list[list[int]], max_new_tokens: int, batch: int
) -> list[list[int]]:
    """Greedy responses (token ids) to ``contexts``, ``batch`` at a time."""
    out: list[list[int]] = []
    for start in range(0, len(contexts), batch):
        samples = policy.sample(  # type: ignore[attr-defined]
            contexts[start : start + batch], max_new_tokens=max_new_tokens, temperature=0.0
        )
        out += [list(sample.response_ids) for sample in samples]
    return out


def teacher_forced_accuracy(checks: Iterable[TurnCheck]) -> dict[str, float]:
    """Per kind and turn: ``warm_tf_{kind}_{turn}``, the share reproduced exactly among
    the turns greedy decoding decided as the teacher did (absent when there are none),
    ``..._n`` their number, ``..._other`` the share of turns decided otherwise, and
    ``..._forced`` the share reproduced given the teacher's decision, over all of them."""
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for check in checks:
        tally = counts[(check.kind, check.turn)]
        tally[0] += int(check.exact and check.decided)
        tally[1] += int(check.decided)
        tally[2] += 1
        tally[3] += int(check.copied)
    out: dict[str, float] = {}
    for (kind, turn), (exact, decided, total, copied) in sorted(counts.items()):
        if decided:
            out[f"warm_tf_{kind}_{turn}"] = exact / decided
        out[f"warm_tf_{kind}_{turn}_n"] = float(decided)
        out[f"warm_tf_{kind}_{turn}_other"] = (total - decided) / total
        out[f"warm_tf_{kind}_{turn}_forced"] = copied / total
    return out


def quality_warnings(
    accuracy: Mapping[str, float], greedy: Mapping[str, float], kinds: Iterable[str]
) -> list[str]:
    """One line per kind whose warm start fails: which turn, how, and the greedy success.

    ``accuracy`` is :func:`teacher_forced_accuracy`'s output; ``greedy`` the step-0
    evaluation row (``eval_success_KIND``). A route greedy decoding never takes counts
    (with the teacher's decision forced) only for a kind greedy decoding solves less than
    half of.
    """
    lines = []
    for kind in kinds:
        failing = [
            f"{TURN_FAILURES[turn]} ({accuracy[key]:.2f} of "
            f"{accuracy[key + '_n']:.0f} teacher-forced {turn} turns exact)"
            for turn in TURN_FAILURES
            if (key := f"warm_tf_{kind}_{turn}") in accuracy and accuracy[key] < FAILS_BELOW
        ]
        success = greedy.get(f"eval_success_{kind}")
        # a route greedy decoding never takes, judged with the decision forced: it matters
        # where greedy's own route fails (RL has to find this one), not where it solves
        # the kind (a hard product answered directly is wrong by design, and RL compares
        # it with the call that works)
        if success is None or success < FAILS_BELOW:
            failing += [
                f"{TURN_FAILURES[turn]} ({accuracy[key + '_forced']:.2f} of the {turn} turns "
                "exact with the teacher's decision forced; greedy decoding never takes it)"
                for turn in TURN_FAILURES
                if (key := f"warm_tf_{kind}_{turn}") not in accuracy
                and accuracy.get(key + "_forced", 1.0) < FAILS_BELOW
            ]
        if success is not None and success == 0.0:
            failing.append("greedy decoding never solves one (eval_success 0.00)")
        if failing:
            lines.append(
                f"warm start fails on {kind} problems: "
                + "; ".join(failing)
                + " - RL sees zero-advantage groups there"
            )
    return lines


def task_kind(task: Task) -> str:
    """The kind a task is reported under: its first tag, or ``all``."""
    return task.tags[0] if task.tags else "all"


def check_warm_start(
    policy: object,
    records: Sequence[TurnRecord],
    tasks: Sequence[Task],
    greedy: Mapping[str, float],
    *,
    max_new_tokens: int,
) -> tuple[dict[str, float], list[str]]:
    """The metrics (``warm_tf_*``) and warning lines of a warm start: teacher-forced on
    ``records`` (the teacher's turns on ``tasks``; none: greedy only) and ``greedy``."""
    kind_by_task = {task.task_id: task_kind(task) for task in tasks}
    checks = teacher_forced_checks(policy, records, kind_by_task, max_new_tokens=max_new_tokens)
    accuracy = teacher_forced_accuracy(checks)
    kinds = sorted(set(kind_by_task.values()))
    return accuracy, quality_warnings(accuracy, greedy, kinds)
