"""SmolLM2-135M-Instruct on CPU: seconds per RL step and peak memory, LoRA vs full fine-tune.

    .venv/bin/python benchmarks/smollm2.py            # writes the section in RESULTS.md
    .venv/bin/python benchmarks/smollm2.py --no-write

Needs the ``smol`` extras (``make demo-smol`` installs them). Each measurement runs
in its own child process (this script with ``--child``), so that its peak resident
memory (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) is its own:

1. ``convert``: GGUF -> safetensors into a temporary cache (the one-off cost of
   ``smollm2_path``), then loading the converted directory;
2. ``warm``: a short LoRA warm start on hermes-format demonstrations (the
   ``calculator_smollm2`` recipe's), saved as an adapter and as a merged full model,
   so both modes start from a policy that emits the tool format;
3. ``lora`` and ``full``: ``--steps`` RL steps of the recipe (its task and group
   sizes) with ``init_from`` the warm start, LoRA adapters (recipe rank) or the whole
   model trained. Times come from the trainer's own per-step metrics.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_file import write_section  # noqa: E402

RECIPE = ROOT / "examples" / "calculator_smollm2.toml"
PARTS = ("seconds_sampling", "seconds_env", "seconds_credit", "seconds_update", "seconds_step")


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_convert(work: Path) -> dict:
    from turnrl.policy import HFPolicy
    from turnrl.policy.pretrained import smollm2_path

    started = time.perf_counter()
    path = smollm2_path(work / "cache")
    converted = time.perf_counter() - started
    started = time.perf_counter()
    HFPolicy.from_pretrained(path)
    size = sum(f.stat().st_size for f in path.iterdir()) / 2**20
    return {
        "seconds_convert": converted,
        "seconds_load": time.perf_counter() - started,
        "disk_mib": size,
    }


def _config(work: Path, name: str, extra: list[str]):
    from turnrl.train.config import RunConfig, load_config

    return load_config(RunConfig, RECIPE, [f"run_dir={work / name}", "train.threads=1", *extra])


def child_warm(work: Path, steps: int) -> dict:
    from turnrl.train.lifecycle import Lifecycle
    from turnrl.train.online.trainer import OnlineTrainer

    trainer = OnlineTrainer(_config(work, "warm", [f"warm_start.steps={steps}"]), quiet=True)
    started = time.perf_counter()
    Lifecycle(trainer).start()  # warm start, saved to warm/warm_start (adapter only)
    seconds = time.perf_counter() - started
    merged = trainer.policy.clone_frozen()
    merged.model.requires_grad_(True)
    merged.save(work / "warm_full")
    return {"seconds_warm_start_step": seconds / max(steps, 1)}


def child_train(work: Path, mode: str, steps: int) -> dict:
    from turnrl.train.lifecycle import Lifecycle
    from turnrl.train.online.trainer import OnlineTrainer

    source = work / "warm" / "warm_start" if mode == "lora" else work / "warm_full"
    rank = [] if mode == "lora" else ["policy.lora_rank=0"]
    config = _config(work, mode, [f"warm_start.init_from={source}", *rank])
    trainer = OnlineTrainer(config, quiet=True)
    Lifecycle(trainer).start()
    trainable = sum(p.numel() for p in trainer.policy.parameters())
    rows = [trainer.train_step() for _ in range(steps)]
    return {
        "trainable": trainable,
        "steps": [{k: r[k] for k in (*PARTS, "episodes", "success")} for r in rows],
        "tokens": trainer.tokens,
        "rows": trainer.env_steps,
    }


def run_child(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, cwd=ROOT
    )
    if done.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(args: argparse.Namespace, convert: dict, warm: dict, modes: dict[str, dict]) -> str:
    from turnrl.train.config import RunConfig, load_config

    config = load_config(RunConfig, RECIPE, [])
    lines = [
        f"Recipe `examples/calculator_smollm2.toml`: {config.rollout.tasks_per_step} tasks x "
        f"{config.rollout.group_size} episodes per step, up to {config.env.env_kwargs['max_turns']}"
        f" turns, max_new_tokens {config.policy.max_new_tokens}, LoRA rank "
        f"{config.policy.lora_rank} on all attention/MLP projections; 1 torch thread; "
        f"{args.steps} RL steps per mode after a {args.warm_steps}-step LoRA warm start; "
        "mean (min-max) over the steps. Peak RSS = `ru_maxrss` of the child process doing "
        "the work (model load, warm-start reload, rollouts, updates).",
        "",
        f"- one-off GGUF -> safetensors conversion: {convert['seconds_convert']:.1f} s "
        f"(peak RSS {convert['peak_rss_mib']:.0f} MiB), {convert['disk_mib']:.0f} MiB on disk; "
        f"loading the converted directory: {convert['seconds_load']:.1f} s",
        f"- warm start (LoRA SFT, batch {config.warm_start.batch_size}): "
        f"{warm['seconds_warm_start_step']:.1f} s per step, model load included "
        f"(peak RSS {warm['peak_rss_mib']:.0f} MiB)",
        "",
        "| mode | trainable params | s/step | sampling | env | credit | update | rows/step "
        "| tokens/step | peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, result in modes.items():
        steps = result["steps"]

        def cell(key: str, steps: list[dict] = steps) -> str:
            values = [s[key] for s in steps]
            digits = 2 if max(values) < 1 else 1
            if len(values) == 1:
                return f"{values[0]:.{digits}f}"
            low, high = min(values), max(values)
            return f"{statistics.mean(values):.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"

        n = len(steps)
        lines.append(
            f"| {'LoRA' if mode == 'lora' else 'full fine-tune'} | {result['trainable']:,} "
            f"| {cell('seconds_step')} | {cell('seconds_sampling')} | {cell('seconds_env')} "
            f"| {cell('seconds_credit')} | {cell('seconds_update')} | {result['rows'] / n:.0f} "
            f"| {result['tokens'] / n:.0f} | {result['peak_rss_mib']:.0f} MiB |"
        )
    lines += [
        "",
        "Times in seconds. Sampling is the same model in both modes (the rows differ because "
        "the samples do); the update differs by the weight gradients and AdamW state of 135M "
        "parameters versus the adapters'. The machine's 2 cores were shared with other jobs "
        f"(1-min load average {args.load:.1f} at start), so absolute times are noisy.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="RL steps per mode")
    parser.add_argument("--warm-steps", type=int, default=16)
    parser.add_argument("--modes", default="lora,full")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(1)
        kind, work, *rest = args.child
        work_dir = Path(work)
        if kind == "convert":
            result = child_convert(work_dir)
        elif kind == "warm":
            result = child_warm(work_dir, int(rest[0]))
        else:
            result = child_train(work_dir, kind, int(rest[0]))
        print(json.dumps({**result, "peak_rss_mib": peak_rss_mib()}))
        return

    with open("/proc/loadavg") as handle:
        args.load = float(handle.read().split()[0])
    with tempfile.TemporaryDirectory() as tmp:
        convert = run_child("convert", tmp)
        print("convert", convert, flush=True)
        warm = run_child("warm", tmp, str(args.warm_steps))
        print("warm", warm, flush=True)
        modes = {}
        for mode in args.modes.split(","):
            modes[mode] = run_child(mode, tmp, str(args.steps))
            print(mode, modes[mode], flush=True)
    body = report(args, convert, warm, modes)
    print(body)
    if not args.no_write:
        command = ".venv/bin/python benchmarks/smollm2.py"
        write_section(
            ROOT / "benchmarks" / "RESULTS.md", "SmolLM2-135M on CPU", body, command, date.today()
        )


if __name__ == "__main__":
    main()
