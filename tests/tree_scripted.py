"""Test helpers for the tree-rollout tests: a scripted policy and a spying ``learn``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from builders import TokenizerPolicy
from turnrl.credit import compute_credit
from turnrl.rollout import StrategyContext
from turnrl.table import TurnTable
from turnrl.types import Sample, TurnRecord

Script = Callable[[str, int, int], str]
"""``script(context_text, call_number, row_in_call) -> response text``."""


class ScriptedPolicy(TokenizerPolicy):
    """The tiny tokenizer, but each response comes from ``script``; records every call."""

    def __init__(self, script: Script) -> None:
        super().__init__()
        self.script = script
        self.contexts: list[list[list[int]]] = []

    def sample(self, contexts, *, max_new_tokens, temperature=1.0, seed=None):
        call = len(self.contexts)
        self.contexts.append([list(c) for c in contexts])
        out = []
        for row, context in enumerate(contexts):
            text = self.script(self.decode(context), call, row)
            ids = [*self.tokens(text)[: max_new_tokens - 1], self.eos_token_id]
            out.append(Sample(ids, [-0.25] * len(ids), "stop", self.decode(ids)))
        return out


class SpyLearn:
    """A ``learn`` that computes credit with a real estimator and records every call."""

    def __init__(self, estimator: str = "grpo", after: Callable[[], None] | None = None, **params):
        self.estimator = estimator
        self.params = params
        self.after = after
        self.calls: list[list[TurnRecord]] = []
        self.advantage: dict[tuple[str, int], float] = {}
        """Advantage of each row credit was computed on, by ``(traj_id, turn)`` (last call)."""

    def __call__(self, records: list[TurnRecord]) -> dict[str, float]:
        table = TurnTable.from_records(records, source="spy")
        credit = compute_credit(table, self.estimator, **self.params)
        for record, advantage in zip(records, credit.advantages, strict=True):
            self.advantage[(record.traj_id, record.turn)] = float(advantage)
        self.calls.append(records)
        if self.after is not None:
            self.after()
        return {
            "rows": float(len(records)),
            "adv_abs_mean": float(np.abs(credit.advantages).mean()),
        }

    def trained(self, call: int) -> list[TurnRecord]:
        """Rows of one call that the trainer updates on (see :func:`is_trained`)."""
        return [r for r in self.calls[call] if is_trained(r)]

    def advantages(self, rows: list[TurnRecord]) -> list[float]:
        """The advantage credit gave each of ``rows``."""
        return [self.advantage[(r.traj_id, r.turn)] for r in rows]


def is_trained(record: TurnRecord) -> bool:
    """Whether the trainer updates on a row: response tokens and ``train`` not false."""
    return bool(record.response_ids) and record.train


def context(policy, make_env, learn, *, seed: int = 0, max_new_tokens: int = 24) -> StrategyContext:
    return StrategyContext(
        policy=policy,
        make_env=make_env,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        learn=learn,
        seed=seed,
        traj_prefix="s1-",
    )
