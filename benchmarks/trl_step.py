"""TRL's GRPOTrainer step time on a turnrl calculator policy (child of benchmarks/update.py).

Runs in the TRL venv (``.venv-agl``): ``--steps`` + 1 steps of 8 prompts x 8
completions (``--prompts``/``--generations``), one optimiser step each, on CPU with one
torch thread; writes the mean CPU and wall seconds of a step (the first left out) to
``--out`` as JSON. ``--turns 1``: TRL's own generation on conversational prompts, the reward is the
calculator's on the completion. ``--turns 4``: multi-turn episodes through
turnrl's adapter (``make_rollout_func``, ``TurnRLGRPOTrainer`` with ``grpo``).
TRL's defaults otherwise, gradient checkpointing included (TRL turns it on by
default); ``--no-checkpointing`` turns it off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from turnrl.envs import make_env, make_tasks
from turnrl.integrations.trl import (
    TurnRLGRPOTrainer,
    make_rollout_func,
    outcome_reward,
    task_dataset,
)
from turnrl.policy import load_tokenizer

PROMPTS, GENERATIONS, MAX_NEW_TOKENS = 8, 8, 24


class StepTimer(TrainerCallback):
    """CPU and wall seconds of every optimiser step (generation included)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._cpu, self._wall = time.process_time(), time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.append(
            {"cpu": time.process_time() - self._cpu, "wall": time.perf_counter() - self._wall}
        )


def single_turn_dataset(tasks: list[Any], env_kwargs: dict[str, Any]) -> Any:
    from datasets import Dataset

    env = make_env("calculator", **env_kwargs)
    return Dataset.from_dict(
        {"prompt": [env.reset(t) for t in tasks], "task_id": [t.task_id for t in tasks]}
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", required=True, help="a saved turnrl policy directory")
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--prompts", type=int, default=PROMPTS, help="prompts per step")
    parser.add_argument("--generations", type=int, default=GENERATIONS, help="per prompt")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(args.policy)
    model = AutoModelForCausalLM.from_pretrained(args.policy)
    env_kwargs = {"max_turns": args.turns, "turn_cost": 0.0}
    tasks = make_tasks("calculator", 1024, 0, hard_fraction=0.5)
    by_id = {t.task_id: t for t in tasks}
    config = GRPOConfig(
        output_dir=str(Path(args.work) / "out"),
        use_cpu=True,
        per_device_train_batch_size=args.prompts * args.generations,
        num_generations=args.generations,
        max_completion_length=MAX_NEW_TOKENS if args.turns == 1 else 512,
        temperature=1.0,
        max_steps=args.steps + 1,
        learning_rate=1e-3,
        beta=0.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
        gradient_checkpointing=not args.no_checkpointing,
    )
    timer = StepTimer()
    if args.turns == 1:

        def calculator_reward(completions: list[Any], task_id: list[str], **_: Any) -> list[float]:
            rewards = []
            for completion, task in zip(completions, task_id, strict=True):
                env = make_env("calculator", **env_kwargs)
                env.reset(by_id[task])
                text = completion[-1]["content"] if isinstance(completion, list) else completion
                rewards.append(float(env.step(text).reward))
            return rewards

        trainer: GRPOTrainer = GRPOTrainer(
            model=model,
            args=config,
            processing_class=tokenizer,
            reward_funcs=[calculator_reward],
            train_dataset=single_turn_dataset(tasks, env_kwargs),
            callbacks=[timer],
        )
    else:
        trainer = TurnRLGRPOTrainer(
            model=model,
            args=config,
            processing_class=tokenizer,
            reward_funcs=[outcome_reward],
            train_dataset=task_dataset(tasks),
            rollout_func=make_rollout_func(
                lambda: make_env("calculator", **env_kwargs),
                tasks,
                max_new_tokens=MAX_NEW_TOKENS,
                max_turns=args.turns,
            ),
            turnrl_estimator="grpo",
            callbacks=[timer],
        )
    trainer.train()
    steps = timer.steps[1:]
    Path(args.out).write_text(
        json.dumps({k: statistics.mean(s[k] for s in steps) for k in ("cpu", "wall")})
    )


if __name__ == "__main__":
    main()
