"""The measurements: commands that write doc tables but are not ``turnrl train``
matrices (a gradient measurement, a benchmark), each with its command and time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Measurement:
    """A command that writes doc tables but is not a matrix of training runs (a gradient
    measurement, a benchmark): its tables' markers name it, and it says how to rerun."""

    name: str
    command: str
    doc: str
    tables: tuple[str, ...]
    minutes: float


def _openings(name: str, teacher: str, runs: str) -> Measurement:
    """examples/agents/call_credit.py's table of the rollouts RL trained on (``runs``, a
    glob of run directories) split by opening and by the warm start's ``teacher`` file."""
    return Measurement(
        name,
        f"python examples/agents/call_credit.py --teacher {teacher} {runs}",
        "docs/grouping-experiment.md",
        ("openings",),
        0.5,
    )


MEASUREMENTS: dict[str, Measurement] = {
    m.name: m
    for m in (
        Measurement(
            "grouping-gradient",
            "python examples/grouping/gradient.py --batches 110",
            "docs/grouping-experiment.md",
            ("warm-start", "projection", "contrasts"),
            60.0,
        ),
        Measurement(
            "grouping-adam",
            "python examples/grouping/adam.py --chains 24 --updates 3",
            "docs/grouping-experiment.md",
            ("updates",),
            10.0,
        ),
        Measurement(
            "tree-rollouts-resources",
            "python examples/tree/run.py --summarise --out runs/studies/tree-rollouts/LR",
            "docs/tree-rollouts.md",
            ("lr3e-4", "lr1e-3"),
            0.5,
        ),
        Measurement(
            "bench-tree-tokens",
            "python benchmarks/tree_tokens.py --warm-start 100 --write",
            "docs/tree-rollouts.md",
            ("tokens",),
            10.0,
        ),
        Measurement(
            "bench-update",
            "python benchmarks/update.py --write",
            "docs/tree-training.md",
            ("update", "trl"),
            60.0,
        ),
        Measurement(
            "bench-memory",
            "make bench-memory ARGS=--quick",
            "docs/memory.md",
            ("update",),
            60.0,
        ),
        Measurement(
            "bench-tree-attention",
            "python benchmarks/tree_attention.py --only calculator,frozenlake,patr --steps 1 "
            "--budgets 1024,2048,1000000 --write",
            "docs/tree-training.md",
            ("attention",),
            10.0,
        ),
        Measurement(
            "smol-long",
            "turnrl train --config examples/calculator_smollm2.toml --run-dir runs/smol-long "
            "--overwrite train.steps=36 train.eval_every=12 train.checkpoint_every=12 "
            "env.n_eval_tasks=32 train.threads=1",
            "docs/tree-training.md",
            ("heldout",),
            40.0,
        ),
        Measurement(
            "bench-agents",
            "python benchmarks/agents.py",
            "docs/agents.md",
            ("gateway",),
            5.0,
        ),
        _openings(
            "agents-calc-x-credit",
            "runs/studies/agents-calc-x-warm/recipe/seed0/rollouts/teacher.jsonl",
            "runs/studies/agents-calc-x-489/tool-pays/*/ws0-seed*",
        ),
        _openings(
            "agents-calc-x-held-out-credit",
            "runs/studies/agents-calc-x-warm/recipe/seed0/rollouts/teacher.jsonl",
            "runs/studies/agents-calc-x-held-out/tool-pays-held-out/*/ws0-seed*",
        ),
        _openings(
            "agents-smol-credit",
            "runs/studies/agents-smol-489/warm/ws0/rollouts/teacher.jsonl",
            "runs/studies/agents-smol-489/tool-pays/*/ws0-seed*",
        ),
        Measurement(
            "bench-sampling",
            "make bench-sampling",
            "docs/backends.md",
            ("throughput", "step", "agents"),
            60.0,
        ),
        Measurement(
            "bench-mismatch",
            ".venv/bin/python benchmarks/mismatch.py --backend hf; "
            ".venv-vllm/bin/python benchmarks/mismatch.py --backend vllm",
            "docs/backends.md",
            ("mismatch",),
            5.0,
        ),
        Measurement(
            "iterative-persona-following",
            "python examples/iterative_grpo/persona_following.py haggle split_money "
            "--warm-starts runs/studies/iterative-persona/warm",
            "docs/iterative-grpo.md",
            ("persona",),
            5.0,
        ),
    )
}
