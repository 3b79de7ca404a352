"""The grouping question at the level of the gradient (issue #12).

Freeze the warm start of ``examples/grouping/medium.toml``, draw ``--batches``
training batches from it (8 tasks x 8 rollouts, temperature 1), and for every arm
project the loss gradient on the direction ``d`` that raises the probability of
opening a response with a tool call at turn 0 (``d = grad mean_c log
pi("<call>" | c)`` over the turn-0 contexts of the held-out tasks), split into the
part that comes from turn-0 rows and the part from later-turn rows
(``projection.py`` beside this file; the loss is the trainer's, ``turnrl.train.update.loss``,
with the trainer's update batch). Positive means a gradient step makes opening
with the tool more likely. Arms:

* estimator ``grpo_mixed`` (legacy mixed groups), ``grpo`` (one value per
  rollout), ``node`` (exact decision points, mean only) and ``node_std`` (the same
  divided by the std, the scale of the other two);
* loss aggregation ``token-mean`` or ``rollout-mean``;
* later-turn rows trained (``all``) or ``train = false`` (``turn0``);
* ``legacy``: Agent Lightning v0.x + verl (``legacy.py``): ``grpo_mixed`` with
  verl's lone-sample rule, rows with long prompts dropped after the advantages,
  a random drop to a multiple of the mini-batch size, per-micro-batch token mean
  (micro-batch 4) with gradient accumulation; ``legacy_grpo`` is the same
  pipeline on ``grpo`` advantages.

The per-turn cost only changes rewards (every turn pays it), so one set of
rollouts serves every cost of ``COSTS``: each batch's rewards are re-costed.

    python examples/grouping/gradient.py --batches 110   # = make grouping-gradient
    python examples/grouping/gradient.py --summarise     # tables and figures only
    python examples/grouping/gradient.py --quick --out /tmp/gq   # smoke test

Writes ``OUT/warm`` (the frozen warm start), ``OUT/batches.jsonl`` (per batch:
every arm's projections at every cost, and the batch's episode statistics;
rerunning resumes), ``OUT/summary.md`` (every table docs/grouping-experiment.md
quotes) and the figures ``docs/img/grouping-gradient-*.png``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from legacy import LegacyPipeline, legacy_weights, select_rows  # noqa: E402

SETTING = ROOT / "examples" / "grouping" / "medium.toml"
COSTS = (0.0, 0.2, 0.4, 0.5, 0.6, 0.8)
"""Per-turn costs of the sweep (re-costed rewards of the same rollouts)."""
OPENING = "<call>"
MAX_PROMPT_LENGTH = 54
"""Legacy arm: rows whose prompt has more tokens are dropped (Agent Lightning's
``max_prompt_length``). Turn-0 contexts are 25-27 tokens here and the answer turn
after a tool call 52-56, so 54 drops the answer turns of tool trajectories on
two-step questions (and anything after a retry): the drop made visible, not
calibrated to calc_x (whose 4096 tokens rarely drop anything)."""
BOOTSTRAP = 2000


@dataclass(frozen=True)
class Arm:
    name: str
    estimator: str
    params: dict[str, Any]
    aggregation: str = "token-mean"
    later: bool = True
    """Whether rows after turn 0 are trained (False: ``train = false``)."""
    legacy: bool = False


def arms() -> list[Arm]:
    out = []
    for label, estimator, params in (
        ("grpo_mixed", "grpo_mixed", {}),
        ("grpo", "grpo", {}),
        ("node", "node", {}),
        ("node_std", "node", {"use_std": True}),
    ):
        for aggregation in ("token-mean", "rollout-mean"):
            for later in (True, False):
                suffix = f"{aggregation}/{'all' if later else 'turn0'}"
                out.append(Arm(f"{label}/{suffix}", estimator, params, aggregation, later))
    out.append(Arm("legacy", "grpo_mixed", {"lone": "raw"}, legacy=True))
    out.append(Arm("legacy_grpo", "grpo", {}, legacy=True))
    return out


# ----------------------------------------------------------------------------- measure


def warm_start(out: Path, overrides: list[str]) -> Path:
    """The frozen warm start (trained once; reused when present)."""
    from turnrl.train.config import RunConfig, load_config
    from turnrl.train.online.trainer import OnlineTrainer

    run_dir = out / "warm"
    if not (run_dir / "warm_start" / "config.json").exists():
        settings = [*overrides, f"run_dir={run_dir}", "train.steps=0", "train.threads=1"]
        config = load_config(RunConfig, SETTING, settings)
        OnlineTrainer(config, quiet=False).run()
    return run_dir / "warm_start"


def legacy_pipeline(config) -> LegacyPipeline:
    """calc_x's proportions: ppo_mini_batch_size = tasks per step, n = group size."""
    return LegacyPipeline(
        ppo_mini_batch_size=config.rollout.tasks_per_step,
        rollout_n=config.rollout.group_size,
        micro_batch_size=4,
        max_prompt_length=MAX_PROMPT_LENGTH,
    )


def project_arm(arm: Arm, records, table, logp, jd, mask, pipeline, seed: int) -> tuple:
    """``(turn-0 part, later part, rows trained)`` of one arm's projection on one batch."""
    import torch
    from projection import loss_logp_gradient, projection

    from turnrl.credit import compute_credit
    from turnrl.train.update.ppo import build_update_batch

    advantages = compute_credit(table, arm.estimator, **arm.params).advantages
    turn = np.array([r.turn for r in records])
    if arm.legacy:
        picked = select_rows(
            [len(r.prompt_ids or ()) for r in records], pipeline, random.Random(seed)
        )
        rows = picked.rows
        weights = legacy_weights(mask[rows], pipeline)
        adv = torch.as_tensor(advantages[rows], dtype=torch.float32)
    else:
        trained = [replace(r, train=bool(arm.later or r.turn == 0)) for r in records]
        batch = build_update_batch(trained, table, advantages, None, arm.aggregation)
        rows = [i for i, r in enumerate(trained) if r.response_ids and r.train]
        assert batch.responses == [list(records[i].response_ids or ()) for i in rows]
        weights, adv = batch.weight_B_T, batch.adv_B
    width = weights.shape[1]
    grad = loss_logp_gradient(logp[rows, :width], adv, mask[rows, :width], weights)
    first = torch.as_tensor(turn[rows] == 0)
    return (
        projection(grad, jd[rows, :width], rows=first),
        projection(grad, jd[rows, :width], rows=~first),
        len(rows),
    )


def episode_stats(episodes, records) -> dict[str, float]:
    """Sums the economics are built from: per opening (tool call, direct answer, other),
    episodes, successes and turns."""
    first = {r.traj_id: r for r in records if r.turn == 0}
    out: dict[str, float] = {}
    for e in episodes:
        response = first[e.traj_id].response or ""
        direct = response.startswith("<answer>")
        kind = "tool" if e.opened_with_tool else "direct" if direct else "other"
        out[f"n_{kind}"] = out.get(f"n_{kind}", 0) + 1
        out[f"success_{kind}"] = out.get(f"success_{kind}", 0) + float(bool(e.correct))
        out[f"turns_{kind}"] = out.get(f"turns_{kind}", 0) + e.turn
    out["rows"] = len(records)
    out["rows_later"] = sum(r.turn > 0 for r in records)
    out["malformed_rows"] = sum(bool(r.malformed) for r in records)
    out["truncated_rows"] = sum(r.stop_reason == "length" for r in records)
    return out


def measure(out: Path, n_batches: int, overrides: list[str]) -> None:
    import torch
    from projection import directional_logprobs, opening_direction

    from turnrl.envs import make_env, make_tasks
    from turnrl.io import append_jsonl
    from turnrl.policy import HFPolicy
    from turnrl.rollout import run_episodes
    from turnrl.table import TurnTable
    from turnrl.train.config import RunConfig, load_config

    torch.set_num_threads(1)
    config = load_config(RunConfig, SETTING, overrides)
    env = config.env
    policy = HFPolicy.from_pretrained(warm_start(out, overrides))
    policy.model.eval()
    train_tasks = make_tasks(env.name, env.n_train_tasks, env.seed, **env.task_kwargs)
    probe_tasks = make_tasks(env.name, env.n_eval_tasks, env.seed + 7919, **env.task_kwargs)
    env_kwargs = {**env.env_kwargs, "turn_cost": 0.0}  # costs are applied per arm below
    probe = [policy.encode_initial(make_env(env.name, **env_kwargs).reset(t)) for t in probe_tasks]
    opening = policy.tokenizer(OPENING, add_special_tokens=False)["input_ids"]
    direction = opening_direction(policy, probe, opening)
    pipeline = legacy_pipeline(config)
    path = out / "batches.jsonl"
    done = len(path.read_text().splitlines()) if path.exists() else 0
    from rich.progress import Progress

    with Progress() as bar:
        task = bar.add_task("batches", total=n_batches, completed=done)
        for index in range(done, n_batches):
            rng = np.random.default_rng([config.train.seed, index])
            picks = rng.choice(len(train_tasks), config.rollout.tasks_per_step, replace=False)
            batch = run_episodes(
                policy,
                lambda: make_env(env.name, **env_kwargs),
                [train_tasks[i] for i in picks],
                group_size=config.rollout.group_size,
                max_new_tokens=config.policy.max_new_tokens,
                temperature=config.policy.temperature,
                seed=1_000_003 * (config.train.seed + 1) + index,
                traj_prefix=f"b{index}-",
            )
            records = batch.records
            logp, jd, mask = directional_logprobs(
                policy,
                [list(r.prompt_ids or ()) for r in records],
                [list(r.response_ids or ()) for r in records],
                direction,
            )
            projections: dict[str, dict[str, list[float]]] = {}
            for cost in COSTS:
                costed = [replace(r, reward=r.reward - cost) for r in records]
                table = TurnTable.from_records(costed, source=f"batch {index}")
                projections[f"{cost:g}"] = {
                    arm.name: list(project_arm(arm, costed, table, logp, jd, mask, pipeline, index))
                    for arm in arms()
                }
            picked = select_rows(
                [len(r.prompt_ids or ()) for r in records], pipeline, random.Random(index)
            )
            stats = {
                **episode_stats(batch.episodes, records),
                "legacy_dropped_long": picked.dropped_long,
                "legacy_dropped_remainder": picked.dropped_remainder,
            }
            append_jsonl(path, {"batch": index, "projections": projections, "stats": stats})
            bar.update(task, advance=1)


# ----------------------------------------------------------------------------- summarise


def bootstrap(values: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """Mean over batches and its 95% percentile bootstrap interval."""
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (BOOTSTRAP, len(values)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(values.mean()), float(low), float(high)


def cell(values: np.ndarray, scale: float) -> str:
    mean, low, high = bootstrap(values * scale)
    sign = "+" if low > 0 else "-" if high < 0 else "0"
    return f"{mean:+.2f} [{low:+.2f}, {high:+.2f}] {sign}"


def load(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]


def opening_totals(rows: list[dict]) -> tuple[dict[str, float], float]:
    """The batches' episode statistics summed (``episode_stats`` keys), and how many
    episodes they count."""
    total: dict[str, float] = {}
    for row in rows:
        for key, value in row["stats"].items():
            total[key] = total.get(key, 0) + value
    return total, sum(total.get(f"n_{k}", 0) for k in ("tool", "direct", "other"))


def economics_header(costs: tuple[float, ...]) -> list[str]:
    """The header of an economics table: per opening, its share, success, turns and
    return at each of ``costs``."""
    return [
        "| opening | share of episodes | success | turns | "
        + " | ".join(f"return at cost {c:g}" for c in costs)
        + " |",
        "|---|---|---|---|" + "---|" * len(costs),
    ]


def economics(rows: list[dict]) -> list[str]:
    """Expected return of opening with the tool vs answering directly, per cost."""
    total, n = opening_totals(rows)
    lines = economics_header(COSTS)
    returns = {}
    for kind in ("tool", "direct", "other"):
        count = total.get(f"n_{kind}", 0)
        if not count:
            continue
        success = total[f"success_{kind}"] / count
        turns = total[f"turns_{kind}"] / count
        returns[kind] = [success - c * turns for c in COSTS]
        lines.append(
            f"| {kind} | {count / n:.3f} | {success:.3f} | {turns:.2f} | "
            + " | ".join(f"{v:+.3f}" for v in returns[kind])
            + " |"
        )
    if "tool" in returns and "direct" in returns:
        s_t = total["success_tool"] / total["n_tool"]
        s_d = total["success_direct"] / total["n_direct"]
        t_t = total["turns_tool"] / total["n_tool"]
        t_d = total["turns_direct"] / total["n_direct"]
        lines.append("")
        lines.append(
            f"Tool minus direct crosses zero at a per-turn cost of "
            f"{(s_t - s_d) / (t_t - t_d):.3f} ((success difference) / (turn difference))."
        )
    rows_total = total["rows"]
    lines.append("")
    lines.append(
        f"{len(rows)} batches, {n} episodes, {rows_total:.0f} rows "
        f"({total['rows_later'] / rows_total:.1%} after turn 0); malformed rows "
        f"{total['malformed_rows'] / rows_total:.1%}, responses cut at the token limit "
        f"{total['truncated_rows'] / rows_total:.1%}; legacy arm: "
        f"{total['legacy_dropped_long'] / rows_total:.1%} of rows dropped for a prompt over "
        f"{MAX_PROMPT_LENGTH} tokens, {total['legacy_dropped_remainder'] / rows_total:.1%} "
        "dropped to a multiple of the mini-batch size."
    )
    return lines


def projection_table(rows: list[dict], cost: str, scale: float) -> list[str]:
    names = [arm.name for arm in arms()]
    values = np.array([[row["projections"][cost][name][:2] for name in names] for row in rows])
    lines = [
        "| arm | turn-0 rows | later rows | total |",
        "|---|---|---|---|",
    ]
    for j, name in enumerate(names):
        lines.append(
            f"| {name} | {cell(values[:, j, 0], scale)} | {cell(values[:, j, 1], scale)} "
            f"| {cell(values[:, j].sum(axis=1), scale)} |"
        )
    return lines


def overview(rows: list[dict], scale: float) -> list[str]:
    """Every arm's total projection at every cost: where each arm's sign changes."""
    lines = [
        "| arm | " + " | ".join(f"cost {c:g}" for c in COSTS) + " |",
        "|---|" + "---|" * len(COSTS),
    ]
    for arm in arms():
        cells = []
        for cost in COSTS:
            v = np.array([row["projections"][f"{cost:g}"][arm.name][:2] for row in rows])
            mean, low, high = bootstrap(v.sum(axis=1) * scale)
            sign = "+" if low > 0 else "-" if high < 0 else "0"
            cells.append(f"{mean:+.0f} [{low:+.0f}, {high:+.0f}] {sign}")
        lines.append(f"| {arm.name} | " + " | ".join(cells) + " |")
    return lines


def contrast_values(rows: list[dict], cost: str) -> list[tuple[str, np.ndarray]]:
    """The differences that isolate each mechanism (paired over batches)."""

    def part(name: str, which: int | None) -> np.ndarray:
        v = np.array([row["projections"][cost][name][:2] for row in rows])
        return v.sum(axis=1) if which is None else v[:, which]

    pairs = [
        (
            "group statistics: grpo_mixed - grpo, turn-0 rows (token-mean, all)",
            part("grpo_mixed/token-mean/all", 0) - part("grpo/token-mean/all", 0),
        ),
        (
            "std division: node_std - node, turn-0 rows (token-mean, all)",
            part("node_std/token-mean/all", 0) - part("node/token-mean/all", 0),
        ),
        (
            "loss weighting: grpo_mixed token-mean - rollout-mean, total",
            part("grpo_mixed/token-mean/all", None) - part("grpo_mixed/rollout-mean/all", None),
        ),
        (
            "loss weighting: grpo token-mean - rollout-mean, total",
            part("grpo/token-mean/all", None) - part("grpo/rollout-mean/all", None),
        ),
        ("leakage: grpo_mixed later rows (token-mean)", part("grpo_mixed/token-mean/all", 1)),
        ("leakage: grpo later rows (token-mean)", part("grpo/token-mean/all", 1)),
        ("leakage: node later rows (token-mean)", part("node/token-mean/all", 1)),
        (
            "legacy pipeline - grpo_mixed (token-mean, all), total",
            part("legacy", None) - part("grpo_mixed/token-mean/all", None),
        ),
    ]
    return pairs


def contrasts(rows: list[dict], cost: str, scale: float) -> list[str]:
    lines = ["| contrast | mean [95% CI] |", "|---|---|"]
    lines += [
        f"| {label} | {cell(values, scale)} |" for label, values in contrast_values(rows, cost)
    ]
    return lines


def contrast_overview(rows: list[dict], scale: float) -> list[str]:
    """Every contrast at every cost (x scale, mean [95% CI] sign)."""
    table = [contrast_values(rows, f"{cost:g}") for cost in COSTS]
    lines = [
        "| contrast | " + " | ".join(f"cost {c:g}" for c in COSTS) + " |",
        "|---|" + "---|" * len(COSTS),
    ]
    for k, (label, _) in enumerate(table[0]):
        cells = []
        for pairs in table:
            mean, low, high = bootstrap(pairs[k][1] * scale)
            sign = "+" if low > 0 else "-" if high < 0 else "0"
            cells.append(f"{mean:+.0f} [{low:+.0f}, {high:+.0f}] {sign}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def figure(rows: list[dict], scale: float, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    shown = [
        "grpo_mixed/token-mean/all",
        "grpo/token-mean/all",
        "node/token-mean/all",
        "node_std/token-mean/all",
        "grpo_mixed/rollout-mean/all",
        "legacy",
    ]
    figure = Figure(figsize=(10, 3.6), dpi=100)
    FigureCanvasAgg(figure)
    for k, (which, title) in enumerate(((0, "turn-0 rows"), (1, "later rows"), (None, "total"))):
        axes = figure.add_subplot(1, 3, k + 1)
        for name in shown:
            means, lows, highs = [], [], []
            for cost in COSTS:
                v = np.array([row["projections"][f"{cost:g}"][name][:2] for row in rows])
                v = v.sum(axis=1) if which is None else v[:, which]
                mean, low, high = bootstrap(v * scale)
                means.append(mean)
                lows.append(low)
                highs.append(high)
            axes.plot(COSTS, means, marker="o", label=name)
            axes.fill_between(COSTS, lows, highs, alpha=0.15)
        axes.axhline(0, color="black", linewidth=0.8)
        axes.set_title(title)
        axes.set_xlabel("per-turn cost")
        if k == 0:
            axes.set_ylabel("projection on the tool-opening direction x 1000")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path)


def summarise(out: Path, figures: bool) -> str:
    rows = load(out)
    scale = 1e3
    parts = [
        "# Grouping experiment: gradient projection",
        "",
        "## The setting: expected return by opening (warm start, temperature 1)",
        "",
        *economics(rows),
        "",
        "## Total projection x 1000 by per-turn cost (mean [95% bootstrap CI], sign)",
        "",
        *overview(rows, scale),
        "",
        "## Contrasts x 1000 by per-turn cost (paired over batches; mean [95% CI], sign)",
        "",
        *contrast_overview(rows, scale),
    ]
    for cost in COSTS:
        key = f"{cost:g}"
        parts += [
            "",
            f"## Per-turn cost {key}: projection x 1000 (mean [95% bootstrap CI], sign)",
            "",
            *projection_table(rows, key, scale),
            "",
            *contrasts(rows, key, scale),
        ]
    text = "\n".join(parts) + "\n"
    (out / "summary.md").write_text(text)
    if figures:
        figure(rows, scale, ROOT / "docs" / "img" / "grouping-gradient.png")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "runs" / "grouping" / "gradient"))
    parser.add_argument("--quick", action="store_true", help="tiny warm start, 2 batches")
    parser.add_argument("--summarise", action="store_true", help="only tables and figures")
    args = parser.parse_args()
    out = Path(args.out)
    overrides = ["warm_start.steps=20", "env.n_eval_tasks=8"] if args.quick else []
    if not args.summarise:
        measure(out, 2 if args.quick else args.batches, overrides)
    print(summarise(out, figures=not args.quick))


if __name__ == "__main__":
    main()
