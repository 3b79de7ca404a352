"""The README's demo table: `make demo`'s recipe over several seeds.

    python examples/demo_seeds.py --out runs/demo-seeds --seeds 6   # train, then summarise
    python examples/demo_seeds.py --out runs/demo-seeds --summarise # table from finished runs

Each seed trains ``turnrl train --config examples/calculator.toml train.seed=N`` into
``OUT/seedN`` (a finished run is skipped); the table (held-out success before -> after,
by kind, tool rate, and the lowest success after the first evaluation) is printed and
written to ``OUT/summary.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = (
    ("success", "eval_success"),
    ("easy", "eval_success_easy"),
    ("hard", "eval_success_hard"),
    ("tool rate", "eval_tool_rate"),
)


def train(out: Path, seed: int) -> None:
    run_dir = out / f"seed{seed}"
    if (run_dir / "report.html").exists():
        return
    subprocess.run(
        [
            sys.executable,
            "-m",
            "turnrl",
            "train",
            "--config",
            str(ROOT / "examples/calculator.toml"),
            "--overwrite",
            f"run_dir={run_dir}",
            f"train.seed={seed}",
        ],
        check=True,
    )


def summary(out: Path) -> str:
    """The markdown table of every ``OUT/seedN`` run."""
    header = "| `train.seed` | " + " | ".join(f"{name} before → after" for name, _ in COLUMNS)
    lines = [header + " | lowest success after step 0 |", "|---:" * (len(COLUMNS) + 2) + "|"]
    for run_dir in sorted(out.glob("seed*"), key=lambda p: int(p.name[4:])):
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in rows if "eval_success" in r]
        first, last = evals[0], evals[-1]
        cells = [f"{first[key]:.2f} → {last[key]:.2f}" for _, key in COLUMNS]
        lowest = min(r["eval_success"] for r in evals[1:])
        lines.append(f"| {run_dir.name[4:]} | " + " | ".join(cells) + f" | {lowest:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "runs" / "demo-seeds"))
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--summarise", action="store_true", help="only rebuild the table")
    args = parser.parse_args()
    out = Path(args.out)
    if not args.summarise:
        for seed in range(args.seeds):
            train(out, seed)
    table = summary(out)
    (out / "summary.md").write_text(table)
    print(table, end="")


if __name__ == "__main__":
    main()
