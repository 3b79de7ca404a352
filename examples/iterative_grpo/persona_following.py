"""Does a persona-aware warm start follow its exploration persona?

For each seed's persona-aware warm start (written by ``run.py``, or with
``--warm-starts`` by the ``iterative-persona`` study), the mean value on
the 64 held-out personas of the experiment, with and without the instruction,
greedy and at temperature 1 (4 conversations per persona); then the value of the
scripted demonstration styles themselves on the same personas (no model):

    python examples/iterative_grpo/persona_following.py haggle split_money
    python examples/iterative_grpo/persona_following.py haggle split_money \\
        --warm-starts runs/studies/iterative-persona/warm
    python examples/iterative_grpo/persona_following.py haggle split_money --styles-only
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import numpy as np
import torch

from turnrl.envs import make_env, make_tasks
from turnrl.envs.negotiation import STYLES, play
from turnrl.policy import HFPolicy
from turnrl.rollout import run_episodes
from turnrl.train.iterate.explore import persona_env_factory

ROOT = Path(__file__).resolve().parents[2]
PERSONA = "Negotiate hard."
EVAL_SEED = 7919
"""``env.seed + 7919`` with the recipes' ``env.seed = 0``: the experiment's held-out tasks."""


def mean_value(policy: HFPolicy, setting: str, instruction: str, temperature: float) -> float:
    tasks = make_tasks(setting, 64, EVAL_SEED)
    batch = run_episodes(
        policy,
        persona_env_factory(lambda: make_env(setting, max_turns=6), instruction),
        tasks,
        group_size=1 if temperature == 0 else 4,
        max_new_tokens=24,
        temperature=temperature,
        seed=0,
    )
    return float(np.mean([e.outcome for e in batch.episodes]))


def style_value(setting: str, style: str) -> float:
    """Mean value of the scripted ``style`` agent on the held-out personas."""
    agent = importlib.import_module(f"turnrl.envs.negotiation.{setting}").agent
    values = []
    for task in make_tasks(setting, 64, EVAL_SEED):
        _, last = play(make_env(setting, max_turns=6), task, agent(task, 6, style))
        values.append(last.reward)
    return float(np.mean(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("settings", nargs="+")
    parser.add_argument("--out", default=str(ROOT / "runs" / "iterative_grpo"))
    parser.add_argument(
        "--warm-starts",
        help="a study's warm starts, DIR/<setting>/ws<seed>/warm_start, instead of run.py's",
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--styles-only", action="store_true", help="only the scripted styles")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| setting | " + " | ".join(f"scripted {style}" for style in STYLES) + " |")
    print("|---|" + "---|" * len(STYLES))
    for setting in args.settings:
        cells = [f"{style_value(setting, style):.3f}" for style in STYLES]
        print(f"| {setting} | " + " | ".join(cells) + " |", flush=True)
    if args.styles_only:
        return
    print()
    print("| setting | seed | plain, greedy | plain, T=1 | persona, greedy | persona, T=1 |")
    print("|---|---|---|---|---|---|")
    for setting in args.settings:
        for seed in range(args.seeds):
            if args.warm_starts:
                warm = Path(args.warm_starts) / setting / f"ws{seed}"
            else:
                warm = Path(args.out) / setting / "persona-iterative-formatcheck" / f"seed{seed}"
            policy = HFPolicy.from_pretrained(warm / "warm_start")
            cells = [
                f"{mean_value(policy, setting, instruction, temperature):.3f}"
                for instruction in ("", PERSONA)
                for temperature in (0.0, 1.0)
            ]
            print(f"| {setting} | {seed} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
