"""Why the tree layout is one masked forward: against ancestors' key/values kept in the graph.

    .venv/bin/python benchmarks/tree_attention.py [--write] [--only calculator,frozenlake]

Two ways to compute every distinct prefix of a batch's rows once, with the
same log-probs and gradients:

* ``mask`` (what :mod:`turnrl.policy.tree_layout` does): the whole trie in one
  sequence, one forward, each token attending to its ancestors through a
  boolean mask (attention also runs over masked pairs);
* ``kv``: the trie cut into segments (maximal chains without a branch), one
  forward per level of segments, each segment attending to its ancestors'
  keys and values from earlier forwards, kept in the autograd graph (exact
  attention, no masked pairs; but one forward per level, ancestors' keys and
  values gathered per child, each level padded to its longest segment).

Both run on the update batches of ``benchmarks/update.py``'s scenarios, cut by
the same token budgets (``split_rows``), forward and backward of the sum of
log-probs; CPU seconds of this process, one torch thread. ``kv`` lives here,
not in the library: it is the alternative that was measured and not chosen.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import RESULTS, write_section
from update import SCENARIOS, collect_batches, config_for, warm_start

from turnrl.policy.logprobs import scored_tokens
from turnrl.policy.tree_layout import TreeLayout, split_rows, tree_logprobs
from turnrl.train.lifecycle import Lifecycle
from turnrl.train.online.trainer import OnlineTrainer

TITLE = "Tree layout: attention mask against key/values in the graph"


def kv_logprobs(model: Any, contexts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
    """``logp_B_T`` of the responses, one forward per level of trie segments."""
    device = next(model.parameters()).device
    layout = TreeLayout.build(contexts, responses)
    size = layout.size
    children = [0] * size
    for p in layout.parent:
        if p >= 0:
            children[p] += 1
    # In depth-first order a chain without branches is contiguous: a segment starts at a
    # root or at a child of a branching node.
    starts = [i for i in range(size) if layout.parent[i] < 0 or children[layout.parent[i]] != 1]
    segment_of = [0] * size
    segments: list[tuple[int, int, int, int]] = []  # start, stop, parent segment, level
    for k, start in enumerate(starts):
        stop = starts[k + 1] if k + 1 < len(starts) else size
        up = segment_of[layout.parent[start]] if layout.parent[start] >= 0 else -1
        segments.append((start, stop, up, segments[up][3] + 1 if up >= 0 else 0))
        for i in range(start, stop):
            segment_of[i] = k
    scored = sorted({n for row in layout.nodes for n in row})
    predictors = {layout.parent[n] for n in scored}
    own: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in segments]
    logits_at: dict[int, torch.Tensor] = {}
    levels: dict[int, list[int]] = {}
    for k, segment in enumerate(segments):
        levels.setdefault(segment[3], []).append(k)
    for level in sorted(levels):
        ks = levels[level]
        lengths = [segments[k][1] - segments[k][0] for k in ks]
        ancestors = [layout.depth[segments[k][0]] for k in ks]
        width, past_width = max(lengths), max(ancestors)
        ids = torch.zeros(len(ks), width, dtype=torch.long)
        positions = torch.zeros(len(ks), width, dtype=torch.long)
        keep = torch.zeros(len(ks), width, dtype=torch.bool)
        mask = torch.zeros(len(ks), 1, width, past_width + width, dtype=torch.bool)
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        for b, k in enumerate(ks):
            start, stop = segments[k][:2]
            ids[b, : stop - start] = torch.tensor(layout.ids[start:stop])
            positions[b] = layout.depth[start] + torch.arange(width)
            mask[b, 0, :, past_width - ancestors[b] : past_width] = True
            mask[b, 0, :, past_width:] = causal
            for i in range(start, stop):
                keep[b, i - start] = i in predictors
        cache = None
        if past_width > 0:
            layers = []
            for layer in range(len(own[segments[ks[0]][2]])):
                keys, values = [], []
                for k in ks:
                    chain, up = [], segments[k][2]
                    while up >= 0:
                        chain.append(up)
                        up = segments[up][2]
                    chain.reverse()
                    key = torch.cat([own[c][layer][0] for c in chain], 1)
                    value = torch.cat([own[c][layer][1] for c in chain], 1)
                    pad = (0, 0, past_width - key.shape[1], 0)
                    keys.append(torch.nn.functional.pad(key, pad))
                    values.append(torch.nn.functional.pad(value, pad))
                layers.append((torch.stack(keys), torch.stack(values)))
            cache = DynamicCache(ddp_cache_data=layers)
        out = model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            cache=cache,
            use_cache=True,
            logits_to_keep=keep.to(device),
        )
        for b, k in enumerate(ks):
            start, stop = segments[k][:2]
            own[k] = [
                (layer.keys[b, :, past_width : past_width + stop - start],
                 layer.values[b, :, past_width : past_width + stop - start])
                for layer in out.cache.layers
            ]  # fmt: skip
        for (b, t), row in zip(keep.nonzero().tolist(), out.logits, strict=True):
            logits_at[segments[ks[b]][0] + t] = row
    slot = {n: j for j, n in enumerate(scored)}
    logits_K = torch.stack([logits_at[layout.parent[n]] for n in scored])
    logp_K = scored_tokens(logits_K, torch.tensor([layout.ids[n] for n in scored]), 1.0).logp
    index_B_T = torch.zeros(len(contexts), max(map(len, responses)), dtype=torch.long)
    mask_B_T = torch.zeros(index_B_T.shape)
    for b, row in enumerate(layout.nodes):
        index_B_T[b, : len(row)] = torch.tensor([slot[n] for n in row])
        mask_B_T[b, : len(row)] = 1.0
    return logp_K[index_B_T] * mask_B_T


def measure(model: Any, batches: list[Any], budget: int) -> dict[str, float]:
    out = {"mask": 0.0, "kv": 0.0, "diff": 0.0}
    for batch in batches:
        groups = split_rows(batch.contexts, batch.responses, budget)
        for group in groups:
            contexts = [batch.contexts[i] for i in group]
            responses = [batch.responses[i] for i in group]
            started = time.process_time()
            mask = tree_logprobs(model, contexts, responses, temperature=1.0).logp_B_T
            mask.sum().backward()
            out["mask"] += time.process_time() - started
            started = time.process_time()
            kv = kv_logprobs(model, contexts, responses)
            kv.sum().backward()
            out["kv"] += time.process_time() - started
            out["diff"] = max(out["diff"], float((mask - kv).abs().max()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="calculator,frozenlake,patr,smollm2")
    parser.add_argument("--steps", type=int, default=2, help="rollout batches per scenario")
    parser.add_argument("--budgets", default="1024,2048,4096,1000000")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [
        "| scenario | budget | mask CPU s | kv CPU s | kv / mask | max log-prob difference |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="turnrl-bench-attention-") as tmp:
        for name in args.only.split(","):
            scenario = SCENARIOS[name]
            work = Path(tmp) / name
            warm = warm_start(scenario, work)
            batches = collect_batches(scenario, work, warm, args.steps)
            config = config_for(scenario, work / "model", [f"warm_start.init_from={warm}"])
            trainer = OnlineTrainer(config, quiet=True)
            Lifecycle(trainer).start()
            model = trainer.policy.model.train()
            for budget in map(int, args.budgets.split(",")):
                r = measure(model, batches, budget)
                shown = "whole" if budget >= 1_000_000 else f"{budget:,}"
                lines.append(
                    f"| {name} | {shown} | {r['mask']:.2f} | {r['kv']:.2f} "
                    f"| {r['kv'] / r['mask']:.2f} | {r['diff']:.1e} |"
                )
                print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    if args.write:
        command = "python benchmarks/tree_attention.py " + " ".join(sys.argv[1:])
        body = (
            f"- setup: {args.steps} rollout batches per scenario (benchmarks/update.py's), cut "
            "by each token budget; forward + backward of the sum of log-probs; CPU seconds, one "
            "torch thread\n\n" + table
        )
        write_section(RESULTS, TITLE, body, command.strip(), date.today())


if __name__ == "__main__":
    main()
