"""``turnrl eval``'s table, three ways: on the terminal (rich), as markdown, and as an
HTML page in the style of the run report (:mod:`turnrl.report.html`).

One row per group of episodes (all of them, then each task kind), one column per
statistic of :func:`turnrl.train.eval_summary.breakdown`; below it, the run-style
``eval_*`` metrics (the numbers a training run logs for the same evaluation).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from turnrl.report.html import html_page, html_table

__all__ = ["COLUMNS", "console_table", "html_report", "markdown_table"]

COLUMNS: tuple[tuple[str, str], ...] = (
    ("tasks", "tasks"),
    ("episodes", "episodes"),
    ("success", "success"),
    ("tool_call_rate", "tool rate"),
    ("success_called", "ok called"),
    ("success_direct", "ok direct"),
    ("turns", "turns"),
    ("tokens", "tokens"),
)
"""The breakdown's columns and their headers (short, for a terminal: :data:`LEGEND`
says what they are); the ``pass@k`` columns follow success."""

LEGEND = (
    "tool rate: share of episodes with a tool call; ok called / ok direct: success of "
    "the episodes that called a tool / answered directly (- where none did); turns and "
    "tokens (sampled): per episode"
)


def _columns(breakdown: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
    first = next(iter(breakdown.values()))
    passes = [(key, key) for key in first if key.startswith("pass@")]
    return [*COLUMNS[:3], *passes, *COLUMNS[3:]]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def _rows(breakdown: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    columns = _columns(breakdown)
    header = ["kind", *(title for _, title in columns)]
    rows = [
        [group, *(_cell(stats.get(key)) for key, _ in columns)]
        for group, stats in breakdown.items()
    ]
    return header, rows


def console_table(breakdown: Mapping[str, Mapping[str, Any]], title: str) -> Any:
    """A rich Table of the breakdown."""
    from rich.table import Table

    header, rows = _rows(breakdown)
    table = Table(title=title, caption=LEGEND)
    table.add_column(header[0])
    for name in header[1:]:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def markdown_table(breakdown: Mapping[str, Mapping[str, Any]]) -> str:
    """The breakdown as a GitHub markdown table."""
    header, rows = _rows(breakdown)
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + f"\n\n{LEGEND}.\n"


def html_report(
    breakdown: Mapping[str, Mapping[str, Any]],
    metrics: Mapping[str, float],
    *,
    title: str,
    notes: Sequence[str],
) -> str:
    """A self-contained HTML page: the breakdown, then the run-style metrics."""
    header, rows = _rows(breakdown)
    metric_rows = [[key, _cell(float(value))] for key, value in sorted(metrics.items())]
    body = "".join(
        [
            f"<h1>{html.escape(title)}</h1>",
            *(f'<p class="note">{html.escape(note)}</p>' for note in notes),
            "<h2>Evaluation</h2>",
            html_table(header, rows, table_id="eval"),
            f'<p class="note">{html.escape(LEGEND)}.</p>',
            "<h2>Metrics as a training run logs them</h2>",
            html_table(["metric", "value"], metric_rows, table_id="eval-metrics"),
        ]
    )
    return html_page(title, body)
