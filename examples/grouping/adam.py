"""The grouping question at the level of the optimiser's actual updates (issue #25, item 4).

``gradient.py`` projects the loss *gradient* on the tool-opening direction: the
first-order change of ``b = mean_c log pi("<call>" | c)`` under a small plain
(SGD) step. The trainer does not take that step: it takes AdamW steps (lr, betas
and epsilon of ``turnrl.train.policy_start``, the gradient norm clipped at
``train.max_grad_norm``, PPO-clip mini-batches of ``train.minibatch_size`` rows).
Adam's first step is close to ``lr * sign(g)`` per coordinate, so its effect on
``b`` need not have the gradient's sign. This script runs the trainer's own update
(:func:`turnrl.train.update.ppo.ppo_update` with a fresh ``torch.optim.AdamW`` as
``turnrl.train.policy_start.start_training`` builds it) from the frozen warm start of
``gradient.py``, and for each update ``k`` of ``--updates`` on-policy updates
records, per arm and per-turn cost:

* ``sgd``: ``-grad L . d`` on the update's batch at the current parameters, the
  quantity ``gradient.py`` reports (``d = grad b``);
* ``adam``: ``delta theta . d``, the first-order change of ``b`` under the update
  the optimiser really made (all its mini-batch steps on the batch);
* ``change``: the actual change of ``b``, ``b(theta after) - b(theta before)``.

Update 1 of every arm and cost is on the same batch (paired); later updates
sample from each arm's own policy. Arms: ``grpo`` and ``grpo_mixed`` (divided by
the group's std) and ``dr_grpo`` and ``node`` (centred only), all token-mean with
every turn trained, as the grouping study defines them.

    python examples/grouping/adam.py --chains 24 --updates 3   # = make grouping-adam
    python examples/grouping/adam.py --summarise               # the table only
    python examples/grouping/adam.py --quick --out /tmp/aq     # smoke test

Writes ``OUT/warm`` (the frozen warm start, as gradient.py trains it; reused),
``OUT/chains.jsonl`` (one line per chain; rerunning resumes), ``OUT/summary.md``, and
the table between the ``grouping-adam:updates`` markers of docs/grouping-experiment.md
(not with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from gradient import (  # noqa: E402
    OPENING,
    SETTING,
    bootstrap,
    economics_header,
    episode_stats,
    opening_totals,
    warm_start,
)

ARMS = (
    ("grpo", "grpo", "std"),
    ("grpo_mixed", "grpo_mixed", "std"),
    ("dr_grpo", "dr_grpo", "mean"),
    ("node", "node", "mean"),
)
"""``(name, estimator, what divides the group)``."""
COSTS = (0.0, 0.4)
"""0: the seed's reward (correctness only); 0.4: where gradient.py's std-divided arms
turn against the tool while the tool still pays (break-even 0.418)."""
DOC = ROOT / "docs" / "grouping-experiment.md"


def opening_logprob(policy, probe, opening) -> float:
    """``b``: the mean log-probability of opening a response with ``opening``."""
    import torch

    with torch.no_grad():
        logp, _ = policy.response_logprobs(probe, [list(opening)] * len(probe))
    return float(logp.sum() / len(probe))


def one_update(policy, optimizer, records, config, probe, opening, estimator, seed) -> dict:
    """The three quantities of one trainer update on ``records`` (already costed)."""
    import torch
    from projection import (
        directional_logprobs,
        loss_logp_gradient,
        opening_direction,
        projection,
        trainable_parameters,
    )

    from turnrl.credit import compute_credit
    from turnrl.table import TurnTable
    from turnrl.train.update.ppo import build_update_batch, ppo_update

    policy.model.eval()
    table = TurnTable.from_records(records, source="adam")
    credit = compute_credit(table, estimator)
    batch = build_update_batch(
        records, table, credit.advantages, credit.clip_factor, config.train.aggregation
    )
    direction = opening_direction(policy, probe, opening)
    logp, jd, mask = directional_logprobs(policy, batch.contexts, batch.responses, direction)
    width = batch.weight_B_T.shape[1]
    grad = loss_logp_gradient(logp[:, :width], batch.adv_B, mask[:, :width], batch.weight_B_T)
    sgd = projection(grad, jd[:, :width])
    before_b = opening_logprob(policy, probe, opening)
    before = [p.detach().clone() for p in trainable_parameters(policy)]
    stats = ppo_update(
        policy,
        optimizer,
        batch,
        config.train,
        temperature=config.policy.temperature,
        reference=None,
        seed=seed,
    )
    policy.model.eval()
    after = trainable_parameters(policy)
    adam = float(
        sum(
            ((a.detach() - b) * d).double().sum()
            for a, b, d in zip(after, before, direction, strict=True)
        )
    )
    change = opening_logprob(policy, probe, opening) - before_b
    steps = -(-len(batch.contexts) // config.train.minibatch_size) * config.train.epochs
    return {
        "sgd": sgd,
        "adam": adam,
        "change": change,
        "optimizer_steps": steps,
        "grad_norm": float(stats.get("grad_norm", float("nan"))),
        "rows": len(batch.contexts),
        "b": before_b,
        "zero_advantage_rows": float(torch.as_tensor(batch.adv_B == 0).float().mean()),
    }


def measure(out: Path, chains: int, updates: int, overrides: list[str]) -> None:
    import torch

    from turnrl.envs import make_env, make_tasks
    from turnrl.io import append_jsonl
    from turnrl.policy import HFPolicy
    from turnrl.rollout import run_episodes
    from turnrl.train.config import RunConfig, load_config

    torch.set_num_threads(1)
    config = load_config(RunConfig, SETTING, overrides)
    env = config.env
    warm = warm_start(out, overrides)
    probe_policy = HFPolicy.from_pretrained(warm)
    train_tasks = make_tasks(env.name, env.n_train_tasks, env.seed, **env.task_kwargs)
    probe_tasks = make_tasks(env.name, env.n_eval_tasks, env.seed + 7919, **env.task_kwargs)
    env_kwargs = {**env.env_kwargs, "turn_cost": 0.0}  # costs are applied below
    probe = [
        probe_policy.encode_initial(make_env(env.name, **env_kwargs).reset(t)) for t in probe_tasks
    ]
    opening = probe_policy.tokenizer(OPENING, add_special_tokens=False)["input_ids"]
    path = out / "chains.jsonl"
    done = len(path.read_text().splitlines()) if path.exists() else 0

    def sample(policy, chain: int, update: int, tag: str):
        rng = np.random.default_rng([config.train.seed, 7, chain, update])
        picks = rng.choice(len(train_tasks), config.rollout.tasks_per_step, replace=False)
        policy.model.eval()
        return run_episodes(
            policy,
            lambda: make_env(env.name, **env_kwargs),
            [train_tasks[i] for i in picks],
            group_size=config.rollout.group_size,
            max_new_tokens=config.policy.max_new_tokens,
            temperature=config.policy.temperature,
            seed=1_000_003 * (chain + 1) + 7_919 * update,
            traj_prefix=f"c{chain}-u{update}-{tag}-",
        )

    for chain in range(done, chains):
        shared = sample(probe_policy, chain, 1, "shared")
        first = shared.records
        line: dict[str, dict] = {}
        for cost in COSTS:
            for name, estimator, _ in ARMS:
                policy = HFPolicy.from_pretrained(warm)
                optimizer = torch.optim.AdamW(
                    policy.parameters(), lr=config.train.lr, weight_decay=0.0
                )
                rows = []
                for update in range(1, updates + 1):
                    records = first if update == 1 else sample(policy, chain, update, name).records
                    costed = [replace(r, reward=r.reward - cost) for r in records]
                    seed = 104_729 * chain + update
                    rows.append(
                        one_update(
                            policy, optimizer, costed, config, probe, opening, estimator, seed
                        )
                    )
                line[f"{cost:g}/{name}"] = rows
                print(
                    f"chain {chain} cost {cost:g} {name}: "
                    + ", ".join(
                        f"{r['sgd']:+.3f}/{r['adam']:+.4f}/{r['change']:+.4f}" for r in rows
                    ),
                    flush=True,
                )
        stats = episode_stats(shared.episodes, first)
        append_jsonl(path, {"chain": chain, "updates": line, "stats": stats})


# ----------------------------------------------------------------------------- summarise


def load(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "chains.jsonl").read_text().splitlines()]


def cell(values: np.ndarray, scale: float) -> str:
    mean, low, high = bootstrap(values * scale)
    sign = "+" if low > 0 else "-" if high < 0 else "0"
    return f"{mean:+.1f} [{low:+.1f}, {high:+.1f}] {sign}"


def values(rows: list[dict], key: str, update: int, quantity: str) -> np.ndarray:
    return np.array([row["updates"][key][update - 1][quantity] for row in rows])


def table(rows: list[dict]) -> list[str]:
    """Per cost, arm and update: the SGD projection, Adam's first-order change and the
    actual change of the opening log-prob, and how often Adam's sign is the gradient's."""
    updates = len(next(iter(rows[0]["updates"].values())))
    lines = [
        "| cost | arm | update | SGD projection x 1000 | Adam update . d x 1000 "
        "| actual change of log pi(<call>) x 1000 | same sign as SGD |",
        "|---|---|---|---|---|---|---|",
    ]
    for cost in COSTS:
        for name, _, divides in ARMS:
            key = f"{cost:g}/{name}"
            for update in range(1, updates + 1):
                sgd = values(rows, key, update, "sgd")
                adam = values(rows, key, update, "adam")
                change = values(rows, key, update, "change")
                agree = int((np.sign(sgd) == np.sign(adam)).sum())
                lines.append(
                    f"| {cost:g} | {name} ({divides}) | {update} | {cell(sgd, 1e3)} "
                    f"| {cell(adam, 1e3)} | {cell(change, 1e3)} | {agree}/{len(rows)} |"
                )
    return lines


def economics(rows: list[dict]) -> list[str]:
    """The warm start's shared first batches: share, success, turns and return at each
    cost per opening (the economics gradient.py reports for its batches)."""
    total, n = opening_totals(rows)
    lines = economics_header(COSTS)
    for kind in ("tool", "direct", "other"):
        count = total.get(f"n_{kind}", 0)
        if count:
            success = total[f"success_{kind}"] / count
            turns = total[f"turns_{kind}"] / count
            returns = " | ".join(f"{success - c * turns:+.3f}" for c in COSTS)
            lines.append(f"| {kind} | {count / n:.3f} | {success:.3f} | {turns:.2f} | {returns} |")
    return lines


def summarise(out: Path, write_doc: bool) -> str:
    """``OUT/summary.md``; with ``write_doc`` the table also goes between the
    ``grouping-adam:updates`` markers of docs/grouping-experiment.md."""
    from turnrl.study.markers import replace_block
    from turnrl.study.provenance import git_commit

    rows = load(out)
    first = [row["updates"][f"{COSTS[0]:g}/{ARMS[0][0]}"][0] for row in rows]
    updates = len(next(iter(rows[0]["updates"].values())))
    block = "\n".join(
        [
            *table(rows),
            "",
            "The warm start on the shared first batches (every chain's update 1):",
            "",
            *economics(rows),
            "",
            f"_{len(rows)} chains of {updates} updates (mean [95% bootstrap CI over chains], "
            "sign when the interval excludes 0); update 1 of every arm and cost on the same "
            f"batch ({min(r['rows'] for r in first)}-{max(r['rows'] for r in first)} rows, "
            f"{min(r['optimizer_steps'] for r in first)}-"
            f"{max(r['optimizer_steps'] for r in first)} AdamW steps); "
            f"`python examples/grouping/adam.py --chains {len(rows)} --updates {updates}` "
            f"at {git_commit(ROOT)}._",
        ]
    )
    text = "# Grouping experiment: the optimiser's actual updates\n\n" + block
    (out / "summary.md").write_text(text + "\n")
    if write_doc and replace_block(DOC, "grouping-adam", "updates", block):
        print(f"{DOC}: table grouping-adam:updates rewritten")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chains", type=int, default=12)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "runs" / "grouping" / "adam"))
    parser.add_argument("--quick", action="store_true", help="tiny warm start, 1 chain")
    parser.add_argument("--summarise", action="store_true", help="only the table")
    args = parser.parse_args()
    out = Path(args.out)
    overrides = ["warm_start.steps=20", "env.n_eval_tasks=8"] if args.quick else []
    if not args.summarise:
        measure(out, 1 if args.quick else args.chains, 2 if args.quick else args.updates, overrides)
    print(summarise(out, write_doc=not args.quick))


if __name__ == "__main__":
    main()
