"""The grouping experiment's learning runs: do the arms the gradient projection
separates move the turn-0 tool rate apart when they learn?

A thin wrapper of the ``grouping-learning`` study (declared in
``turnrl.study.catalogue``): ``examples/grouping/medium.toml`` at per-turn costs 0.4
(30 and 60 steps) and 0.2 (60 steps), arms ``grpo_mixed``, ``grpo`` and ``node``
(token-mean, all turns), 5 seeds, every run starting from one frozen warm start
(the same recipe and seed as ``gradient.py``'s), so seed ``k`` of every arm draws
the same tasks in the same order: the runs are paired. The measured behaviour is
``eval_tool_open_rate``: the share of evaluation episodes whose first response is a
tool call. The summary compares every arm with ``grpo_mixed`` pair by pair, with
bootstrap intervals (``turnrl.study.statistics``).

    python examples/grouping/run.py                        # = make study-grouping-learning
    python examples/grouping/run.py --only cost0.2-steps60 # one setting
    python examples/grouping/run.py --summarise

Runs go to ``runs/studies/grouping-learning/<setting>/<arm>/ws0-seed<k>``; rerunning
resumes (finished runs are kept, a killed one continues from its last checkpoint).
"""

from __future__ import annotations

import argparse
import os
import sys

from turnrl.cli import main as turnrl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", action="append", default=[], help="e.g. cost0.4-steps60")
    parser.add_argument("--summarise", action="store_true")
    args = parser.parse_args()
    if not args.summarise:
        only = [f"--only={part}" for part in args.only]
        code = turnrl(["study", "run", "grouping-learning", f"--jobs={args.jobs}", *only])
        if code:
            sys.exit(code)
    sys.exit(turnrl(["study", "summarise", "grouping-learning"]))


if __name__ == "__main__":
    main()
