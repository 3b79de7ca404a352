"""``turnrl study``: list the declared studies, run what one is missing, summarise it,
and say what a design can detect (``power``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from turnrl.errors import UsageError


def repository_root() -> Path:
    """The checkout the studies belong to: the current directory or one above it that
    holds ``pyproject.toml`` and ``examples/``."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").exists() and (folder / "examples").is_dir():
            return folder
    raise UsageError(f"{here}: not inside a turnrl checkout (studies run from one)")


def cmd_list(args: argparse.Namespace) -> int:
    from turnrl.study.catalogue import MEASUREMENTS, STUDIES
    from turnrl.study.declaration import cells
    from turnrl.study.runner import FINISHED, cell_state, estimate_minutes

    root = repository_root()
    print(f"studies (time: the whole study on {args.jobs} core(s) here; measured = mean of")
    print("the cells finished here, else the declaration's estimate)")
    for study in STUDIES.values():
        every = cells(study, root)
        done = sum(cell_state(c) == FINISHED for c in every)
        minutes, timed, total = estimate_minutes(study, root, args.jobs)
        source = f"measured on {timed} cells" if timed else "estimated"
        print(
            f"  {study.name:20s} {total:3d} cells ({done} finished)  ~{minutes:.0f} min "
            f"({source})  -> {study.doc}   make study-{study.name}"
        )
    print("measurements (one command each, not a matrix of runs; estimated times)")
    for m in MEASUREMENTS.values():
        print(f"  {m.name:24s} ~{m.minutes:.0f} min  -> {m.doc}   {m.command}")
    return 0


def _progress_events(total: int) -> tuple[Any, Any]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    task = progress.add_task("cells", total=total)

    def on_event(event: str, cell: Any, outcome: Any) -> None:
        if event == "start":
            progress.console.print(f"start {cell.key}")
            return
        status = "done" if outcome.returncode == 0 else f"FAILED (exit {outcome.returncode})"
        progress.console.print(f"{status} {cell.key} {outcome.seconds:.0f} s")
        progress.advance(task)

    return progress, on_event


def cmd_run(args: argparse.Namespace) -> int:
    from turnrl.study.catalogue import get_study
    from turnrl.study.runner import log_path, pending_cells, run_study

    study = get_study(args.name)
    root = repository_root()
    only = [part for spec in args.only for part in spec.split(",") if part]
    todo = pending_cells(study, root, only)
    progress, on_event = _progress_events(len(todo))
    with progress:
        outcomes = run_study(study, root, jobs=args.jobs, only=only, on_event=on_event)
    failed = [o for o in outcomes if o.returncode != 0]
    for outcome in failed:
        print(f"failed: {outcome.cell.key}; log: {log_path(outcome.cell, study, root)}")
    print(
        f"{len(outcomes) - len(failed)} cells run, {len(failed)} failed; "
        f"summarise with `turnrl study summarise {study.name}`"
    )
    return 1 if failed else 0


def cmd_summarise(args: argparse.Namespace) -> int:
    from turnrl.study.catalogue import get_study
    from turnrl.study.summary import summarise

    study = get_study(args.name)
    result = summarise(study, repository_root(), f"turnrl study summarise {study.name}")
    print(result.text)
    print(f"summary: {result.path}")
    if result.figure:
        print(f"figure: {result.figure}")
    if result.doc_tables:
        print(f"{study.doc}: tables {', '.join(result.doc_tables)} rewritten")
    print(f"finished cells kept in {result.archive} (commit it)")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from turnrl.study.archive import archive_path, restore
    from turnrl.study.catalogue import get_study

    study = get_study(args.name)
    root = repository_root()
    restored = restore(study, root)
    print(
        f"{len(restored)} cells of {study.name} restored from {archive_path(study, root)} "
        "(cells with a run here are left alone); run the missing ones with "
        f"`turnrl study run {study.name}`"
    )
    return 0


def cmd_interval(args: argparse.Namespace) -> int:
    """The statistics of the tables on numbers given by hand (per-seed differences a doc
    prints, for instance): mean, ddof=1 sd, paired t-interval, t and sign-flip p, verdict."""
    from turnrl.study import statistics

    try:
        values = [float(v) for v in args.values]
    except ValueError as exc:
        raise UsageError(f"study interval: VALUES must be numbers ({exc})") from None
    if args.warm_starts:
        groups = [int(g) for g in args.warm_starts.split(",")]
        if len(groups) != len(values):
            raise UsageError("study interval: --warm-starts needs one index per value")
    else:
        groups = [0] * len(values)
    keyed = {(g, k): v for k, (g, v) in enumerate(zip(groups, values, strict=True))}
    test = statistics.paired_test(keyed)
    mean, sd = statistics.mean_sd(values)
    print(
        f"pairs {len(values)}  mean {mean:+.3f}  sd (ddof=1) {sd:.3f}  unit mean "
        f"{test.mean:+.3f}  95% t-CI [{test.low:+.3f}, {test.high:+.3f}]  "
        f"{statistics.verdict(test)}"
    )
    return 0


def cmd_power(args: argparse.Namespace) -> int:
    from turnrl.study.catalogue import get_study
    from turnrl.study.power import report

    study = get_study(args.name)
    pilot = get_study(args.pilot or study.pilot or study.name)
    print(report(study, pilot, repository_root(), args.effect))
    return 0


def jobs_option(text: str) -> int:
    """``--jobs``: a whole number >= 1 (0 processes at a time would never run a cell)."""
    try:
        jobs = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {jobs}")
    return jobs


def add_study_command(subparsers: Any) -> None:
    p = subparsers.add_parser("study", help="declared studies: list, run (resumably), summarise")
    sub = p.add_subparsers(dest="study_command", required=True)
    q = sub.add_parser("list", help="every study, its cells and how long it takes here")
    q.add_argument("--jobs", type=jobs_option, default=1, help="cores the time estimate assumes")
    q.set_defaults(handler=cmd_list)
    q = sub.add_parser("run", help="run the cells a study is missing (finished ones are kept)")
    q.add_argument("name")
    q.add_argument(
        "--jobs",
        type=jobs_option,
        default=os.cpu_count() or 1,
        help="processes at once (default: cores)",
    )
    q.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="FRAGMENT",
        help="only cells whose path contains it (repeatable, comma-separated: all must match; "
        "e.g. --only seed0 --only lr1e-3)",
    )
    q.set_defaults(handler=cmd_run)
    q = sub.add_parser(
        "interval", help="mean, sd, paired t-interval and tests of numbers given by hand"
    )
    q.add_argument("values", nargs="+", help="paired differences, one per seed")
    q.add_argument(
        "--warm-starts",
        help="comma-separated warm-start index of each value (the warm start is the unit)",
    )
    q.set_defaults(handler=cmd_interval)
    q = sub.add_parser(
        "power", help="outcome, minimum detectable effect and units needed, from a pilot"
    )
    q.add_argument("name")
    q.add_argument("--effect", type=float, help="a true difference: the units it needs")
    q.add_argument("--pilot", help="the study whose archived cells are the pilot")
    q.set_defaults(handler=cmd_power)
    q = sub.add_parser("summarise", help="tables, figure, provenance; rewrite the doc's tables")
    q.add_argument("name")
    q.set_defaults(handler=cmd_summarise)
    q = sub.add_parser(
        "restore", help="write the archived finished cells back where no run directory is"
    )
    q.add_argument("name")
    q.set_defaults(handler=cmd_restore)
