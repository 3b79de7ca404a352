"""Reports over run directories: the held-out before/after table, a self-contained HTML
file, final-value summaries.

``write_report(run_dirs, out_path)`` reads each run's ``metrics.jsonl`` and config copy
and writes one HTML file (``turnrl.report.html`` says what it shows, in which order);
``heldout_console_table(run_dir)`` is the before/after table ``turnrl train`` prints;
``summary`` / ``label_summary`` return the final values as dicts for printing tables.
"""

from turnrl.report.heldout import heldout_console_table, heldout_table
from turnrl.report.html import render_report, write_report
from turnrl.report.runs import RunData, load_run, load_runs, metric_order
from turnrl.report.summary import label_summary, summary

__all__ = [
    "RunData",
    "heldout_console_table",
    "heldout_table",
    "label_summary",
    "load_run",
    "load_runs",
    "metric_order",
    "render_report",
    "summary",
    "write_report",
]
