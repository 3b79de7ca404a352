"""turnrl eval's table as markdown, rich and HTML, from a hand-built breakdown."""

from __future__ import annotations

from rich.console import Console

from turnrl.report.eval_tables import console_table, html_report, markdown_table

BREAKDOWN = {
    "all": {
        "tasks": 2,
        "episodes": 4,
        "success": 0.5,
        "pass@1": 0.5,
        "pass@2": 0.75,
        "tool_call_rate": 0.25,
        "success_called": None,
        "success_direct": 0.5,
        "turns": 2.0,
        "tokens": 31.25,
    }
}


def test_markdown_table_has_one_row_per_group_and_the_pass_columns() -> None:
    lines = markdown_table(BREAKDOWN).splitlines()
    assert lines[0] == (
        "| kind | tasks | episodes | success | pass@1 | pass@2 | tool rate | ok called "
        "| ok direct | turns | tokens |"
    )
    assert lines[2] == "| all | 2 | 4 | 0.500 | 0.500 | 0.750 | 0.250 | - | 0.500 | 2.000 | 31.2 |"


def test_console_and_html_tables_hold_the_same_cells() -> None:
    console = Console(width=200, record=True)
    console.print(console_table(BREAKDOWN, "title"))
    text = console.export_text()
    assert "0.750" in text and "31.2" in text
    page = html_report(BREAKDOWN, {"eval_success": 0.5}, title="t <x>", notes=["n"])
    assert page.startswith("<!DOCTYPE html>") and "<title>t &lt;x&gt;</title>" in page
    assert "<td>all</td><td>2</td><td>4</td><td>0.500</td><td>0.500</td><td>0.750</td>" in page
    assert "<td>eval_success</td><td>0.500</td>" in page
