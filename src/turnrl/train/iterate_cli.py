"""``turnrl iterate``: the Iterative GRPO command (registered by ``turnrl.cli``).

Kept apart from :mod:`turnrl.train.iterate` so that building the CLI parser
does not import torch.
"""

from __future__ import annotations

import argparse
from typing import Any


def cmd_iterate(args: argparse.Namespace) -> int:
    from turnrl.report import write_report
    from turnrl.train.config import load_config
    from turnrl.train.iterate import IterativeGRPO
    from turnrl.train.iterate_config import IterateConfig

    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    config = load_config(IterateConfig, args.config, overrides)
    run_dir = IterativeGRPO(
        config, from_logs=args.from_logs, quiet=args.quiet, resume=args.resume
    ).run()
    report = write_report([run_dir], run_dir / "report.html", title=config.label or run_dir.name)
    print(f"final policy: {run_dir / 'final_policy'}")
    print(f"report: {report}")
    return 0


def add_iterate_command(subparsers: Any) -> None:
    """Add ``iterate`` to the ``turnrl`` subcommands."""
    p = subparsers.add_parser(
        "iterate",
        help="Iterative GRPO: deploy, fit a turn-level Q, improve against Q, repeat",
    )
    p.add_argument("--config", help="TOML file (defaults apply to anything it leaves out)")
    p.add_argument("overrides", nargs="*", metavar="SECTION.FIELD=VALUE", help="config overrides")
    p.add_argument("--run-dir", help="shortcut for run_dir=...")
    p.add_argument(
        "--from-logs",
        metavar="LOGS.jsonl",
        help="OpenAI chat-format conversations with an outcome each: the first iteration's "
        "batch (with env.name='' the run stops after improving on them)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue a killed run from its last finished iteration (checkpoints/)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-iteration lines")
    p.set_defaults(handler=cmd_iterate)
