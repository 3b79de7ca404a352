"""The README's demo table: `make demo`'s recipe over six seeds.

A thin wrapper of the ``demo-seeds`` study (declared in ``turnrl.study.catalogue``):
each seed N is ``turnrl train --config examples/calculator.toml train.seed=N`` in
``runs/studies/demo-seeds/calculator/seedN``; finished seeds are kept, a killed one
resumes. The same as ``make study-demo-seeds``:

    python examples/demo_seeds.py              # run what is missing, then summarise
    python examples/demo_seeds.py --summarise  # tables from finished runs (README's markers)
    python examples/demo_seeds.py --only seed0 --jobs 1
"""

from __future__ import annotations

import argparse
import os
import sys

from turnrl.cli import main as turnrl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--summarise", action="store_true", help="only rebuild the tables")
    args = parser.parse_args()
    if not args.summarise:
        only = [f"--only={part}" for part in args.only]
        code = turnrl(["study", "run", "demo-seeds", f"--jobs={args.jobs}", *only])
        if code:
            sys.exit(code)
    sys.exit(turnrl(["study", "summarise", "demo-seeds"]))


if __name__ == "__main__":
    main()
