"""Which metric goes in which plot, and which plot in which section of the report.

A *panel* is one plot: a title and the metrics drawn on it (per-tag variants and
related statistics share one panel). Sections follow the questions a person asks
of a run, in order:

1. learning curves: held-out success, tool use, return and turns;
2. rollouts: what the training batches looked like;
3. credit: advantages by turn position and groups whose advantages are all zero;
4. optimisation: loss, KL, clip fraction, gradient norm, timing;
5. other: every remaining metric that changes, one panel each.

A metric with a single value over every step of every run (*flat*) is drawn only next
to metrics that change (held-out tool use on easy tasks staying at 0 while it rises on
hard ones says something); a panel of flat metrics only is left out, and the report
lists those metrics with their value instead. Metric keys are matched by name, so
runs of any environment or trainer fit: a panel whose metrics no run logged is left out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from turnrl.report.runs import RunData, metric_order

EVAL_PREFIX = "eval_"
LEARNING_CURVES = "Learning curves"
_TAG = r"_[a-z0-9]+"


@dataclass(frozen=True)
class Panel:
    """One plot: its title and the metrics drawn on it, in legend order."""

    title: str
    metrics: tuple[str, ...]


@dataclass(frozen=True)
class Section:
    """A heading, a sentence saying what it shows, and its panels."""

    title: str
    note: str
    panels: tuple[Panel, ...]
    folded: bool = False
    """Shown collapsed (``<details>``): the section is long and rarely looked at first."""
    large: bool = False
    """Larger plots, two per row (the learning curves)."""


@dataclass(frozen=True)
class _Spec:
    title: str
    patterns: tuple[str, ...]
    """Regular expressions (full match) of the panel's metrics, in legend order."""


_SPECS: tuple[tuple[str, str, tuple[_Spec, ...]], ...] = (
    (
        LEARNING_CURVES,
        "Held-out evaluations (no smoothing; one point per evaluation) and, where "
        "marked, the training rollouts (smoothed).",
        (
            _Spec("Held-out success", (r"eval_success", rf"eval_success{_TAG}")),
            _Spec("Held-out tool use", (r"eval_tool_rate", rf"eval_tool_rate{_TAG}")),
            _Spec("Return", (r"eval_return", r"return")),
            _Spec("Turns per episode", (r"eval_turns", r"turns")),
        ),
    ),
    (
        "Rollouts",
        "The training batches, step by step (smoothed).",
        (
            _Spec("Training success", (r"success", rf"success{_TAG}")),
            _Spec("Training tool use", (r"tool_rate", rf"tool_rate{_TAG}", r"tool_open_rate")),
            _Spec("Return by task tag", (rf"return{_TAG}",)),
            _Spec("Turns by task tag", (rf"turns{_TAG}",)),
            _Spec(
                "Malformed and truncated responses; episodes cut at the context cap",
                (r"malformed_rate", r"truncated_rate", r"context_truncated_frac"),
            ),
            _Spec(
                "Tokens per step",
                (r"n_tokens", r"tokens_all", r"tokens_unique", r"tokens_computed"),
            ),
        ),
    ),
    (
        "Credit",
        "Advantages the estimator assigned, by turn position, and the share of groups "
        "whose advantages were all zero (they teach nothing).",
        (
            _Spec("Advantage mean by turn", (r"adv_mean_turn\w+",)),
            _Spec("Advantage std by turn", (r"adv_std_turn\w+",)),
            _Spec("Zero-advantage groups", (r"zero_adv_group_frac",)),
            _Spec("Mean |advantage|", (r"adv_abs_mean",)),
        ),
    ),
    (
        "Optimisation",
        "The PPO-clip update (means over its optimiser steps) and where the time went.",
        (
            _Spec("Loss", (r"loss", r"pg_loss")),
            _Spec("KL", (r"kl", r"kl_\w+", r"approx_kl_old")),
            _Spec("Clip fraction", (r"clip_frac\w*",)),
            _Spec("Gradient norm", (r"grad_norm",)),
            _Spec("Ratio to the sampling policy", (r"ratio_mean",)),
            _Spec("Policy entropy (nats per trained token)", (r"entropy",)),
            _Spec("Seconds per step", (r"seconds_\w+",)),
        ),
    ),
)


def flat_metrics(runs: Sequence[RunData], metrics: Iterable[str]) -> dict[str, float]:
    """Metrics with one value over every logged step of every run, with that value."""
    flat: dict[str, float] = {}
    for key in metrics:
        values = {v for run in runs for v in run.series(key)[1] if not math.isnan(v)}
        if len(values) == 1:
            flat[key] = values.pop()
    return flat


def _matching(patterns: Sequence[str], available: Sequence[str], taken: set[str]) -> list[str]:
    out: list[str] = []
    for pattern in patterns:
        out += [k for k in available if k not in {*taken, *out} and re.fullmatch(pattern, k)]
    return out


def build_sections(runs: Sequence[RunData], metrics: Sequence[str]) -> list[Section]:
    """The report's plot sections over ``metrics``, in order (see the module doc)."""
    flat = flat_metrics(runs, metrics)
    available = metric_order(metrics)
    taken: set[str] = set()
    sections: list[Section] = []
    for title, note, specs in _SPECS:
        panels = []
        for spec in specs:
            keys = _matching(spec.patterns, available, taken)
            taken |= set(keys)
            if any(key not in flat for key in keys):
                panels.append(Panel(spec.title, tuple(keys)))
        if panels:
            sections.append(Section(title, note, tuple(panels), large=title == LEARNING_CURVES))
    rest = [k for k in available if k not in taken and k not in flat]
    if rest:
        sections.append(
            Section(
                "Other metrics",
                "Every other metric that changes during training, one plot each.",
                tuple(Panel(k, (k,)) for k in rest),
                folded=True,
            )
        )
    return sections
