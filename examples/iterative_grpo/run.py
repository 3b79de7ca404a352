"""Iterative GRPO vs online multi-turn GRPO at an equal number of deployed conversations.

Per negotiation setting and seed:

1. ``turnrl iterate`` (``examples/iterate_<setting>.toml``): warm start on weak
   demonstrations, then ``--iterations`` rounds of deploy ``--conversations``
   conversations -> fit Q -> improve against Q (no counterpart) -> redeploy.
   Four configurations (``VARIANTS``): the paper's ``q`` estimator (mean and std
   within the state), "mean-only + explore" (no std division; half the
   conversations deployed at temperature 1.5), and two guards against exploiting Q
   ("format check", "+ std floor"). All start from the same weights.
2. Online ``grpo`` (``OnlineTrainer``) from the SAME warm-started weights, talking
   to the scripted counterpart during training: 4 tasks x 4 rollouts (16
   conversations) per step, ``iterations * conversations / 16`` steps, so both
   deploy the same number of conversations; one optimiser step per RL step, the
   same number of policy updates as Iterative GRPO's ``improve.steps`` per
   iteration (8 per 128 conversations) by default. Same policy lr and KL weight.

All are evaluated the same way (greedy, 64 held-out personas) after every
``--conversations`` deployed conversations; the value of the conversations
deployed in each block is reported too. Outputs, under ``--out``:

    <setting>/iterative[-variant]/seed<k>/   turnrl iterate run dirs (Q quality per iteration)
    <setting>/online/seed<k>/                turnrl train run dirs
    <setting>/compare/<method>-seed<k>/      metrics re-indexed by deployed conversations
    report-<setting>.html            every method vs conversations (seed mean +- std)
    report-<setting>-q.html          Q quality and improvement metrics per iteration
    summary.md                       the tables quoted in docs/iterative-grpo.md

    nice -n 10 python examples/iterative_grpo/run.py                 # everything
    python examples/iterative_grpo/run.py --settings split_money \
        --methods "iterative grpo, mean-only + explore"               # one method
    python examples/iterative_grpo/run.py --summarise                # tables only
    python examples/iterative_grpo/run.py --quick --out /tmp/ig      # smoke run (1 seed)

Runs are sequential, one torch thread (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 16
"""Conversations per online GRPO step (4 tasks x 4 rollouts)."""
PERSONA = "Negotiate hard."
"""The exploration persona of the persona-aware methods."""


def run_iterative(setting: str, seed: int, run_dir: Path, overrides: list[str]) -> Path:
    """One ``turnrl iterate`` run from the setting's recipe, with ``overrides``."""
    from turnrl.train.config import load_config
    from turnrl.train.iterate.config import IterateConfig
    from turnrl.train.iterate.loop import IterativeGRPO

    config = load_config(
        IterateConfig,
        ROOT / "examples" / f"iterate_{setting}.toml",
        [*overrides, f"run_dir={run_dir}", f"seed={seed}", "threads=1"],
    )
    return IterativeGRPO(config, quiet=True, overwrite=True).run()  # a rerun starts over


def run_online(
    setting: str,
    seed: int,
    run_dir: Path,
    warm: Path,
    steps: int,
    every: int,
    lr: float,
    label: str = "online grpo",
) -> Path:
    from turnrl.train.config import RunConfig, load_config
    from turnrl.train.online.trainer import OnlineTrainer

    overrides = [
        f"run_dir={run_dir}",
        f"label={label}",
        f"env.name={setting}",
        "env.n_train_tasks=512",
        "env.n_eval_tasks=64",
        "env.env_kwargs={max_turns = 6}",
        "policy.max_new_tokens=24",
        f"warm_start.init_from={warm}",
        "rollout.group_size=4",
        f"rollout.tasks_per_step={BLOCK // 4}",
        "credit.estimator=grpo",
        f"train.steps={steps}",
        f"train.lr={lr}",
        "train.kl_coef=0.05",
        "train.epochs=1",
        "train.minibatch_size=128",
        f"train.eval_every={every}",
        "train.eval_temperature=0.0",
        "train.checkpoint_every=1000000",  # (0 divides by zero in OnlineTrainer.run)
        "train.log_rollouts_every=0",
        f"train.seed={seed}",
        "train.threads=1",
    ]
    config = load_config(RunConfig, None, overrides)
    return OnlineTrainer(config, quiet=True, overwrite=True).run()  # a rerun starts over


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


KEYS = ("eval_return", "eval_success", "return", "success", "malformed_rate", "eval_malformed_rate")


def write_compare(out: Path, label: str, points: list[dict]) -> Path:
    """A run directory whose steps are deployed conversations (for the shared report)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(f'label = "{label}"\n')
    (out / "metrics.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    return out


def iterative_points(run: Path) -> list[dict]:
    points = []
    for r in rows(run):
        point = {"step": int(r["conversations"])}
        point.update(
            {k: r[k] for k in ("eval_return", "eval_success", "eval_malformed_rate") if k in r}
        )
        if r["step"] > 0:  # the batch deployed in this iteration (by the previous policy)
            point.update(
                deployed_return=r["return"],
                deployed_success=r["success"],
                deployed_malformed_rate=r["malformed_rate"],
            )
        points.append(point)
    return points


def online_points(run: Path, per_block: int) -> list[dict]:
    """Eval rows as they are; training-batch metrics averaged over each block of
    ``per_block`` steps (the same conversations an iteration deploys)."""
    data = rows(run)
    points = []
    for r in data:
        if "eval_return" not in r:
            continue
        step = int(r["step"])
        point = {"step": step * BLOCK}
        point.update({k: r[k] for k in ("eval_return", "eval_success", "eval_malformed_rate")})
        block = [x for x in data if step - per_block < x["step"] <= step and "return" in x]
        if step > 0 and block:
            point.update(
                deployed_return=float(np.mean([x["return"] for x in block])),
                deployed_success=float(np.mean([x["success"] for x in block])),
                deployed_malformed_rate=float(np.mean([x["malformed_rate"] for x in block])),
            )
        points.append(point)
    return points


def cell(values: list[float]) -> str:
    """``mean ± sd`` over seeds (sample sd, ddof 1; "–" for one seed)."""
    values = [v for v in values if v == v]
    if not values:
        return "n/a"
    sd = f"{np.std(values, ddof=1):.3f}" if len(values) > 1 else "–"
    return f"{np.mean(values):.3f} ± {sd}"


def method_table(setting: str, compare: dict[str, list[Path]], seeds: int) -> list[str]:
    lines = [
        f"### {setting}: Iterative GRPO vs online GRPO at equal deployed conversations",
        "",
        "| conversations | method | eval value | eval deal rate | deployed value "
        "| deployed deal rate | eval malformed |",
        "|---|---|---|---|---|---|---|",
    ]
    series = {m: [rows(d) for d in dirs] for m, dirs in compare.items()}
    steps = sorted({p["step"] for runs in series.values() for run in runs for p in run})
    for step in steps:
        for method, runs in series.items():
            at = [next((p for p in run if p["step"] == step), None) for run in runs]
            at = [p for p in at if p is not None]
            if not at:
                continue
            lines.append(
                f"| {step} | {method} | "
                + " | ".join(
                    cell([p.get(k, float("nan")) for p in at])
                    for k in (
                        "eval_return",
                        "eval_success",
                        "deployed_return",
                        "deployed_success",
                        "eval_malformed_rate",
                    )
                )
                + " |"
            )
    lines.append("")
    lines.append(f"(mean ± std over {seeds} seeds; value = normalised deal value, 0 without deal)")
    return lines


def final_table(setting: str, compare: dict[str, list[Path]], seeds: int) -> list[str]:
    """The doc's results table: each method after its last block, with every seed's
    greedy eval value at the start and at the end."""
    lines = [
        f"### {setting}: after the last block of deployed conversations",
        "",
        "| method | conversations | eval value | eval deal rate | deployed value (last block) "
        "| eval malformed turns | per seed, eval value start -> end |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, dirs in compare.items():
        runs = [rows(d) for d in dirs]
        ends = [run[-1] for run in runs]
        per_seed = ", ".join(
            f"{run[0].get('eval_return', float('nan')):.2f} -> "
            f"{run[-1].get('eval_return', float('nan')):.2f}"
            for run in runs
        )
        lines.append(
            f"| {method} | {', '.join(str(int(e['step'])) for e in ends)} | "
            + " | ".join(
                cell([e.get(k, float("nan")) for e in ends])
                for k in ("eval_return", "eval_success", "deployed_return", "eval_malformed_rate")
            )
            + f" | {per_seed} |"
        )
    lines.append("")
    lines.append(f"(mean ± std over {seeds} seeds; seeds in order 0, 1, ...)")
    return lines


Q_KEYS = (
    ("q_heldout_loss", "held-out MSE"),
    ("q_heldout_baseline_loss", "constant-mean MSE"),
    ("q_heldout_ece", "held-out ECE"),
    ("q_heldout_spearman", "held-out Spearman"),
    ("q_heldout_within_state_pearson", "within-state corr."),
    ("qprev_spearman", "previous Q on this batch (Spearman)"),
    ("improve_q_before", "policy's mean Q, before improving"),
    ("improve_q_after", "after"),
    ("improve_q_spread", "within-state Q std"),
    ("improve_kl_ref", "KL to deployed"),
)


def q_table(setting: str, runs: list[Path]) -> list[str]:
    lines = [
        f"### {setting}: Q quality (held-out conversations) and improvement, per iteration",
        "",
        "| iteration | " + " | ".join(label for _, label in Q_KEYS) + " |",
        "|---|" + "---|" * len(Q_KEYS),
    ]
    data = [rows(r) for r in runs]
    iterations = sorted({r["step"] for run in data for r in run if r["step"] > 0})
    for it in iterations:
        at = [r for run in data for r in run if r["step"] == it]  # runs still going may lack it
        lines.append(
            f"| {it} | "
            + " | ".join(cell([r.get(k, float("nan")) for r in at]) for k, _ in Q_KEYS)
            + " |"
        )
    return lines


NO_FLOOR = "improve.std_floor=0.0"
VARIANTS: dict[str, list[str]] = {
    "iterative grpo": ["improve.reject_malformed=false", NO_FLOOR],
    "iterative grpo, mean-only + explore": [
        "improve.reject_malformed=false",
        "improve.use_std=false",
        "deploy.temperatures=[1.0, 1.5]",
        NO_FLOOR,
    ],
    "iterative grpo, format check": ["improve.reject_malformed=true", NO_FLOOR],
    "iterative grpo, format check + std floor": [
        "improve.reject_malformed=true",
        "improve.std_floor=0.05",
    ],
    "iterative grpo, format check + std floor, Q from policy": [
        "improve.reject_malformed=true",
        "improve.std_floor=0.05",
        "q.init=policy",
    ],
    "persona-aware: iterative grpo, format check": ["improve.reject_malformed=true", NO_FLOOR],
    "persona-aware: iterative grpo, format check + persona explore": [
        "improve.reject_malformed=true",
        f'deploy.personas=["", "{PERSONA}"]',
        NO_FLOOR,
    ],
}
"""Iterative GRPO configurations compared (overrides on top of the recipe): the paper's
``q`` estimator (mean and std within the state, every candidate scored by Q); a variant
that does not divide by the within-state std and deploys half the conversations at a
higher temperature; two guards against Q exploitation (not in the paper): candidates
that are no well-formed action scored as the worst logged return instead of by Q, alone
and with the within-state std floored at 0.05 (return units), the latter also with Q
initialised from the policy's transformer (``q.init=policy``). The ``persona-aware``
methods start from a warm start that also learned ``strong`` demonstrations under the
instruction ``PERSONA`` (``warm_start.persona_styles``), with and without deploying half
the conversations under that persona (``deploy.personas``)."""

ONLINE = "online grpo"
PERSONA_ONLINE = "persona-aware: online grpo"
PERSONA_WARM = [f'warm_start.persona_styles={{ "{PERSONA}" = "strong" }}']
"""How the persona-aware warm start differs from the plain one."""

DIRS = {
    "iterative grpo": "iterative",
    "iterative grpo, mean-only + explore": "iterative-mean-only+explore",
    "iterative grpo, format check": "iterative-formatcheck",
    "iterative grpo, format check + std floor": "iterative-formatcheck+stdfloor",
    "iterative grpo, format check + std floor, Q from policy": "iterative-qpolicy",
    ONLINE: "online",
    "persona-aware: iterative grpo, format check": "persona-iterative-formatcheck",
    "persona-aware: iterative grpo, format check + persona explore": "persona-iterative-explore",
    PERSONA_ONLINE: "persona-online",
}
"""Run directory of each method under ``<out>/<setting>/``."""


def method_dir(out: Path, setting: str, method: str, seed: int) -> Path:
    return out / setting / DIRS[method] / f"seed{seed}"


def warm_start_dir(out: Path, setting: str, method: str, seed: int) -> Path:
    """The warm start a method shares: plain methods use the paper arm's, persona-aware
    methods the first persona-aware arm's."""
    source = "iterative grpo"
    if method.startswith("persona-aware"):
        source = "persona-aware: iterative grpo, format check"
    return method_dir(out, setting, source, seed) / "warm_start"


FAMILIES = {
    "from the weak warm start": (
        "iterative grpo",
        "iterative grpo, format check",
        "iterative grpo, format check + std floor",
        ONLINE,
    ),
    "from the persona-aware warm start": (
        "persona-aware: iterative grpo, format check",
        "persona-aware: iterative grpo, format check + persona explore",
        PERSONA_ONLINE,
    ),
}
"""The write-up's figure: one panel per warm start (the other methods are in the reports)."""


def plot_methods(setting: str, compare: dict[str, list[Path]]) -> Path:
    """``docs/img/iterative-<setting>.png``: greedy eval value against deployed
    conversations, mean ± std over seeds, one panel per warm start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    for ax, (family, methods) in zip(axes, FAMILIES.items(), strict=True):
        for index, method in enumerate(m for m in methods if m in compare):
            runs = [[p for p in rows(d) if "eval_return" in p] for d in compare[method]]
            n = min(len(r) for r in runs)
            x = np.array([p["step"] for p in runs[0][:n]])
            y = np.array([[p["eval_return"] for p in r[:n]] for r in runs])
            color, style = f"C{index}", "--" if "online" in method else "-"
            label = f"{method.removeprefix('persona-aware: ')} ({len(runs)} seeds)"
            ax.plot(x, y.mean(0), style, color=color, lw=2, marker="o", label=label)
            ax.fill_between(x, y.mean(0) - y.std(0), y.mean(0) + y.std(0), color=color, alpha=0.1)
        ax.set_title(family)
        ax.set_xlabel("deployed conversations")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1)
    axes[0].set_ylabel("greedy eval value, 64 held-out personas")
    fig.suptitle(f"{setting}: Iterative GRPO vs online GRPO (mean ± std over seeds)")
    fig.tight_layout()
    path = ROOT / "docs" / "img" / f"iterative-{setting}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", default=["split_money", "haggle"])
    parser.add_argument(
        "--methods",
        nargs="+",
        default=[*VARIANTS, ONLINE, PERSONA_ONLINE],
        choices=[*VARIANTS, ONLINE, PERSONA_ONLINE],
        help="which methods to train (all found under --out are summarised)",
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=128, help="per iteration")
    parser.add_argument("--lr", type=float, default=3e-4, help="policy lr (both methods)")
    parser.add_argument("--out", default=str(ROOT / "runs" / "iterative_grpo"))
    parser.add_argument("--quick", action="store_true", help="1 seed, tiny budgets (smoke run)")
    parser.add_argument(
        "--summarise", action="store_true", help="only rebuild tables and reports from --out"
    )
    args = parser.parse_args()
    out = Path(args.out)
    seeds = 1 if args.quick else args.seeds
    conversations = 32 if args.quick else args.conversations
    iterations = 2 if args.quick else args.iterations
    if conversations % BLOCK:
        raise SystemExit(f"--conversations must be a multiple of {BLOCK}")
    common = [
        f"iterations={iterations}",
        f"deploy.tasks_per_iteration={conversations // 4}",
        "deploy.conversations_per_task=4",
        f"improve.lr={args.lr}",
    ]
    if args.quick:
        common += ["warm_start.steps=10", "q.steps=5", "improve.steps=2", "env.n_eval_tasks=8"]
    per_block = conversations // BLOCK
    from turnrl.report import write_report

    summary: list[str] = ["# Iterative GRPO experiment", ""]
    methods = [*VARIANTS, ONLINE, PERSONA_ONLINE]
    for setting in args.settings:
        for seed in range(seeds if not args.summarise else 0):
            for method in [m for m in methods if m in args.methods]:
                started = time.perf_counter()
                run_dir = method_dir(out, setting, method, seed)
                warm = warm_start_dir(out, setting, method, seed)
                if method in (ONLINE, PERSONA_ONLINE):
                    if not warm.exists():
                        raise SystemExit(f"{method} needs the warm start {warm}: run it first")
                    steps = iterations * per_block
                    run_online(setting, seed, run_dir, warm, steps, per_block, args.lr, method)
                else:
                    # Variants start from the same warm-started weights when they exist.
                    # (not the arm that trains it: a rerun of that arm trains it again)
                    shared = (
                        [f"warm_start.init_from={warm}"]
                        if warm.exists() and not warm.is_relative_to(run_dir)
                        else []
                    )
                    if method.startswith("persona-aware"):
                        shared += PERSONA_WARM
                    run_iterative(
                        setting,
                        seed,
                        run_dir,
                        [*common, *VARIANTS[method], *shared, f"label={method}"],
                    )
                print(
                    f"{setting} seed {seed} {method}: {time.perf_counter() - started:.0f}s",
                    flush=True,
                )
        compare: dict[str, list[Path]] = {}
        iterative_runs: dict[str, list[Path]] = {}
        for method in methods:
            for seed in range(seeds):
                run_dir = method_dir(out, setting, method, seed)
                if not (run_dir / "metrics.jsonl").exists():
                    continue
                tag = DIRS[method]
                online = method in (ONLINE, PERSONA_ONLINE)
                points = online_points(run_dir, per_block) if online else iterative_points(run_dir)
                compare.setdefault(method, []).append(
                    write_compare(out / setting / "compare" / f"{tag}-seed{seed}", method, points)
                )
                if not online:
                    iterative_runs.setdefault(method, []).append(run_dir)
        if not compare:
            continue
        dirs = [d for ds in compare.values() for d in ds]
        write_report(
            dirs, out / f"report-{setting}.html", title=f"{setting}: per deployed conversations"
        )
        runs = [d for ds in iterative_runs.values() for d in ds]
        write_report(runs, out / f"report-{setting}-q.html", title=f"{setting}: Q and improvement")
        plot_methods(setting, compare)
        summary += [*final_table(setting, compare, seeds), ""]
        summary += [*method_table(setting, compare, seeds), ""]
        for method, method_runs in iterative_runs.items():
            summary += [*q_table(f"{setting}, {method}", method_runs), ""]
        (out / "summary.md").write_text("\n".join(summary) + "\n")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
