"""Reports over run directories: final-value summaries and a self-contained HTML file.

``write_report(run_dirs, out_path)`` reads each run's ``metrics.jsonl`` and config copy
and writes one HTML file with a plot per metric; ``summary`` / ``label_summary`` return
the final values as dicts for printing tables.
"""

from turnrl.report.html import render_report, write_report
from turnrl.report.runs import RunData, load_run, load_runs, metric_order
from turnrl.report.summary import label_summary, summary

__all__ = [
    "RunData",
    "label_summary",
    "load_run",
    "load_runs",
    "metric_order",
    "render_report",
    "summary",
    "write_report",
]
