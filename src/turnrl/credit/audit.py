"""Audit a turn log: what does each grouping compare, and how far is it from exact?

For every group key of the design (task, rollout, turn, role_turn, state, node)
the audit reports how many groups there are, how many of them mix different
decision points (node ids), how many produce only zero advantages, and how much
more a long trajectory counts than a short one inside a group. For every
estimator that can run on the log it reports the mean and std of advantages by
turn position and the gap between its turn-0 advantages and the exact ``node``
baseline. Where rows record the ``policy_version`` that sampled them (asynchronous
training), it reports rows per version, the lag behind the newest by turn position, and
per group key how many groups mix versions. ``turnrl audit LOG.jsonl`` prints it;
``--json`` gives the same dict.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from turnrl.credit.groups import GROUP_KEYS, group_codes
from turnrl.credit.registry import compute_credit, get_estimator, list_estimators
from turnrl.credit.segments import dense_codes
from turnrl.errors import TurnRecordError
from turnrl.table import TurnTable

ZERO = 1e-12
MAX_TURN_COLUMNS = 8
"""Turn positions reported separately; later turns are pooled into the last column."""


@dataclass
class GroupKeyAudit:
    key: str
    peers: str
    exact: str
    estimator: str
    n_groups: int
    """Groups with at least one member."""
    n_groups_multi: int
    """Groups with at least two members (the ones that yield a non-zero baseline)."""
    mixed_share: float
    """Share of multi-member groups whose members come from more than one decision point."""
    mean_decision_points: float
    """Average number of distinct decision points per multi-member group."""
    zero_adv_share: float
    """Share of groups in which the key's estimator gives every member advantage 0."""
    length_weight_mean: float
    """Mean over groups of (largest / smallest number of members a trajectory has in it)."""
    length_weight_max: float
    rows_covered: float
    """Share of rows that belong to a group of this key with at least two members."""
    version_mixed_share: float = float("nan")
    """Share of multi-member groups whose rows were sampled by more than one policy
    version (``policy_version``; asynchronous training, or a rollout that spanned a
    weight push): such a group's baseline compares samples of different policies.
    NaN when no row records a version."""
    version_spread_max: float = float("nan")
    """Most versions apart two rows of one multi-member group are (NaN as above)."""


@dataclass
class EstimatorAudit:
    estimator: str
    adv_mean_by_turn: list[float]
    adv_std_by_turn: list[float]
    turn0_gap_mean_abs: float | None
    """Mean |A_t0 - A_node_t0| over turn-0 rows (None when there is no turn-0 node group)."""
    turn0_sign_agreement: float | None
    """Share of turn-0 rows with a non-zero node advantage whose sign the estimator matches."""
    later_gap_mean_abs: float | None
    """Mean |A - A_node| over rows after turn 0 that have a node sibling: how much credit
    later turns receive that the exact baseline would not give them."""


@dataclass
class AuditReport:
    source: str
    n_rows: int
    n_tasks: int
    n_trajectories: int
    turns_histogram: dict[int, int]
    turn_labels: list[str]
    group_keys: list[GroupKeyAudit] = field(default_factory=list)
    estimators: list[EstimatorAudit] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """Estimators that could not run on this log, with the reason."""
    versions: dict[int, int] = field(default_factory=dict)
    """Rows per ``policy_version`` (rows without one are not counted)."""
    version_lag_by_turn: list[float] = field(default_factory=list)
    """Mean versions behind the log's newest version, by turn position (empty when no
    row records a version): how stale each turn position's samples are."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def to_text(self) -> str:
        return format_audit(self)


def _turn_bucket(turn: np.ndarray) -> tuple[np.ndarray, list[str]]:
    last = MAX_TURN_COLUMNS - 1
    bucket = np.minimum(turn, last)
    top = int(bucket.max()) + 1 if bucket.size else 1
    labels = [str(t) for t in range(top)]
    if int(turn.max(initial=0)) > last:
        labels[-1] = f"{last}+"
    return bucket, labels


def _length_weighting(table: TurnTable, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group: max/min of how many rows each of its trajectories contributes."""
    valid = codes >= 0
    pair, n_pairs = dense_codes(np.where(valid, codes, -1), table.traj_code)
    rows_per_pair = np.bincount(pair[valid], minlength=n_pairs).astype(np.float64)
    pair_group = np.empty(n_pairs, dtype=np.int64)
    pair_group[pair[valid]] = codes[valid]
    most = np.zeros(n_groups)
    least = np.full(n_groups, np.inf)
    np.maximum.at(most, pair_group, rows_per_pair)
    np.minimum.at(least, pair_group, rows_per_pair)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isfinite(least) & (least > 0), most / least, np.nan)


def audit_group_key(table: TurnTable, key: str, advantages: np.ndarray | None) -> GroupKeyAudit:
    """One group key's audit on ``table`` (zero-advantage share from ``advantages``, NaN
    without them); the trainers' per-step drift metrics use it too."""
    spec = GROUP_KEYS[key]
    codes, n_groups = group_codes(table, key)
    valid = codes >= 0
    if not valid.any():
        nan = float("nan")
        return GroupKeyAudit(
            key, spec.peers, spec.exact, spec.estimator, 0, 0, nan, nan, nan, nan, nan, 0.0
        )
    if spec.members_are_trajectories:
        # Members are trajectories; a trajectory enters the statistic through its
        # first decision point (turn 0) and its value is broadcast to later turns.
        first = valid & (table.turn == 0)
        member_codes = np.where(first, codes, -1)
    else:
        member_codes = codes
    mvalid = member_codes >= 0
    members = np.bincount(member_codes[mvalid], minlength=n_groups)
    present = members > 0
    multi = members > 1
    pair, n_pairs = dense_codes(member_codes, table.node_code)
    pair_group = np.full(n_pairs, -1, dtype=np.int64)
    pair_group[pair[mvalid]] = member_codes[mvalid]
    points = np.bincount(pair_group[pair_group >= 0], minlength=n_groups)
    n_multi = int(multi.sum())
    mixed_share = float((points[multi] > 1).mean()) if n_multi else 0.0
    mean_points = float(points[multi].mean()) if n_multi else 0.0
    zero_share = float("nan")
    if advantages is not None:
        nonzero = np.bincount(
            codes[valid], weights=(np.abs(advantages[valid]) > ZERO), minlength=n_groups
        )
        zero_share = float((nonzero[present] == 0).mean()) if present.any() else 0.0
    if spec.members_are_trajectories:
        weights = np.ones(n_groups)
    else:
        weights = _length_weighting(table, codes, n_groups)
    mixed_versions, spread = _version_mixing(table, codes, valid, multi, n_groups)
    finite = weights[present & np.isfinite(weights)]
    row_members = np.bincount(codes[valid], minlength=max(n_groups, 1))
    covered = valid & (row_members[np.where(valid, codes, 0)] > 1)
    if spec.members_are_trajectories:
        traj_count = np.bincount(table.traj_task, minlength=n_groups)
        covered = traj_count[table.task_code] > 1
    return GroupKeyAudit(
        key=key,
        peers=spec.peers,
        exact=spec.exact,
        estimator=spec.estimator,
        n_groups=int(present.sum()),
        n_groups_multi=n_multi,
        mixed_share=mixed_share,
        mean_decision_points=mean_points,
        zero_adv_share=zero_share,
        length_weight_mean=float(finite.mean()) if finite.size else 1.0,
        length_weight_max=float(finite.max()) if finite.size else 1.0,
        rows_covered=float(covered.mean()),
        version_mixed_share=mixed_versions,
        version_spread_max=spread,
    )


def _version_mixing(
    table: TurnTable, codes: np.ndarray, valid: np.ndarray, multi: np.ndarray, n_groups: int
) -> tuple[float, float]:
    """(share of the ``multi`` groups holding more than one policy version, the largest
    spread of versions inside one of them), over the rows that record a version; NaNs
    when none does. Every row of a group counts (for trajectory-member keys too: a
    trajectory that spanned a push brings both versions)."""
    version = table.policy_version
    if version is None or not (version >= 0).any():
        return float("nan"), float("nan")
    rows = valid & (version >= 0)
    newest = np.full(n_groups, -1, dtype=np.int64)
    oldest = np.full(n_groups, np.iinfo(np.int64).max, dtype=np.int64)
    np.maximum.at(newest, codes[rows], version[rows])
    np.minimum.at(oldest, codes[rows], version[rows])
    counted = multi & (newest >= 0)
    if not counted.any():
        return 0.0, 0.0
    spread = newest[counted] - oldest[counted]
    return float((spread > 0).mean()), float(spread.max())


def _by_turn(
    values: np.ndarray, bucket: np.ndarray, n_buckets: int
) -> tuple[list[float], list[float]]:
    count = np.bincount(bucket, minlength=n_buckets).astype(np.float64)
    total = np.bincount(bucket, weights=values, minlength=n_buckets)
    mean = np.divide(total, count, out=np.full(n_buckets, np.nan), where=count > 0)
    dev = values - mean[bucket]
    sq = np.bincount(bucket, weights=dev * dev, minlength=n_buckets)
    std = np.sqrt(np.divide(sq, count, out=np.full(n_buckets, np.nan), where=count > 0))
    return [float(v) for v in mean], [float(v) for v in std]


def _credit_or_reason(table: TurnTable, estimator: str) -> np.ndarray | str:
    """The estimator's default advantages on ``table``, or why it cannot run on this
    log: a field it declares in ``needs`` that no row has, or the record error it
    raises (e.g. ``q`` missing on some rows)."""
    for name in get_estimator(estimator).needs:
        column = getattr(table, name, None)
        if isinstance(column, np.ndarray) and column.dtype.kind == "f" and np.isnan(column).all():
            return f"needs '{name}', which no row of this log has"
    try:
        return compute_credit(table, estimator).advantages
    except TurnRecordError as err:
        return str(err)


def audit(table: TurnTable, estimators: list[str] | None = None) -> AuditReport:
    """Audit ``table`` under every group key and every (or the given) estimator."""
    names = list_estimators() if estimators is None else [get_estimator(e).name for e in estimators]
    bucket, labels = _turn_bucket(table.turn)
    turns, counts = np.unique(table.traj_length, return_counts=True)
    report = AuditReport(
        source=table.source,
        n_rows=table.n_rows,
        n_tasks=table.n_tasks,
        n_trajectories=table.n_trajectories,
        turns_histogram={int(t): int(c) for t, c in zip(turns, counts, strict=True)},
        turn_labels=labels,
    )
    advantages: dict[str, np.ndarray] = {}
    needed = set(names) | {k.estimator for k in GROUP_KEYS.values()}
    for name in sorted(needed):
        credit = _credit_or_reason(table, name)
        if not isinstance(credit, str):
            advantages[name] = credit
        elif name in names:
            report.skipped[name] = credit
    node_std = compute_credit(table, "node", use_std=True).advantages
    node_sizes = np.bincount(table.node_code, minlength=len(table.node_names))
    has_peer = node_sizes[table.node_code] > 1
    turn0 = (table.turn == 0) & has_peer
    later = (table.turn > 0) & has_peer
    version = table.policy_version
    if version is not None and (version >= 0).any():
        known = version >= 0
        values, counts = np.unique(version[known], return_counts=True)
        report.versions = {int(v): int(c) for v, c in zip(values, counts, strict=True)}
        lag = (version.max() - version[known]).astype(np.float64)
        report.version_lag_by_turn, _ = _by_turn(lag, bucket[known], len(labels))
    for key in GROUP_KEYS:
        report.group_keys.append(
            audit_group_key(table, key, advantages.get(GROUP_KEYS[key].estimator))
        )
    for name in names:
        if name not in advantages:
            continue
        adv = advantages[name]
        mean, std = _by_turn(adv, bucket, len(labels))
        reference = advantages["node"] if get_estimator(name).scale == "mean" else node_std
        gap = agreement = later_gap = None
        if turn0.any():
            ref0, adv0 = reference[turn0], adv[turn0]
            gap = float(np.abs(adv0 - ref0).mean())
            signed = np.abs(ref0) > ZERO
            if signed.any():
                agreement = float((np.sign(adv0[signed]) == np.sign(ref0[signed])).mean())
        if later.any():
            later_gap = float(np.abs(adv[later] - reference[later]).mean())
        report.estimators.append(EstimatorAudit(name, mean, std, gap, agreement, later_gap))
    return report


def _fmt(value: float | None, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    return format(value, spec)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return out


def headline(report: AuditReport) -> list[str]:
    """Plain-language findings: the sentences a user should read first."""
    keys = {k.key: k for k in report.group_keys}
    lines = []
    task = keys["task"]
    if task.n_groups_multi and task.mixed_share > 0:
        lines.append(
            f"WARNING: grouping by task mixes different prompts: {task.mixed_share:.0%} of task "
            f"groups contain samples from more than one decision point "
            f"(on average {task.mean_decision_points:.1f} distinct contexts per group)."
        )
        if task.length_weight_max > 1:
            lines.append(
                f"Length weighting: inside a task group a long trajectory counts up to "
                f"{task.length_weight_max:.1f}x as often as a short one "
                f"(mean {task.length_weight_mean:.2f}x) in grpo_mixed's group mean and std, and in "
                f"the loss under token-mean or seq-mean-token-mean aggregation (rollout-mean "
                f"weighs every trajectory once)."
            )
    elif task.n_groups_multi:
        lines.append("Task groups do not mix decision points in this log.")
    node = keys["node"]
    lines.append(
        f"Exact baselines: {node.rows_covered:.0%} of rows share their exact context with at "
        f"least one other sample ({node.n_groups_multi} node groups with 2+ members)."
    )
    if node.rows_covered < 0.5:
        lines.append(
            "Most rows have no sibling from the same state: node advantages are 0 there. "
            "Tree rollouts (patr, rtpo) or Iterative GRPO create such groups."
        )
    return lines


def _version_lines(report: AuditReport) -> list[str]:
    """The staleness section: rows per policy version, lag by turn, mixing per key."""
    versions = ", ".join(f"v{v}: {n}" for v, n in sorted(report.versions.items()))
    lags = ", ".join(
        f"turn {t}: {_fmt(lag, '.2f')}"
        for t, lag in zip(report.turn_labels, report.version_lag_by_turn, strict=True)
    )
    out = [
        f"Policy versions (rows): {versions}",
        f"Versions behind the newest, by turn position: {lags}",
    ]
    rows = [
        [k.key, _fmt(k.version_mixed_share, ".0%"), _fmt(k.version_spread_max, ".0f")]
        for k in report.group_keys
    ]
    out += _table(["key", "groups mixing versions", "most versions apart"], rows)
    return out


def format_audit(report: AuditReport) -> str:
    """The audit as plain text."""
    histogram = ", ".join(f"{k} turns: {v}" for k, v in sorted(report.turns_histogram.items()))
    out = [
        f"turnrl audit of {report.source}",
        f"{report.n_rows} rows, {report.n_tasks} tasks, {report.n_trajectories} trajectories "
        f"({histogram})",
        "",
        *headline(report),
        "",
        "Group keys",
    ]
    rows = [
        [
            k.key,
            k.exact,
            str(k.n_groups),
            _fmt(k.mixed_share, ".0%"),
            _fmt(k.mean_decision_points, ".2f"),
            _fmt(k.zero_adv_share, ".0%"),
            f"{_fmt(k.length_weight_mean, '.2f')} / {_fmt(k.length_weight_max, '.2f')}",
            _fmt(k.rows_covered, ".0%"),
        ]
        for k in report.group_keys
    ]
    header = [
        "key",
        "exact",
        "groups",
        "mixed",
        "contexts/grp",
        "zero-adv",
        "len-weight",
        "rows in 2+",
    ]
    out += _table(header, rows)
    if report.versions:
        out += ["", *_version_lines(report)]
    out += [
        "",
        "Advantages by turn position (mean ± std), and their gap to the exact node baseline "
        "(rows with a sibling at the same context)",
    ]
    header = [
        "estimator",
        *(f"turn {t}" for t in report.turn_labels),
        "t0 |gap|",
        "t0 sign ok",
        "t>0 |gap|",
    ]
    rows = []
    for e in report.estimators:
        cells = [
            f"{_fmt(m, '+.2f')}±{_fmt(s, '.2f')}"
            for m, s in zip(e.adv_mean_by_turn, e.adv_std_by_turn, strict=True)
        ]
        rows.append(
            [
                e.estimator,
                *cells,
                _fmt(e.turn0_gap_mean_abs),
                _fmt(e.turn0_sign_agreement, ".0%"),
                _fmt(e.later_gap_mean_abs),
            ]
        )
    out += _table(header, rows)
    for name, reason in report.skipped.items():
        out.append(f"(skipped {name}: {reason})")
    out += [
        "",
        "mixed: share of groups (2+ members) with samples from different decision points.",
        "len-weight: mean / max over groups of how many times more the most-counted trajectory "
        "counts than the least-counted one.",
        "gaps compare mean-only estimators with the mean-only node baseline, the others with "
        "node normalised by std.",
    ]
    return "\n".join(out)
