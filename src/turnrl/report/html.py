"""A single self-contained HTML report over one or more run directories.

Sections: the runs (label, path, steps logged), tables of final values (per run, and per
label as mean ± std when a label has several seeds), one plot per metric (PNG embedded
as base64, so the file can be mailed or attached as is), and each run's config copy.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

from turnrl.io import atomic_write_text
from turnrl.report.plots import plot_metric
from turnrl.report.runs import RunData, all_metrics, group_by_label, load_runs
from turnrl.report.summary import label_finals, run_finals

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
table { border-collapse: collapse; font-size: 0.9em; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; }
figure { margin: 0; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
"""


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _runs_section(runs: Sequence[RunData]) -> str:
    rows = [[run.name, run.label, str(run.path), str(len(run.records))] for run in runs]
    return "<h2>Runs</h2>" + _table(["run", "label", "directory", "steps logged"], rows)


def _finals_section(runs: Sequence[RunData], metrics: Sequence[str], last: int) -> str:
    per_run = run_finals(runs, last)
    names = [run.name for run in runs]
    rows = [[key] + [_fmt(per_run[name].get(key)) for name in names] for key in metrics]
    when = "last logged value" if last == 1 else f"mean of the last {last} logged values"
    parts = [f"<h2>Final values</h2><p>Per run ({when}).</p>", _table(["metric", *names], rows)]
    groups = group_by_label(runs)
    if any(len(group) > 1 for group in groups.values()):
        per_label = label_finals(runs, last)
        labels = list(groups)
        rows = []
        for key in metrics:
            row = [key]
            for label in labels:
                entry = per_label[label].get(key)
                row.append("" if entry is None else f"{entry[0]:.4g} ± {entry[1]:.2g} ({entry[2]})")
            rows.append(row)
        parts.append("<p>Per label: mean ± std across runs (number of runs).</p>")
        parts.append(_table(["metric", *labels], rows))
    return "".join(parts)


def _plots_section(runs: Sequence[RunData], metrics: Sequence[str], smoothing: int) -> str:
    groups = group_by_label(runs)
    figures = []
    for key in metrics:
        png = base64.b64encode(plot_metric(groups, key, smoothing=smoothing)).decode("ascii")
        figures.append(
            f'<figure id="metric-{html.escape(key)}">'
            f'<img alt="{html.escape(key)}" src="data:image/png;base64,{png}"></figure>'
        )
    note = "" if smoothing <= 1 else f"<p>Trailing moving average over {smoothing} steps.</p>"
    return f'<h2>Metrics</h2>{note}<div class="plots">{"".join(figures)}</div>'


def _configs_section(runs: Sequence[RunData]) -> str:
    parts = ["<h2>Configs</h2>"]
    for run in runs:
        text = run.config_text if run.config_text is not None else "(no config copy found)"
        parts.append(
            f"<details><summary>{html.escape(run.name)}</summary>"
            f"<pre>{html.escape(text)}</pre></details>"
        )
    return "".join(parts)


def render_report(
    runs: Sequence[RunData], *, title: str = "turnrl report", smoothing: int = 1, last: int = 1
) -> str:
    """The HTML text of a report over already-loaded runs."""
    metrics = all_metrics(runs)
    body = "".join(
        [
            f"<h1>{html.escape(title)}</h1>",
            _runs_section(runs),
            _finals_section(runs, metrics, last),
            _plots_section(runs, metrics, smoothing),
            _configs_section(runs),
        ]
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def write_report(
    run_dirs: Sequence[str | Path],
    out_path: str | Path,
    *,
    title: str = "turnrl report",
    smoothing: int = 1,
    last: int = 1,
) -> Path:
    """Write one self-contained HTML report over ``run_dirs`` to ``out_path``.

    One plot per numeric metric found in any run's ``metrics.jsonl`` (runs overlaid;
    runs sharing a config ``label`` drawn as mean ± std), tables of final values and the
    config copies. ``smoothing`` is a trailing moving-average window for the plots;
    ``last`` averages that many final values in the tables. Returns ``out_path``.
    """
    if not run_dirs:
        raise ValueError("write_report needs at least one run directory")
    runs = load_runs(run_dirs)
    text = render_report(runs, title=title, smoothing=smoothing, last=last)
    return atomic_write_text(out_path, text)
