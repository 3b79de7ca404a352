"""``turnrl export RUN_DIR [--step N] -o DIR [--adapters] [--overwrite]``: a run's policy
as a Hugging Face model directory (:mod:`turnrl.train.export`, docs/export.md)."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_export(args: argparse.Namespace) -> int:
    """Export the checkpoint and print where it went."""
    from pathlib import Path

    from turnrl.train.export import export_run
    from turnrl.train.run import WARM_START_DIR

    out, step = export_run(
        args.run_dir,
        args.output,
        warm_start=Path(args.run_dir) / WARM_START_DIR,
        step=args.step,
        adapters=args.adapters,
        overwrite=args.overwrite,
    )
    kind = "LoRA adapters" if args.adapters else "weights"
    print(f"exported {args.run_dir} checkpoint step {step} ({kind}) to {out}")
    return 0


def add_export_command(subparsers: Any) -> None:
    """Register ``turnrl export`` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "export",
        help="write a run's policy as a Hugging Face model directory (transformers, vLLM)",
        description=(
            "Write the policy of a run's checkpoint as a Hugging Face model directory "
            "(safetensors weights with LoRA merged, config, tokenizer, chat template) that "
            "transformers and vLLM load as it is. See docs/export.md."
        ),
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (turnrl train/iterate)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="directory to write")
    p.add_argument(
        "--step",
        type=int,
        default=None,
        metavar="N",
        help="checkpoint step to export (default: the last)",
    )
    p.add_argument(
        "--adapters",
        action="store_true",
        help="write the LoRA adapters (peft) and the base model's path instead of merged weights",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty DIR")
    p.set_defaults(handler=cmd_export)
