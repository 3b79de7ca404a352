"""One PNG per metric: runs overlaid, seeds of one label summarised as mean ± std.

Uses matplotlib's object API with the Agg canvas directly (no ``pyplot``), so it never
changes the process's global backend and needs no display.

Within a label with several runs (seeds): each run is drawn thin and faint, and the
mean across runs is drawn bold with a ± one-standard-deviation band (ddof=1). Mean and
band are computed only at steps every run of the label logged, so a seed that stopped
early does not make the mean jump; its own thin line still shows.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

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


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over up to ``window`` points (NaNs skipped); 1 = none."""
    if window <= 1:
        return list(values)
    out = []
    for index in range(len(values)):
        chunk = [v for v in values[max(0, index - window + 1) : index + 1] if not math.isnan(v)]
        out.append(sum(chunk) / len(chunk) if chunk else math.nan)
    return out


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


def plot_metric(groups: dict[str, list[RunData]], key: str, *, smoothing: int = 1) -> bytes:
    """PNG bytes of one metric against training step, one colour per label."""
    figure = Figure(figsize=(6.4, 3.6), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for index, (label, runs) in enumerate(groups.items()):
        color = _COLORS[index % len(_COLORS)]
        present = [run for run in runs if run.series(key)[0]]
        if not present:
            continue
        several = len(present) > 1
        for run in present:
            steps, values = run.series(key)
            marker = "o" if len(steps) <= 20 else None
            axes.plot(
                steps,
                smooth(values, smoothing),
                color=color,
                marker=marker,
                markersize=3,
                linewidth=0.8 if several else 1.6,
                alpha=0.35 if several else 1.0,
                label=None if several else label,
            )
        if several:
            steps, means, stds = _seed_band(present, key, smoothing)
            if steps:
                low = [m - s for m, s in zip(means, stds, strict=True)]
                high = [m + s for m, s in zip(means, stds, strict=True)]
                axes.fill_between(steps, low, high, color=color, alpha=0.2, linewidth=0)
            axes.plot(
                steps,
                means,
                color=color,
                linewidth=2.0,
                label=f"{label} (mean ± std, {len(present)} runs)",
            )
    axes.set_title(key)
    axes.set_xlabel("step")
    axes.grid(True, alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
