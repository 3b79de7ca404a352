"""The rows layout padded against packed (and the tree layout beside them) on a real batch.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/packing.py --write
    ... --budgets 512,2048 --repeats 3 --warm-steps 60   # more arms, longer

One rollout batch of the calculator recipe (examples/calculator.toml, tiny model, warm
start shortened to ``--warm-steps``; benchmarks/update.py's helpers) is updated on from
the same weights with a fresh AdamW, ``--repeats`` times per arm, arms alternating:

* ``rows padded``: the layout before packing, one right-padded forward per mini-batch
  (forced through :mod:`turnrl.policy.packing`'s fallback for attention without a 4D
  mask);
* ``rows packed``: one packed forward per ``max_tokens_per_batch`` (each budget of
  ``--budgets``), its rows in bins up to the longest row (:mod:`turnrl.policy.packing`);
* ``tree``: the default layout at the same budgets.

Reported per arm: positions run (padded: rows x longest row per forward, padding
included), peak activation memory (bytes autograd keeps, ``ActivationMeter``), CPU
seconds of one update (median; one torch thread). That the arms compute the same loss
and gradients is tests/test_packing.py's job.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_file import RESULTS, write_section  # noqa: E402
from update import SCENARIOS, collect_batches, config_for, timed, warm_start  # noqa: E402

from turnrl.policy import packing  # noqa: E402
from turnrl.train.lifecycle import Lifecycle  # noqa: E402
from turnrl.train.online.trainer import OnlineTrainer  # noqa: E402
from turnrl.train.update.ppo import ppo_update  # noqa: E402

TITLE = "Update: rows padded against rows packed"


def arms(budgets: list[int]) -> list[tuple[str, str, int, bool]]:
    """``(name, layout, budget, padded)`` of every arm."""
    out = [("rows padded (before)", "rows", 10**9, True)]
    out += [(f"rows packed, {b:,}", "rows", b, False) for b in budgets]
    out += [(f"tree, {b:,}", "tree", b, False) for b in budgets]
    return out


def measure(args: argparse.Namespace, work: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    scenario = replace(SCENARIOS["calculator"], warm_steps=args.warm_steps)
    warm = warm_start(scenario, work)
    print("warm start done", file=sys.stderr, flush=True)
    (batch,) = collect_batches(scenario, work, warm, 1)
    print("batch collected", file=sys.stderr, flush=True)
    config = config_for(scenario, work / "update", [f"warm_start.init_from={warm}"])
    trainer = OnlineTrainer(config, quiet=True)
    Lifecycle(trainer).start()
    policy = trainer.policy
    start = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    plan = arms(args.budgets)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name, *_ in plan}
    masked = packing.model_attention
    for repeat in range(args.repeats):
        for name, layout, budget, padded in plan if repeat % 2 == 0 else plan[::-1]:
            policy.load_state_dict(start)
            optimizer = torch.optim.AdamW(policy.parameters(), lr=config.train.lr)
            settings = replace(config.train, update=layout, max_tokens_per_batch=budget)
            packing.model_attention = (lambda model: "padded") if padded else masked
            try:
                with timed() as seconds:
                    stats = ppo_update(
                        policy,
                        optimizer,
                        batch,
                        settings,
                        temperature=config.policy.temperature,
                        reference=trainer.reference,
                        seed=0,
                    )
            finally:
                packing.model_attention = masked
            samples[name].append({**seconds, **stats})
            print(f"{name}: {seconds['cpu']:.2f} CPU s", file=sys.stderr, flush=True)
    rows = []
    for name, *_ in plan:
        runs = samples[name]
        rows.append(
            {
                "arm": name,
                "computed": runs[0]["update_tokens_computed"],
                "activation_mib": runs[0]["update_activation_mib"],
                "cpu": statistics.median(r["cpu"] for r in runs),
            }
        )
    lengths = [len(c) + len(r) for c, r in zip(batch.contexts, batch.responses, strict=True)]
    shape = {
        "rows": len(lengths),
        "tokens": sum(lengths),
        "longest": max(lengths),
        "shortest": min(lengths),
        "minibatch_size": config.train.minibatch_size,
    }
    return rows, shape


def table(rows: list[dict[str, Any]], shape: dict[str, Any], args: argparse.Namespace) -> str:
    base = rows[0]
    lines = [
        f"- setup: one calculator batch ({shape['rows']} rows, {shape['tokens']:,} tokens, "
        f"rows of {shape['shortest']}..{shape['longest']} tokens, minibatch_size "
        f"{shape['minibatch_size']}), warm start of {args.warm_steps} SFT steps; one "
        f"ppo_update per arm, median of {args.repeats} CPU-second timings, one torch thread",
        "",
        "| arm (max_tokens_per_batch) | positions run | vs padded | activation MiB "
        "| update CPU s | vs padded |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['computed']:,.0f} | {r['computed'] / base['computed']:.2f} "
            f"| {r['activation_mib']:.2f} | {r['cpu']:.3f} | {r['cpu'] / base['cpu']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-steps", type=int, default=20)
    parser.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")],
                        default=[2048])  # fmt: skip
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="into benchmarks/RESULTS.md too")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as work:
        rows, shape = measure(args, Path(work))
    text = table(rows, shape, args)
    print(text)
    if args.write:
        command = " ".join(["OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python", *sys.argv])
        write_section(RESULTS, TITLE, text, command, date.today())


if __name__ == "__main__":
    main()
