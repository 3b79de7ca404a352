"""Before/after comparison of a run's held-out evaluations (for the terminal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from turnrl.io import read_jsonl_tolerant

HEADLINE_METRICS = (
    "eval_success",
    "eval_success_hard",
    "eval_success_easy",
    "eval_tool_rate_hard",
    "eval_tool_rate_easy",
    "eval_turns",
    "eval_return",
    "eval_malformed_rate",
)


def before_after(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first and the last evaluation rows of a run's ``metrics.jsonl``."""
    rows = [r for r in read_jsonl_tolerant(Path(run_dir) / "metrics.jsonl") if "eval_success" in r]
    if not rows:
        raise ValueError(f"{run_dir}: no evaluation rows in metrics.jsonl")
    return rows[0], rows[-1]


def before_after_table(run_dir: str | Path) -> Any:
    """A rich Table: each held-out metric after the warm start and after RL."""
    from rich.table import Table

    before, after = before_after(run_dir)
    table = Table(title=f"Held-out evaluation ({Path(run_dir).name})")
    table.add_column("metric")
    table.add_column(f"warm start (step {before['step']})", justify="right")
    table.add_column(f"after RL (step {after['step']})", justify="right")
    for key in HEADLINE_METRICS:
        if key in before and key in after:
            table.add_row(key.removeprefix("eval_"), f"{before[key]:.3f}", f"{after[key]:.3f}")
    return table
