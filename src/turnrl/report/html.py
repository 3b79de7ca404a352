"""A single self-contained HTML report over one or more run directories.

In the order a person asks:

1. the held-out before/after table (first and last evaluation; what ``turnrl train``
   prints), per label, seeds as mean ± std;
2. the learning curves that matter (held-out success and tool use, return, turns);
3. sections of plots: rollouts, credit, optimisation (``turnrl.report.sections``),
   and every other changing metric, folded;
4. the table of final values of every metric; metrics that never change, folded,
   with their value; the runs and their config copies, folded.

Plots are SVG embedded as data URIs, so the file can be mailed or attached as is
(about 20 kB per plot; a calculator run's report is about 0.4 MB).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from turnrl.io import atomic_write_text
from turnrl.report.heldout import HeldOutTable, heldout_table
from turnrl.report.plots import LARGE_PANEL_SIZE, PANEL_SIZE, auto_window, panel_figure
from turnrl.report.runs import RunData, all_metrics, group_by_label, load_runs
from turnrl.report.sections import Section, build_sections, flat_metrics
from turnrl.report.summary import label_finals, run_finals

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; max-width: 1400px; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
p.note { color: #555; margin-top: 0; }
table { border-collapse: collapse; font-size: 0.9em; margin-bottom: 1em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; }
.plots { display: flex; flex-wrap: wrap; gap: 0.6em; }
figure { margin: 0; } figure img { width: 390px; height: 250px; display: block; }
figure.large img { width: 590px; height: 320px; }
details { margin: 0.8em 0; } summary { cursor: pointer; font-weight: 600; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
"""


_URI_SAFE = " !$&'()*+,-./:;=?@[]_~<>{}|^`"
"""Printable ASCII that may stay as is in a data URI (everything but ``"``, ``#``, ``%``
and backslash is fine there)."""


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, table_id: str = "") -> str:
    """An HTML table of text cells (escaped here), in the report's style."""
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    ident = f' id="{table_id}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _heldout_section(table: HeldOutTable | None) -> str:
    """The before/after table: per label, first and last evaluation side by side."""
    if table is None:
        return "<p>No held-out evaluations logged.</p>"
    header = "".join(f'<th colspan="2">{html.escape(label)}</th>' for label in table.labels)
    sub = "".join(
        f"<th>warm start (step {html.escape(table.steps[label][0])})</th>"
        f"<th>after RL (step {html.escape(table.steps[label][1])})</th>"
        for label in table.labels
    )
    rows = []
    for metric in table.metrics:
        cells = [html.escape(metric)]
        for label in table.labels:
            for side in (table.before, table.after):
                cell = side[label].get(metric)
                cells.append("" if cell is None else cell.text())
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return (
        "<h2>Held-out evaluation</h2>"
        '<p class="note">First and last evaluation on the held-out tasks'
        " (mean ± std across runs where a label has several).</p>"
        f'<table id="heldout"><thead><tr><th rowspan="2">metric</th>{header}</tr>'
        f"<tr>{sub}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def html_page(title: str, body: str) -> str:
    """A whole HTML document around ``body``, in the report's style."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def svg_data_uri(svg: bytes) -> str:
    """An SVG as a ``data:`` URI, percent-encoded where URLs need it (not base64: a
    quarter smaller); escape ``&`` (``_attribute``) to put it in an attribute."""
    return "data:image/svg+xml," + quote(svg.decode("utf-8"), safe=_URI_SAFE)


def _figure(
    groups: dict[str, list[RunData]], keys: Sequence[str], title: str, window: int, large: bool
) -> str:
    size = LARGE_PANEL_SIZE if large else PANEL_SIZE
    uri = svg_data_uri(panel_figure(groups, keys, title, window=window, size=size))
    css = ' class="large"' if large else ""
    return (
        f'<figure id="plot-{html.escape(_slug(title))}"{css}>'
        f'<img alt="{html.escape(title)}" src="{_attribute(uri)}"></figure>'
    )


def _attribute(uri: str) -> str:
    """A URI without ``"`` as a double-quoted attribute value (``<`` and ``>`` may stay)."""
    return uri.replace("&", "&amp;")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _plots_section(groups: dict[str, list[RunData]], section: Section, window: int) -> str:
    figures = "".join(
        _figure(groups, p.metrics, p.title, window, section.large) for p in section.panels
    )
    body = f'<p class="note">{html.escape(section.note)}</p><div class="plots">{figures}</div>'
    ident = f'id="section-{_slug(section.title)}"'
    if section.folded:
        count = len(section.panels)
        return (
            f"<details {ident}><summary>{html.escape(section.title)} ({count} plots)</summary>"
            f"{body}</details>"
        )
    return f"<section {ident}><h2>{html.escape(section.title)}</h2>{body}</section>"


def _finals_section(runs: Sequence[RunData], metrics: Sequence[str], last: int) -> str:
    per_run = run_finals(runs, last)
    names = [run.name for run in runs]
    rows = [[key] + [_fmt(per_run[name].get(key)) for name in names] for key in metrics]
    when = "last logged value" if last == 1 else f"mean of the last {last} logged values"
    parts = [
        "<h2>Final values</h2>",
        f'<p class="note">Every metric that changes, per run ({when}).</p>',
        html_table(["metric", *names], rows, table_id="finals"),
    ]
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
        parts.append('<p class="note">Per label: mean ± std across runs (number of runs).</p>')
        parts.append(html_table(["metric", *labels], rows))
    return "".join(parts)


def _flat_section(flat: dict[str, float]) -> str:
    if not flat:
        return ""
    rows = [[key, _fmt(value)] for key, value in flat.items()]
    return (
        f'<details id="flat"><summary>Metrics that never change ({len(flat)})</summary>'
        '<p class="note">One value over every logged step of every run (plotted only '
        "next to metrics that change).</p>"
        f"{html_table(['metric', 'value'], rows)}</details>"
    )


def _runs_section(runs: Sequence[RunData]) -> str:
    rows = [[run.name, run.label, str(run.path), str(len(run.records))] for run in runs]
    parts = [
        f'<details id="runs"><summary>Runs and configs ({len(runs)})</summary>',
        html_table(["run", "label", "directory", "steps logged"], rows),
    ]
    for run in runs:
        text = run.config_text if run.config_text is not None else "(no config copy found)"
        parts.append(f"<h3>{html.escape(run.name)}</h3><pre>{html.escape(text)}</pre>")
    parts.append("</details>")
    return "".join(parts)


def render_report(
    runs: Sequence[RunData],
    *,
    title: str = "turnrl report",
    smoothing: int | None = None,
    last: int = 1,
) -> str:
    """The HTML text of a report over already-loaded runs.

    ``smoothing`` is the trailing moving-average window of per-step metrics
    (``None``: about a twelfth of the longest run; 1: none); held-out metrics are
    never smoothed. ``last`` averages that many final values in the tables.
    """
    groups = group_by_label(runs)
    metrics = all_metrics(runs)
    flat = flat_metrics(runs, metrics)
    sections = build_sections(runs, metrics)
    window = auto_window(runs) if smoothing is None else max(1, smoothing)
    labels = ", ".join(
        f"{label} ({len(group)} run{'s' * (len(group) > 1)})" for label, group in groups.items()
    )
    body = "".join(
        [
            f"<h1>{html.escape(title)}</h1>",
            f'<p class="note">{html.escape(labels)}; per-step metrics smoothed over '
            f"{window} step{'s' * (window > 1)}.</p>",
            _heldout_section(heldout_table(groups)),
            *(_plots_section(groups, s, window) for s in sections),
            _finals_section(runs, [m for m in metrics if m not in flat], last),
            _flat_section(flat),
            _runs_section(runs),
        ]
    )
    return html_page(title, body)


def write_report(
    run_dirs: Sequence[str | Path],
    out_path: str | Path,
    *,
    title: str = "turnrl report",
    smoothing: int | None = None,
    last: int = 1,
) -> Path:
    """Write one self-contained HTML report over ``run_dirs`` to ``out_path``.

    See the module docstring for what it shows and ``render_report`` for the
    options. Runs sharing a config ``label`` are seeds of one method (mean ± std).
    Returns ``out_path``.
    """
    if not run_dirs:
        raise ValueError("write_report needs at least one run directory")
    runs = load_runs(run_dirs)
    text = render_report(runs, title=title, smoothing=smoothing, last=last)
    return atomic_write_text(out_path, text)
