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
  ``call`` (a tool call, where operands are copied), ``result`` (a turn after one
  of its role's calls: the answer where the tool's result is copied), ``direct``
  (any other turn: a direct answer). Where the records say which responses called
  a tool (``tool_call``, as the gateway records it) that is read from them, per
  rollout and role; else from each rollout's turns (the first of several is the
  call). A program of several roles (solver + checker) is checked per role:
  ``warm_tf_{kind}_{role}_{turn}``.
- **greedy accuracy**: the held-out evaluation at step 0 (``eval_success_KIND``),
  passed in by the trainer.

:func:`quality_warnings` turns those numbers into one line per failing kind.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from turnrl.errors import InputError
from turnrl.io import atomic_write_text
from turnrl.types import Task, TurnRecord

WARM_CHECK_FILE = "warm_start_check.json"
"""A run's check report: ``{"metrics": {warm_tf_*}, "warnings": [lines]}``."""
METRIC_PREFIX = "warm_tf_"

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
    role: str = ""
    """The turn's role where the teacher's records hold several (``""``: one role)."""

    @property
    def copied(self) -> bool:
        """Exact given the teacher's decision (forced where greedy decided otherwise)."""
        return self.exact if self.forced_exact is None else self.forced_exact


def turn_positions(records: Sequence[TurnRecord]) -> list[str]:
    """``call``, ``result`` or ``direct`` for each record: from what it says (see the
    module docstring) when every record says whether it called a tool, else from its
    rollout's turns."""
    if records and all(record.tool_call is not None for record in records):
        return _positions_by_content(records)
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


def _positions_by_content(records: Sequence[TurnRecord]) -> list[str]:
    """A call where the response called a tool; a result after a call of the same
    rollout and role (in turn order); else a direct answer. On a two-role program the
    solver's first guess and the checker's verdict are direct answers, and the solver's
    call after the checker's "no" is a call, whatever its turn index."""
    positions = [""] * len(records)
    called: set[tuple[str, str]] = set()
    for i in sorted(range(len(records)), key=lambda i: records[i].turn):
        record = records[i]
        stream = (record.traj_id, record.role)
        if record.tool_call:
            positions[i] = "call"
            called.add(stream)
        else:
            positions[i] = "result" if stream in called else "direct"
    return positions


def teacher_roles(records: Sequence[TurnRecord]) -> tuple[str, ...]:
    """The roles the check reports apart: every role of ``records`` when there are
    several, else ``("",)`` (one role: its metric names carry no role)."""
    roles = sorted({record.role for record in records})
    return tuple(roles) if len(roles) > 1 else ("",)


def metric_key(kind: str, role: str, turn: str) -> str:
    """``warm_tf_{kind}_{turn}``, or ``warm_tf_{kind}_{role}_{turn}`` with a role."""
    return f"warm_tf_{kind}_{role}_{turn}" if role else f"warm_tf_{kind}_{turn}"


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
    by_role = teacher_roles(records) != ("",)
    contexts = [list(r.prompt_ids or ()) for r in records]
    targets = [list(r.response_ids or ()) for r in records]
    responses = _greedy(policy, contexts, max_new_tokens, batch)
    checks = []
    for record, target, response, turn in zip(records, targets, responses, positions, strict=True):
        decided = turn == "result" or response[:1] == target[:1]
        kind = kind_by_task.get(record.task_id, "all")
        role = record.role if by_role else ""
        checks.append(TurnCheck(kind, turn, response == target, decided, role=role))
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
    """Per kind (and role) and turn: ``warm_tf_{kind}_{turn}`` (:func:`metric_key`), the
    share reproduced exactly among the turns greedy decoding decided as the teacher did
    (absent when there are none), ``..._n`` their number, ``..._other`` the share of turns
    decided otherwise, and ``..._forced`` the share reproduced given the teacher's
    decision, over all of them."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for check in checks:
        tally = counts[metric_key(check.kind, check.role, check.turn)]
        tally[0] += int(check.exact and check.decided)
        tally[1] += int(check.decided)
        tally[2] += 1
        tally[3] += int(check.copied)
    out: dict[str, float] = {}
    for key, (exact, decided, total, copied) in sorted(counts.items()):
        if decided:
            out[key] = exact / decided
        out[f"{key}_n"] = float(decided)
        out[f"{key}_other"] = (total - decided) / total
        out[f"{key}_forced"] = copied / total
    return out


def quality_warnings(
    accuracy: Mapping[str, float],
    greedy: Mapping[str, float],
    kinds: Iterable[str],
    roles: Sequence[str] = ("",),
) -> list[str]:
    """One line per kind whose warm start fails: which turn (of which role, where
    ``roles`` names several: :func:`teacher_roles`), how, and the greedy success.

    ``accuracy`` is :func:`teacher_forced_accuracy`'s output; ``greedy`` the step-0
    evaluation row (``eval_success_KIND``). A route greedy decoding never takes counts
    (with the teacher's decision forced) only for a kind greedy decoding solves less than
    half of.
    """
    lines = []
    routes = [(role, turn) for role in roles for turn in TURN_FAILURES]
    for kind in kinds:
        failing = [
            f"{_whose(role)}{TURN_FAILURES[turn]} ({accuracy[key]:.2f} of "
            f"{accuracy[key + '_n']:.0f} teacher-forced {turn} turns exact)"
            for role, turn in routes
            if (key := metric_key(kind, role, turn)) in accuracy and accuracy[key] < FAILS_BELOW
        ]
        success = greedy.get(f"eval_success_{kind}")
        # a route greedy decoding never takes, judged with the decision forced: it matters
        # where greedy's own route fails (RL has to find this one), not where it solves
        # the kind (a hard product answered directly is wrong by design, and RL compares
        # it with the call that works)
        if success is None or success < FAILS_BELOW:
            failing += [
                f"{_whose(role)}{TURN_FAILURES[turn]} ({accuracy[key + '_forced']:.2f} of the "
                f"{turn} turns exact with the teacher's decision forced; greedy decoding never "
                "takes it)"
                for role, turn in routes
                if (key := metric_key(kind, role, turn)) not in accuracy
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


def _whose(role: str) -> str:
    return f"{role}: " if role else ""


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
    return accuracy, quality_warnings(accuracy, greedy, kinds, teacher_roles(records))


def write_check(
    run_dir: Path, metrics: Mapping[str, float], lines: Sequence[str], **extra: str
) -> None:
    """Write a run's check report (:data:`WARM_CHECK_FILE`, with ``extra`` fields),
    atomically."""
    report = {"metrics": dict(metrics), "warnings": list(lines), **extra}
    atomic_write_text(run_dir / WARM_CHECK_FILE, json.dumps(report, indent=1) + "\n")


def replace_recorded_check(
    run_dir: Path, metrics: Mapping[str, float], lines: Sequence[str], *, by: str
) -> None:
    """Replace a finished run's check with one recomputed from its saved files (after the
    check itself changed): the report (marked ``recomputed_by``) and the ``warm_tf_*``
    keys of its step-0 metrics row, whose other keys stay; both files atomically."""
    path = run_dir / "metrics.jsonl"
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise InputError(str(path), number, None, f"not JSON ({exc.msg})") from exc
    starts = [i for i, row in enumerate(rows) if row.get("step") == 0]
    if not starts:
        raise InputError(
            str(path), None, "step", "no step-0 row (the warm start's) to hold the check"
        )
    row = {k: v for k, v in rows[starts[0]].items() if not k.startswith(METRIC_PREFIX)}
    rows[starts[0]] = {**row, **metrics}
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    write_check(run_dir, metrics, lines, recomputed_by=by)
