"""Reports over run directories: the held-out before/after table, a self-contained HTML
file, final-value summaries.

``write_report(run_dirs, out_path)`` reads each run's ``metrics.jsonl`` and config copy
and writes one HTML file (``turnrl.report.html`` says what it shows, in which order);
``heldout_console_table(run_dir)`` is the before/after table ``turnrl train`` prints;
``summary`` / ``label_summary`` return the final values as dicts for printing tables.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "heldout_console_table": "heldout",
    "heldout_table": "heldout",
    "render_report": "html",
    "write_report": "html",
    "RunData": "runs",
    "load_run": "runs",
    "load_runs": "runs",
    "metric_order": "runs",
    "label_summary": "summary",
    "summary": "summary",
}
"""Each public name's submodule. Imported on first use (PEP 562), so that importing a
submodule (``turnrl.report.eval_cli``, which every ``turnrl`` command's parser
registers) does not import matplotlib: a venv without the ``train`` extra (the adapter
venvs) still runs ``turnrl audit`` and ``turnrl credit``."""


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'turnrl.report' has no attribute {name!r}")
    return getattr(importlib.import_module(f"turnrl.report.{module}"), name)


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
