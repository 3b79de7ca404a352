"""Shared by the benchmark scripts: replace one ``## section`` of RESULTS.md in place."""

from __future__ import annotations

import argparse
import os
import platform
import re
from datetime import date
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def replace_section(heading: str, text: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section starting with ``heading``, keeping the others.

    ``text`` must start with the heading line itself.
    """
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(old):
        new = pattern.sub(lambda _: text.rstrip("\n") + "\n\n", old, count=1)
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.write_text(new.rstrip("\n") + "\n")


def write_section(path: Path, title: str, body: str, command: str, day: date) -> None:
    """Write a section with the standard header lines (command, date, machine)."""
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    text = (
        f"## {title}\n\n- command: `{command}`\n- date: {day.isoformat()}\n- machine: {machine}; "
        "shared with other jobs while measured, so absolute times are noisy; ratios compare "
        "runs in the same process\n\n" + body + "\n"
    )
    replace_section(f"## {title}", text, path)


def add_write_options(parser: argparse.ArgumentParser, command: str) -> None:
    """``--write`` (a ``--report``'s tables into RESULTS.md too), ``--note`` (a paragraph
    before them) and ``--command`` (the command to name, default ``command``)."""
    parser.add_argument("--write", action="store_true", help="--report: into RESULTS.md too")
    parser.add_argument("--note", default="", help="--write: a paragraph before the tables")
    parser.add_argument("--command", default=command, help="--write: the command to name")


def write_parts(parts: dict[str, str], note: str, command: str) -> None:
    """Write every ``title -> tables`` of ``parts`` as a RESULTS.md section dated today,
    ``note`` (when given) before the tables."""
    prefix = f"{note}\n\n" if note else ""
    for title, body in parts.items():
        write_section(RESULTS, title, prefix + body, command, date.today())
