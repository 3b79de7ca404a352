"""TRL's GRPOTrainer on benchmarks/memory.py's trajectory: one update, in this process.

The ``trl`` arm of ``benchmarks/memory.py``, which runs this file with the TRL venv's
Python (``.venv-agl``) and reads this process's peak resident memory from ``wait4``.
The rows are memory.py's: the four turns of one synthetic trajectory, turn ``k`` a row
whose prompt is everything before its response (``trajectory``), which is how TRL
trains a multi-turn episode (one prompt and completion per turn, as turnrl's TRL
adapter gives it). The model is the same SmolLM2-135M-Instruct with the same LoRA
(rank 16, alpha 32, every projection), through TRL's ``peft_config``.

TRL's defaults otherwise (``GRPOConfig``: gradient checkpointing on, ``bf16`` autocast,
loss ``dapo``, ``beta = 0``: no reference model); ``--no-checkpointing`` and ``--fp32``
turn those two off. The update is what ``Trainer.train`` runs for one optimiser step
once the completions exist, without generating them: the model prepared as ``train``
prepares it (gradient checkpointing enabled), ``compute_loss`` inside TRL's autocast
context, ``accelerator.backward``, one AdamW step (``create_optimizer``). The inputs
are what TRL's generation step hands ``compute_loss``: left-padded prompts, the
completions, their masks, one advantage per row and the token count.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from datasets import Dataset
from memory import RESPONSE, TURNS, resident_mib, trajectory
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from turnrl.policy.lora import DEFAULT_TARGETS

LORA_RANK, LORA_ALPHA = 16, 32.0
"""examples/calculator_smollm2.toml's adapters."""


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` left-padded to the longest with ``pad``, and their attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return ids, mask


def update(model_dir: str, tokens: int, *, checkpointing: bool, bf16: bool) -> dict:
    """One TRL update of the ``tokens``-position trajectory (module docstring)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.config.max_position_embeddings = max(tokens, 8192)  # as memory.py's child
    with tempfile.TemporaryDirectory(prefix="trl-memory-") as work:
        config = GRPOConfig(
            output_dir=work,
            use_cpu=True,
            per_device_train_batch_size=TURNS,
            num_generations=TURNS,
            max_completion_length=RESPONSE,
            report_to="none",
            save_strategy="no",
            seed=0,
            gradient_checkpointing=checkpointing,
            bf16=bf16,
        )
        trainer = GRPOTrainer(
            model=model,
            args=config,
            processing_class=tokenizer,
            reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
            train_dataset=Dataset.from_dict({"prompt": ["unused"] * TURNS}),
            peft_config=LoraConfig(
                r=LORA_RANK,
                lora_alpha=LORA_ALPHA,
                target_modules=list(DEFAULT_TARGETS),
                task_type="CAUSAL_LM",
            ),
        )
        model = trainer.model
        if checkpointing:  # what Trainer.train does before its first step
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs=config.gradient_checkpointing_kwargs
            )
        model.train()
        trainer.current_gradient_accumulation_steps = 1  # set per step by Trainer.train
        optimizer = trainer.create_optimizer()
        contexts, responses = trajectory(tokens, model.config.vocab_size)
        prompt_ids, prompt_mask = left_padded(contexts, tokenizer.pad_token_id or 0)
        completion_ids = torch.tensor(responses)
        completion_mask = torch.ones_like(completion_ids)
        inputs = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
            "num_items_in_batch": completion_mask.sum(),
        }
        before = resident_mib()
        cpu, wall = time.process_time(), time.perf_counter()
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(model, inputs)
        trainer.accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return {
            "before_mib": before,
            "wall_s": time.perf_counter() - wall,
            "cpu_s": time.process_time() - cpu,
            "tokens_computed": float(prompt_ids.numel() + completion_ids.numel()),
            "loss": float(loss),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="SmolLM2's transformers directory")
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--arm", default="trl", help="the arm's name in the results")
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--fp32", action="store_true", help="bf16=False (no autocast)")
    args = parser.parse_args()
    result = update(
        args.model, args.tokens, checkpointing=not args.no_checkpointing, bf16=not args.fp32
    )
    Path(args.out).write_text(json.dumps({"arm": args.arm, "tokens": args.tokens, **result}))


if __name__ == "__main__":
    main()
