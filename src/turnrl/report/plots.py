"""Plots of metrics against training step: runs overlaid, seeds of one label as a band.

Uses matplotlib's object API with the Agg canvas directly (no ``pyplot``), so it never
changes the process's global backend and needs no display.

A panel draws one or more metrics (``plot_panel``). With one label, each metric has its
own colour; with several labels, each label has a colour and each metric a line style.
Within a label with several runs (seeds), each run is drawn thin and faint and the mean
across runs bold with a ± one-standard-deviation band (ddof=1). Mean and band are
computed only at steps every run of the label logged, so a seed that stopped early
does not make the mean jump; its own thin line still shows.

Smoothing is a trailing moving average. Held-out metrics (``eval_*``, a few points,
each an evaluation on the same tasks) are never smoothed and drawn with markers; a
single run's smoothed training metric is drawn over its raw values, shown faint.

Figures are SVG with text kept as text (small, sharp at any zoom) or PNG
(``plot_metric``, for write-ups that embed image files).
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence

from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from turnrl.report.runs import RunData, mean_std

_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_STYLES = ("-", "--", ":", "-.")
PANEL_SIZE = (3.9, 2.5)
"""Inches at 100 dpi: 390 x 250 px, three panels side by side on a 1280 px screen."""
LARGE_PANEL_SIZE = (5.9, 3.2)
"""590 x 320 px, two side by side."""
_SVG_RC = {
    "svg.fonttype": "none",  # text as <text>, not glyph paths: a fraction of the size
    "svg.hashsalt": "turnrl",  # fixed element ids: the same runs give the same bytes
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],  # one font name per text element, not eleven
}
_COORDINATES = re.compile(r'( (?:d|x|y)=")([^"]*)(")')
_DECIMALS = re.compile(r"(\d+\.\d)\d+")


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over up to ``window`` points (NaNs skipped); 1 = none."""
    if window <= 1:
        return list(values)
    out = []
    for index in range(len(values)):
        chunk = [v for v in values[max(0, index - window + 1) : index + 1] if not math.isnan(v)]
        out.append(sum(chunk) / len(chunk) if chunk else math.nan)
    return out


def auto_window(runs: Sequence[RunData]) -> int:
    """A smoothing window for per-step metrics: about a twelfth of the longest run."""
    longest = max((len(run.records) for run in runs), default=0)
    return max(1, round(longest / 12))


def is_heldout(key: str) -> bool:
    """Held-out evaluation metrics are never smoothed."""
    return key.startswith("eval_")


def _seed_band(
    runs: Sequence[RunData], key: str, window: int
) -> tuple[list[float], list[float], list[float]]:
    """Steps shared by all runs, with the mean and std across runs there."""
    per_run = []
    for run in runs:
        steps, values = run.series(key)
        per_run.append(dict(zip(steps, smooth(values, window), strict=True)))
    shared = sorted(set.intersection(*(set(values) for values in per_run)))
    means, stds = [], []
    for step in shared:
        column = [values[step] for values in per_run if not math.isnan(values[step])]
        mean, std = mean_std(column) if column else (math.nan, math.nan)
        means.append(mean)
        stds.append(std)
    return shared, means, stds


def _draw(
    axes, runs: Sequence[RunData], key: str, window: int, color: str, style: str, name: str
) -> None:
    """One metric of one label on ``axes``: runs, and mean ± std when there are several."""
    present = [run for run in runs if run.series(key)[0]]
    if not present:
        return
    width = 1 if is_heldout(key) else window
    several = len(present) > 1
    for run in present:
        steps, values = run.series(key)
        marker = "o" if is_heldout(key) or len(steps) <= 20 else None
        if not several and width > 1:
            axes.plot(steps, values, color=color, linestyle=style, linewidth=0.6, alpha=0.25)
        axes.plot(
            steps,
            smooth(values, width),
            color=color,
            linestyle=style,
            marker=marker,
            markersize=3,
            linewidth=0.7 if several else 1.6,
            alpha=0.35 if several else 1.0,
            label=None if several else name,
        )
    if several:
        steps, means, stds = _seed_band(present, key, width)
        if steps:
            low = [m - s for m, s in zip(means, stds, strict=True)]
            high = [m + s for m, s in zip(means, stds, strict=True)]
            axes.fill_between(steps, low, high, color=color, alpha=0.18, linewidth=0)
        axes.plot(
            steps,
            means,
            color=color,
            linestyle=style,
            linewidth=2.0,
            label=f"{name} (mean ± std, {len(present)} runs)",
        )


def _legend_name(key: str, label: str, n_keys: int, n_labels: int, window: int) -> str:
    """Metric names with one label, label names with one metric, both otherwise."""
    key_name = key if is_heldout(key) or window <= 1 else f"{key} (smoothed)"
    if n_labels == 1:
        return key_name
    return label if n_keys == 1 else f"{label} · {key_name}"


def panel_figure(
    groups: dict[str, list[RunData]],
    keys: Sequence[str],
    title: str,
    *,
    window: int = 1,
    fmt: str = "svg",
    size: tuple[float, float] = PANEL_SIZE,
) -> bytes:
    """One panel: ``keys`` against training step for every label, as SVG or PNG bytes."""
    with rc_context(_SVG_RC if fmt == "svg" else {}):
        return _panel_figure(groups, keys, title, window=window, fmt=fmt, size=size)


def _panel_figure(
    groups: dict[str, list[RunData]],
    keys: Sequence[str],
    title: str,
    *,
    window: int,
    fmt: str,
    size: tuple[float, float],
) -> bytes:
    figure = Figure(figsize=size, dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    labels = list(groups)
    for li, (label, runs) in enumerate(groups.items()):
        for ki, key in enumerate(keys):
            if len(labels) > 1:
                color, style = _COLORS[li % len(_COLORS)], _STYLES[ki % len(_STYLES)]
            else:
                color, style = _COLORS[ki % len(_COLORS)], "-"
            name = _legend_name(key, label, len(keys), len(labels), window)
            _draw(axes, runs, key, window, color, style, name)
    axes.set_title(title, fontsize=10)
    axes.set_xlabel("step", fontsize=8)
    axes.tick_params(labelsize=7)
    axes.grid(True, alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=6.5, framealpha=0.7)
    figure.tight_layout(pad=0.4)
    buffer = io.BytesIO()
    if fmt != "svg":
        figure.savefig(buffer, format=fmt)
        return buffer.getvalue()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    return minify_svg(buffer.getvalue().decode("utf-8")).encode("utf-8")


def minify_svg(text: str) -> str:
    """Matplotlib's SVG, smaller: coordinates (path data, x, y) to 0.1 px, no indentation.

    Text content and styles are left as they are (tick labels keep every digit).
    """
    text = _COORDINATES.sub(lambda m: m[1] + _DECIMALS.sub(r"\1", m[2]) + m[3], text)
    text = re.sub(r"\s*\n\s*", " ", text)
    return re.sub(r">\s+<", "><", text)


def plot_metric(groups: dict[str, list[RunData]], key: str, *, smoothing: int = 1) -> bytes:
    """PNG bytes of one metric against training step, one colour per label."""
    return panel_figure(groups, [key], key, window=smoothing, fmt="png", size=(6.4, 3.6))
