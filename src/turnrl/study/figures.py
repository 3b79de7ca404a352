"""A study's curve: one metric per arm, every seed a thin line, the mean a thick one."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from turnrl.study.declaration import Cell, Study
from turnrl.study.values import curve


def plot_curves(
    study: Study, finished: Sequence[Cell], rows: Callable[[Cell], list[dict]], path: Path
) -> Path | None:
    """Write the figure of ``study.curve`` (one panel per setting); ``None`` if it has none."""
    if study.curve is None:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    settings = [s.name for s in study.settings]
    figure = Figure(figsize=(6.4 * len(settings), 4.0), dpi=100)
    FigureCanvasAgg(figure)
    for panel, setting in enumerate(settings):
        axes = figure.add_subplot(1, len(settings), panel + 1)
        for index, arm in enumerate(study.arms):
            runs = [c for c in finished if c.arm == arm.name and c.setting == setting]
            lines = [curve(rows(c), study.curve, study.curve_x) for c in runs]
            lines = [line for line in lines if line[0]]
            if not lines:
                continue
            color = f"C{index}"
            for x, y in lines:
                axes.plot(x, y, color=color, alpha=0.3, linewidth=0.8)
            n = min(len(y) for _, y in lines)
            x_mean = np.mean([x[:n] for x, _ in lines], axis=0)
            y_mean = np.mean([y[:n] for _, y in lines], axis=0)
            axes.plot(x_mean, y_mean, color=color, linewidth=2, label=f"{arm.name} ({len(lines)})")
        axes.set_xlabel(study.curve_x)
        axes.set_ylabel(study.curve)
        if setting:
            axes.set_title(setting)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=8)
    title = study.title.replace("`", "")
    # wrapped to the figure's width (about 11 characters per inch at this size): a
    # long title on one line runs off both edges
    width = int(11 * 6.4 * len(settings))
    wrapped = textwrap.fill(f"{title}: thin lines are seeds, thick the mean", width)
    figure.suptitle(wrapped, fontsize=10)
    figure.tight_layout()
    from turnrl.io import atomic_open

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path) as handle:
        figure.savefig(handle, format="png")
    return path
