"""The ``turnrl`` command line.

Every subcommand turns bad input into one clear line on stderr naming the file,
line and field, and exit code 2; nothing is written in that case (outputs are
written atomically, after all input has been validated).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from turnrl.errors import TurnrlError, UsageError
from turnrl.train.stop_signals import RunInterrupted

EXIT_BAD_INPUT = 2


def parse_param(text: str) -> tuple[str, Any]:
    """``k=v`` with ``v`` read as JSON when it parses (numbers, true/false), else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise UsageError(f"--param expects k=v, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def cmd_audit(args: argparse.Namespace) -> int:
    from turnrl.credit.audit import audit
    from turnrl.table import TurnTable

    report = audit(TurnTable.from_jsonl(args.log), estimators=args.estimator or None)
    print(report.to_json() if args.json else report.to_text())
    return 0


def cmd_credit(args: argparse.Namespace) -> int:
    import numpy as np

    from turnrl.credit import compute_credit
    from turnrl.io import check_output_path
    from turnrl.record_columns import read_columns
    from turnrl.records import copy_with_columns
    from turnrl.table import TurnTable, default_node_id

    params = dict(parse_param(p) for p in args.param)
    check_output_path(args.output, option="-o/--output")
    read = read_columns(args.input, default_node_id)
    table = TurnTable.from_columns(read, source=args.input)
    credit = compute_credit(table, args.estimator, **params)
    columns = {"advantage": credit.advantages}
    if credit.clip_factor is not None:
        columns["clip_factor"] = credit.clip_factor
    rewrite = np.frombuffer(read.computed, dtype=np.int8).astype(bool)
    del read
    count = copy_with_columns(args.input, args.output, columns, rewrite=rewrite)
    print(f"wrote {count} records with '{args.estimator}' advantages to {args.output}")
    return 0


def cmd_estimators(args: argparse.Namespace) -> int:
    from turnrl.credit import get_estimator, list_estimators

    for name in list_estimators():
        entry = get_estimator(name)
        params = ", ".join(f"{k}={v!r}" for k, v in entry.params().items())
        print(f"{name:12s} [{entry.group_key}] {entry.summary}  ({params})")
    return 0


def _load_run_config(cls: type, args: argparse.Namespace) -> Any:
    """The config of ``turnrl train``/``iterate``: TOML file, overrides and ``--run-dir``,
    validated (every problem located in the file or the override) before any work; a
    ``vllm-server`` backend's server must answer then too."""
    from turnrl.train.config import load_config
    from turnrl.train.validate import validate

    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    config = load_config(cls, args.config, overrides)
    validate(config, toml_path=args.config, overrides=overrides)
    if config.policy.backend == "vllm-server":  # before the warm start, not after it
        from turnrl.policy.vllm_server import check_server_reachable

        check_server_reachable(config.policy.server_url)
    return config


def cmd_train(args: argparse.Namespace) -> int:
    from turnrl.train.config import RunConfig
    from turnrl.train.distributed import world_from_env
    from turnrl.train.lifecycle import stopping
    from turnrl.train.run import RunDirectory

    config = _load_run_config(RunConfig, args)
    world = world_from_env()
    if world.split:  # one rank of several under torchrun (docs/distributed.md)
        from turnrl.train.online.rank_entry import train_distributed

        return train_distributed(
            config,
            world,
            resume=args.resume,
            overwrite=args.overwrite,
            quiet=args.quiet,
            report=lambda run_dir: _train_report(config, run_dir),
            pool_factory=_ray_pool if config.rollout.workers > 0 else None,
        )
    # The guard, before Ray workers or models are started (the trainer checks again); it
    # holds the run directory's lock until the command ends.
    guard = RunDirectory.open(config, resume=args.resume, overwrite=args.overwrite)
    try:
        with stopping(config.run_dir):
            _train(config, args)
    finally:
        guard.close()
    return 0


def _ray_pool(config: Any) -> Any:
    """Rank 0's Ray rollout pool under torchrun (``rollout.workers``)."""
    from turnrl.integrations.ray_workers import pool_for_config

    return pool_for_config(config)


def _train(config: Any, args: argparse.Namespace) -> Any:
    """Build ``turnrl train``'s trainer for ``config`` and run it through its lifecycle
    (which writes the report at the end); the run directory."""
    from turnrl.train.lifecycle import Lifecycle

    options = {"resume": args.resume, "overwrite": args.overwrite, "quiet": args.quiet}
    report = partial(_train_report, config)
    if config.agent.enabled:
        if config.train.max_staleness >= 1:  # partial rollouts (docs/async.md)
            from turnrl.train.agent.asynchronous import AsyncAgentTrainer as Trainer
        else:
            from turnrl.train.agent.loop import AgentTrainer as Trainer

        return Lifecycle(Trainer(config, **options), report=report).run()
    if config.rollout.workers > 0:
        from turnrl.integrations.ray_workers import train_with_workers

        return train_with_workers(config, report=report, **options)
    from turnrl.train.online.asynchronous import online_trainer

    return Lifecycle(online_trainer(config, **options), report=report).run()


def _train_report(config: Any, run_dir: Any) -> None:
    """Write the run's HTML report and print its held-out table."""
    from rich.console import Console

    from turnrl.report import heldout_console_table

    line = _report_line(config, run_dir)
    console = Console()
    console.print(heldout_console_table(run_dir))
    console.print(line, soft_wrap=True, markup=False, highlight=False)


def _report_line(config: Any, run_dir: Any) -> str:
    """Write the run's ``report.html`` unless ``logging.report`` is false; the line that
    says where it is (or how to write it later)."""
    if not config.logging.report:
        return f"report: not written (logging.report = false; `turnrl report {run_dir}` writes it)"
    from turnrl.report import write_report

    report = write_report([run_dir], run_dir / "report.html", title=config.label or run_dir.name)
    return f"report: {report}"


def cmd_iterate(args: argparse.Namespace) -> int:
    from turnrl.train.distributed import run_as_rank, world_from_env
    from turnrl.train.iterate.config import IterateConfig
    from turnrl.train.iterate.loop import IterativeGRPO
    from turnrl.train.lifecycle import Lifecycle, stopping

    config = _load_run_config(IterateConfig, args)
    world = world_from_env()
    if world.split:  # one rank of several under torchrun (docs/distributed.md)
        from turnrl.train.iterate.distributed import iterate_rank

        def ranks() -> None:
            trainer = iterate_rank(
                config,
                world,
                from_logs=args.from_logs,
                quiet=args.quiet or not world.main,
                resume=args.resume,
                overwrite=args.overwrite,
            )
            run_dir = trainer.run()
            if world.main:
                _iterate_report(config, run_dir)

        return run_as_rank(world, config.policy.device, ranks, command="turnrl iterate")
    with stopping(config.run_dir):
        trainer = IterativeGRPO(
            config,
            from_logs=args.from_logs,
            quiet=args.quiet,
            resume=args.resume,
            overwrite=args.overwrite,
        )
        Lifecycle(trainer, report=partial(_iterate_report, config)).run()
    return 0


def _iterate_report(config: Any, run_dir: Any) -> None:
    """Write ``turnrl iterate``'s HTML report; print where it and the final policy are."""
    line = _report_line(config, run_dir)
    print(f"final policy: {run_dir / 'policy'}")
    print(line)


def _add_run_options(p: argparse.ArgumentParser, resume_help: str) -> None:
    """Options shared by the commands that train in a run directory."""
    p.add_argument("--config", help="TOML file (defaults apply to anything it leaves out)")
    p.add_argument("overrides", nargs="*", metavar="SECTION.FIELD=VALUE", help="config overrides")
    p.add_argument("--run-dir", help="shortcut for run_dir=...")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help=resume_help)
    group.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run in --run-dir (deletes its files); without --resume or "
        "--overwrite a directory that holds a run is refused",
    )


def cmd_report(args: argparse.Namespace) -> int:
    from turnrl.io import check_output_path
    from turnrl.report import write_report

    check_output_path(args.output, option="-o/--output")
    out = write_report(args.run_dirs, args.output, title=args.title, smoothing=args.smoothing)
    print(f"report: {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnrl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("audit", help="how a log's groupings mix decision points")
    p.add_argument("log", help="turn-record JSONL file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--estimator", action="append", help="limit to these estimators (repeatable)")
    p.set_defaults(handler=cmd_audit)

    p = sub.add_parser("credit", help="add per-turn advantages to a log")
    p.add_argument("input", help="turn-record JSONL file")
    p.add_argument("-o", "--output", required=True, help="output JSONL (written atomically)")
    p.add_argument("--estimator", required=True, help="estimator name (see `turnrl estimators`)")
    p.add_argument("--param", action="append", default=[], metavar="K=V", help="estimator option")
    p.set_defaults(handler=cmd_credit)

    p = sub.add_parser("estimators", help="list estimators and their options")
    p.set_defaults(handler=cmd_estimators)

    p = sub.add_parser("train", help="warm start + multi-turn RL from a TOML config")
    _add_run_options(
        p,
        "continue the run in --run-dir from its last checkpoint (only steps, periods and "
        "a few other fields may change; see docs/config-errors.md)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(handler=cmd_train)

    p = sub.add_parser(
        "iterate",
        help="Iterative GRPO: deploy, fit a turn-level Q, improve against Q, repeat",
    )
    _add_run_options(
        p,
        "continue a killed run from its last finished iteration (only iterations and a "
        "few other fields may change)",
    )
    p.add_argument(
        "--from-logs",
        metavar="LOGS.jsonl",
        help="OpenAI chat-format conversations with an outcome each: the first iteration's "
        "batch (with env.name='' the run stops after improving on them)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-iteration lines")
    p.set_defaults(handler=cmd_iterate)

    p = sub.add_parser("report", help="HTML report over one or more run directories")
    p.add_argument("run_dirs", nargs="+", help="run directories (runs sharing a label = seeds)")
    p.add_argument("-o", "--output", default="report.html", help="output HTML file")
    p.add_argument("--title", default="turnrl report")
    p.add_argument(
        "--smoothing",
        type=int,
        default=None,
        metavar="STEPS",
        help="moving-average window of per-step metrics (default: a twelfth of the run; 1: none)",
    )
    p.set_defaults(handler=cmd_report)

    for register in _EXTRA_COMMANDS:
        register(sub)
    return parser


_EXTRA_COMMANDS: list[Callable[[Any], None]] = []
"""Hooks that add subcommands living in higher layers (train, report, ...)."""


def _add_serve(subparsers: Any) -> None:
    from turnrl.serve.cli import add_serve_command

    add_serve_command(subparsers)


_EXTRA_COMMANDS.append(_add_serve)


def _add_study(subparsers: Any) -> None:
    from turnrl.study.cli import add_study_command

    add_study_command(subparsers)


_EXTRA_COMMANDS.append(_add_study)


def _add_export(subparsers: Any) -> None:
    from turnrl.train.export_cli import add_export_command

    add_export_command(subparsers)


_EXTRA_COMMANDS.append(_add_export)


def _add_eval(subparsers: Any) -> None:
    from turnrl.report.eval_cli import add_eval_command

    add_eval_command(subparsers)


_EXTRA_COMMANDS.append(_add_eval)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except TurnrlError as exc:  # bad input; anything else is a bug: keep its traceback
        print(f"turnrl {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RunInterrupted as exc:  # SIGTERM/SIGINT: one line, exit code 128 + signal
        notes = "; ".join(getattr(exc, "__notes__", ()))
        print(f"turnrl {args.command}: {exc}{'; ' + notes if notes else ''}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
