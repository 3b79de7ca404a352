"""Peak resident memory of ONE update on long multi-turn contexts, per memory option.

    .venv/bin/python benchmarks/memory.py --quick           # 2k and 8k tokens
    .venv/bin/python benchmarks/memory.py                   # 2k, 8k, 16k, 32k + 20 GiB search
    .venv/bin/python benchmarks/memory.py --quick --write   # and the section in RESULTS.md
    .venv/bin/python benchmarks/memory.py --results runs/bench-memory.jsonl
        # each finished measurement is appended there; a rerun with the same file
        # reuses them and runs only the missing ones (resume after a crash)

The learner is SmolLM2-135M-Instruct with the ``calculator_smollm2`` recipe's LoRA
(rank 16 on every projection; ``turnrl.policy.pretrained.smollm2_path()``, the ``smol``
extras). The batch is one synthetic 4-turn trajectory whose last turn ends at
``TOKENS`` positions: turn ``k`` (1..4) is a row whose context is everything before
it (the previous turns' contexts, responses and an observation) and whose response
is ``RESPONSE`` tokens; random token ids, fixed per size. One ``ppo_update``
(one optimiser step over the four rows, AdamW, the recipe's PPO settings) is the
measurement, in a fresh child process (this script with ``--child``): its peak
resident memory is the child's ``ru_maxrss`` as ``os.wait4`` reports it to this
process (``resource.getrusage``'s RUSAGE_CHILDREN would give the largest child so
far, not this one), beside the child's resident memory just before the update (the
loaded model and batch). Times are the update's wall and CPU seconds divided by
the trajectory's tokens (one torch thread).

Arms (``--arms``), ``train.*`` fields over the recipe's: ``none``; each option alone
(``checkpointing``: ``gradient_checkpointing``; ``chunks``: ``logprob_chunk_tokens =
1024``; ``bf16-mixed``: ``precision``; ``packing``: ``update = "rows"`` with
``max_tokens_per_batch = 2048``, the rows packed without padding, a longer row a
forward of its own); ``all`` of them together; ``all-fp32``, all but
``bf16-mixed`` (a CPU without bfloat16 instructions runs bfloat16 matrix products
several times slower than float32); and ``all-tree``, all but ``packing``: the tree
layout (one forward over the trajectory's shared prefixes) with checkpointing,
chunks and bf16-mixed, the candidate for one long trajectory. Arms alternate within each round
(rotated each round), sizes in turn, so that a slower period of a shared machine does
not fall on one arm.

SmolLM2 was trained on 8192 positions; 16k and 32k lift the model's position limit
(RoPE runs on): the log-probs mean nothing there, the memory and time are real.
The full run then searches the longest trajectory the ``all`` arm trains in 20 GiB
(doubling, then bisecting at 1k tokens); ``--quick`` reports a linear extrapolation
from its two sizes instead, labelled as such.

The ``trl`` arm is TRL's ``GRPOTrainer`` (``benchmarks/trl_memory.py``, run by the TRL
venv's Python, ``--trl-python``, default ``.venv-agl/bin/python``) on the same four rows,
model and LoRA, with TRL's defaults (gradient checkpointing and bf16 autocast on): one
update as its ``train`` runs it once the completions exist. It is in the default arms
where that venv exists (``make setup-integrations``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_file import RESULTS, write_section  # noqa: E402

RECIPE = ROOT / "examples" / "calculator_smollm2.toml"
SIZES = (2048, 8192, 16384, 32768)
QUICK_SIZES = (2048, 8192)
TURNS = 4
RESPONSE = 128
"""Response tokens per turn (the rest of each turn's share is its observation)."""
CHUNK = 1024
BUDGET_GIB = 20.0
TITLE = "Memory of one update on long multi-turn contexts (SmolLM2-135M LoRA)"

OPTIONS: dict[str, dict[str, Any]] = {
    "checkpointing": {"gradient_checkpointing": True},
    "chunks": {"logprob_chunk_tokens": CHUNK},
    "bf16-mixed": {"precision": "bf16-mixed"},
}


PACKING = {"update": "rows", "max_tokens_per_batch": 2048}
"""The ``packing`` arm: the rows layout packed without padding, at most 2048 positions a
forward (a longer row is a forward of its own)."""


def packing_available() -> bool:
    """Whether this checkout packs the rows layout without padding (another change of
    issue #39, ``turnrl.policy.packing``)."""
    return (ROOT / "src" / "turnrl" / "policy" / "packing.py").exists()


ALL_BUT: dict[str, str | None] = {"all": None, "all-fp32": "bf16-mixed", "all-tree": "packing"}
"""The combined arms: every option but the one named (None: every option)."""


def arm_fields(arm: str, tokens: int) -> dict[str, Any]:
    """The ``PPOConfig`` fields of ``arm`` at ``tokens`` positions (over the defaults)."""
    options = dict(OPTIONS)
    if packing_available():
        options["packing"] = PACKING
    if arm in ("none", TRL_ARM):  # trl: benchmarks/trl_memory.py, TRL's own settings
        fields: dict[str, Any] = {}
    elif arm in ALL_BUT:
        chosen = [o for name, o in options.items() if name != ALL_BUT[arm]]
        fields = {k: v for option in chosen for k, v in option.items()}
    elif arm in options:
        fields = dict(options[arm])
    else:
        raise SystemExit(
            f"--arms: unknown arm {arm!r}; known: none, {', '.join([*options, *ALL_BUT])}"
        )
    # else one forward for the whole trajectory (its rows share one chain of prefixes)
    return {"max_tokens_per_batch": max(tokens, 2048), **fields}


TRL_ARM = "trl"
TRL_PYTHON = ROOT / ".venv-agl" / "bin" / "python"
"""The TRL venv's interpreter (``make setup-integrations``), the ``trl`` arm's default."""


def default_arms() -> list[str]:
    packing = ["packing", "all-tree"] if packing_available() else []
    arms = ["none", *OPTIONS, *packing, "all-fp32", "all"]
    return [*arms, TRL_ARM] if TRL_PYTHON.exists() else arms


def trajectory(tokens: int, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """``(contexts, responses)`` of a ``TURNS``-turn episode ending at ``tokens``
    positions: each turn adds ``tokens / TURNS`` positions, its last ``RESPONSE`` the
    response, the ones before it the prompt or the previous turn's observation."""
    import numpy as np

    ids = np.random.default_rng(tokens).integers(10, vocab, size=tokens).tolist()
    share = tokens // TURNS
    contexts, responses = [], []
    for turn in range(1, TURNS + 1):
        end = tokens if turn == TURNS else turn * share
        contexts.append(ids[: end - RESPONSE])
        responses.append(ids[end - RESPONSE : end])
    return contexts, responses


def resident_mib() -> float:
    """This process's resident memory now (``VmRSS``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ------------------------------------------------------------------------------ child


def child(arm: str, tokens: int) -> dict[str, Any]:
    """One update of ``arm`` on the ``tokens``-position trajectory, in this process."""
    import torch

    from turnrl.policy.factory import build_policy
    from turnrl.train.config import PPOConfig, RunConfig, load_config
    from turnrl.train.update.ppo import UpdateBatch, ppo_update

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = load_config(RunConfig, RECIPE, ["run_dir=/nonexistent", "train.threads=1"])
    policy = build_policy(config.policy, seed=0)
    policy.max_context = None  # 16k and 32k: past SmolLM2's 8192 trained positions
    policy.model.config.max_position_embeddings = max(tokens, 8192)
    contexts, responses = trajectory(tokens, policy.model.config.vocab_size)
    mask = torch.ones(TURNS, RESPONSE)
    batch = UpdateBatch(
        contexts=contexts,
        responses=responses,
        old_logp_B_T=torch.full((TURNS, RESPONSE), -3.0),
        mask_B_T=mask,
        adv_B=torch.tensor([1.0, -1.0, 0.5, -0.5]),
        clip_factor_B=None,
        weight_B_T=mask / mask.sum(),
        tree_B=torch.zeros(TURNS, dtype=torch.long),
    )
    recipe = {f.name: getattr(config.train, f.name) for f in dataclasses.fields(PPOConfig)}
    one_step = {"epochs": 1, "minibatch_size": TURNS, "log_mismatch": False, "tis_cap": 0.0}
    update = PPOConfig(**{**recipe, **one_step, **arm_fields(arm, tokens)})
    optimizer = torch.optim.AdamW(policy.parameters(), lr=update.lr)
    before = resident_mib()
    cpu, wall = time.process_time(), time.perf_counter()
    stats = ppo_update(policy, optimizer, batch, update, temperature=1.0, reference=None, seed=0)
    return {
        "arm": arm,
        "tokens": tokens,
        "before_mib": before,
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
        "tokens_computed": stats["update_tokens_computed"],
        "activation_mib": stats["update_activation_mib"],
        "loss": stats["loss"],
        **{k: v for k, v in stats.items() if k.startswith("cuda")},  # a GPU's own peaks
    }


def child_command(arm: str, tokens: int, out: Path, trl_python: Path) -> list[str]:
    """The child process of one measurement: :func:`child`, or for the ``trl`` arm
    ``benchmarks/trl_memory.py`` in the TRL venv (SmolLM2's directory looked up here)."""
    if arm != TRL_ARM:
        return [sys.executable, __file__, "--child", arm, str(tokens), "--out", str(out)]
    if not trl_python.exists():
        raise SystemExit(f"--arms trl: no TRL venv at {trl_python} (make setup-integrations)")
    from turnrl.policy.pretrained import smollm2_path

    script = Path(__file__).with_name("trl_memory.py")
    model = str(smollm2_path())
    return [
        str(trl_python),
        str(script),
        "--model",
        model,
        "--tokens",
        str(tokens),
        "--out",
        str(out),
    ]


def measure(
    arm: str, tokens: int, timeout_s: float, limit_gib: float = 0.0, trl_python: Path = TRL_PYTHON
) -> dict[str, Any]:
    """Run :func:`child` (or TRL's update) in a fresh process; its peak resident memory
    from ``wait4``. ``limit_gib > 0`` caps the child's address space (``RLIMIT_AS``), so
    that an arm that would need more fails alone instead of pushing a shared machine into
    swap or its out-of-memory killer."""
    out = Path(f"/tmp/turnrl-bench-memory-{os.getpid()}-{arm}-{tokens}.json")

    def cap() -> None:
        if limit_gib > 0:
            size = int(limit_gib * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (size, size))

    process = subprocess.Popen(
        child_command(arm, tokens, out, trl_python),
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=cap,
    )
    started = time.monotonic()
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - started > timeout_s:
            process.kill()
            pid, status, usage = os.wait4(process.pid, 0)
            return {"arm": arm, "tokens": tokens, "failed": f"over {timeout_s:.0f} s"}
        time.sleep(0.2)
    peak = usage.ru_maxrss / 1024  # Linux: KiB
    code = os.waitstatus_to_exitcode(status)
    process.returncode = code
    if code != 0 or not out.exists():
        why = "killed (out of memory?)" if code < 0 else f"exit {code}"
        if limit_gib > 0 and code != 0:
            why += f" under a {limit_gib:g} GiB address-space cap"
        return {"arm": arm, "tokens": tokens, "failed": why, "peak_mib": peak}
    result = json.loads(out.read_text())
    out.unlink()
    return {**result, "peak_mib": peak}


# ----------------------------------------------------------------------------- parent


def load_results(path: Path | None) -> dict[str, dict[str, Any]]:
    if path is None or not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["key"]: row for row in rows}


def run_rounds(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every arm at every size, ``--rounds`` times, arms alternating (rotated per round)."""
    saved = load_results(args.results)
    results = []
    for round_ in range(args.rounds):
        for tokens in args.sizes:
            shift = round_ % len(args.arms)
            for arm in args.arms[shift:] + args.arms[:shift]:
                key = f"{round_}:{arm}:{tokens}"
                if key in saved:
                    results.append(saved[key])
                    continue
                if args.report:
                    continue  # only what --results holds
                row = {
                    "key": key,
                    "round": round_,
                    **measure(arm, tokens, args.timeout, args.max_memory_gib, args.trl_python),
                }
                print(json.dumps(row), flush=True)
                if args.results is not None:
                    with args.results.open("a") as handle:
                        handle.write(json.dumps(row) + "\n")
                results.append(row)
    return results


def summary(results: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Median over rounds of each (arm, size); a failure in any round is reported."""
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in results:
        cells.setdefault((row["arm"], row["tokens"]), []).append(row)
    out = {}
    for key, rows in cells.items():
        failed = [r["failed"] for r in rows if "failed" in r]
        if failed:
            out[key] = {"failed": failed[0], "n": len(rows)}
            continue
        out[key] = {
            "n": len(rows),
            **{
                k: statistics.median(r[k] for r in rows)
                for k in ("peak_mib", "before_mib", "wall_s", "cpu_s", "activation_mib")
                if all(k in r for r in rows)  # the trl arm has no activation meter
            },
        }
    return out


def extrapolated_tokens(cells: dict[tuple[str, int], dict[str, Any]], arm: str) -> str:
    """Where a line through the arm's two largest measured sizes reaches the budget."""
    points = sorted(
        (tokens, cell["peak_mib"])
        for (name, tokens), cell in cells.items()
        if name == arm and "failed" not in cell
    )
    if len(points) < 2:
        return "n/a"
    (x0, y0), (x1, y1) = points[-2], points[-1]
    slope = (y1 - y0) / (x1 - x0)
    if slope <= 0:
        return "n/a"
    return f"~{int(x1 + (BUDGET_GIB * 1024 - y1) / slope):,} (extrapolated linearly, not run)"


def search_budget(arm: str, start: int, timeout_s: float) -> dict[str, Any]:
    """The longest trajectory (1k steps) whose update stays under ``BUDGET_GIB``:
    doubling from ``start``, then bisecting."""
    budget = BUDGET_GIB * 1024
    fits, over = 0, None
    tokens = start
    tried = []

    def trains(tokens: int) -> bool:
        """Measure one update at ``tokens``; whether it ran within the budget."""
        row = measure(arm, tokens, timeout_s)
        tried.append(row)
        print(json.dumps(row), flush=True)
        return "failed" not in row and row["peak_mib"] <= budget

    while over is None:
        if trains(tokens):
            fits, tokens = tokens, tokens * 2
        else:
            over = tokens
    while over - fits > 1024:
        tokens = (fits + over) // 2 // 1024 * 1024
        if trains(tokens):
            fits = tokens
        else:
            over = tokens
    return {"arm": arm, "fits": fits, "over": over, "tried": tried}


def table(args: argparse.Namespace, cells: dict[tuple[str, int], dict[str, Any]]) -> str:
    head = "| arm | " + " | ".join(f"{t // 1024}k tokens" for t in args.sizes) + " |"
    lines = [head, "|---" * (len(args.sizes) + 1) + "|"]
    for arm in args.arms:
        row = [f"`{arm}`"]
        for tokens in args.sizes:
            cell = cells.get((arm, tokens))
            if cell is None:
                row.append("not run")
            elif "failed" in cell:
                row.append(f"failed: {cell['failed']}")
            else:
                none = cells.get(("none", tokens), {})
                ratio = (
                    f" ({cell['peak_mib'] / none['peak_mib']:.2f}x none)"
                    if arm != "none" and "peak_mib" in none
                    else ""
                )
                row.append(
                    f"{cell['peak_mib'] / 1024:.2f} GiB{ratio}; "
                    f"+{(cell['peak_mib'] - cell['before_mib']) / 1024:.2f} over loaded; "
                    f"{1000 * cell['wall_s'] / tokens:.2f} ms/token "
                    f"({1000 * cell['cpu_s'] / tokens:.2f} CPU)"
                )
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def report(args: argparse.Namespace, results: list[dict[str, Any]], budget: Any) -> str:
    cells = summary(results)
    rounds = {c["n"] for c in cells.values()}
    text = [
        f"One `ppo_update` of a {TURNS}-turn trajectory ({RESPONSE}-token responses) on "
        f"SmolLM2-135M-Instruct with the recipe's LoRA, CPU, one torch thread. Each cell: "
        f"peak resident memory of the child process (ru_maxrss via wait4), how much of it "
        f"the update added over the loaded model and batch, wall (CPU) milliseconds per "
        f"trajectory token; median of {', '.join(map(str, sorted(rounds)))} round(s), arms "
        f"alternating. `chunks` = `logprob_chunk_tokens = {CHUNK}`; `packing` = rows layout "
        f"packed, 2048 positions a forward; `all` = every option; `all-fp32` = all but "
        f"bf16-mixed; `all-tree` = all but packing (the tree layout); `trl` = TRL's "
        f"GRPOTrainer on the same rows, model and LoRA with its "
        f"defaults (gradient checkpointing, bf16 autocast; the rows left-padded to the "
        f"longest), its ms/token per trajectory token like the others.",
        "",
        table(args, cells),
        "",
    ]
    if budget is not None:
        text.append(
            f"Longest trajectory the `{budget['arm']}` arm trains under {BUDGET_GIB:.0f} GiB: "
            f"{budget['fits']:,} tokens (next tried: {budget['over']:,})."
        )
    else:
        for arm in ("none", "all"):
            text.append(
                f"Longest trajectory under {BUDGET_GIB:.0f} GiB, `{arm}`: "
                f"{extrapolated_tokens(cells, arm)}."
            )
    not_run = sorted(set(SIZES) - set(args.sizes))
    if not_run:
        text.append(f"Not run here: {', '.join(f'{t // 1024}k' for t in not_run)} tokens.")
    if not packing_available():
        text.append("`packing`: this checkout has no padding-free rows layout.")
    return "\n".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2k and 8k tokens, one round")
    parser.add_argument("--sizes", default="", help="comma-separated token counts")
    parser.add_argument("--arms", default="", help="comma-separated arms (default: all)")
    parser.add_argument("--rounds", type=int, default=0, help="default 2 (--quick: 1)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per child")
    parser.add_argument(
        "--max-memory-gib", type=float, default=0.0, help="cap each child (RLIMIT_AS); 0: none"
    )
    parser.add_argument("--results", type=Path, default=None, help="append/resume JSONL")
    parser.add_argument("--no-search", action="store_true", help="skip the 20 GiB search")
    parser.add_argument("--write", action="store_true", help="the section into RESULTS.md")
    parser.add_argument(
        "--report", action="store_true", help="measure nothing: report what --results holds"
    )
    parser.add_argument("--command", default="", help="--write: the command(s) to name")
    parser.add_argument(
        "--trl-python", type=Path, default=TRL_PYTHON, help="the trl arm's interpreter"
    )
    parser.add_argument("--out", type=Path, default=None, help="--child: its JSON file")
    parser.add_argument("--child", nargs=2, metavar=("ARM", "TOKENS"), default=None)
    args = parser.parse_args()
    if args.child is not None:
        result = child(args.child[0], int(args.child[1]))
        args.out.write_text(json.dumps(result))
        return
    args.sizes = (
        [int(s) for s in args.sizes.split(",")]
        if args.sizes
        else list(QUICK_SIZES if args.quick else SIZES)
    )
    args.arms = args.arms.split(",") if args.arms else default_arms()
    for arm in args.arms:
        arm_fields(arm, 2048)  # unknown arms fail before any work
    args.rounds = args.rounds or (1 if args.quick else 2)
    results = run_rounds(args)
    budget = None
    if not args.quick and not args.no_search and not args.report:
        budget = search_budget("all", max(args.sizes), args.timeout)
    text = report(args, results, budget)
    table_text = text.split("\n\n")[1]  # the table (report's second paragraph)
    print(text)
    if args.write:
        command = args.command or "OMP_NUM_THREADS=1 .venv/bin/python " + " ".join(
            ["benchmarks/memory.py", *sys.argv[1:]]
        ).replace(" --write", "")
        write_section(RESULTS, TITLE, text, command, date.today())
        from turnrl.study.markers import replace_block

        replace_block(ROOT / "docs" / "memory.md", "bench-memory", "update", table_text)


if __name__ == "__main__":
    main()
