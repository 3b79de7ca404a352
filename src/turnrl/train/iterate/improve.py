"""Iterative GRPO's improvement step: single-turn GRPO against Q on logged states.

:func:`improve_policy` samples candidates for logged states
(:class:`LoggedState`), scores them with the fitted Q, normalises within each
state (the ``q`` estimator) and takes PPO-clip steps. It takes no environment,
and runs inside :func:`forbid_env_calls`, which makes every ``Env`` method raise
(:class:`EnvCallError`): the improvement must not talk to an environment or
counterpart. See :mod:`turnrl.train.iterate.loop` for the whole iteration.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from turnrl.credit import compute_credit
from turnrl.policy.trainable import TrainablePolicy
from turnrl.table import TurnTable
from turnrl.train.iterate.config import ImproveConfig
from turnrl.train.run import (
    derive_seed,
)
from turnrl.train.update.ppo import build_update_batch, ppo_update
from turnrl.types import Env, Sample, TurnRecord

Scorer = Callable[[list[list[int]], list[list[int]]], np.ndarray]
"""Scores candidate responses: ``(contexts, responses) -> Q per row``."""

FormatCheck = Callable[["LoggedState", str], "str | None"]
"""Why a candidate's text is no well-formed action in a logged state (``None``: it is)."""

# --------------------------------------------------------------------------- the no-env guard


class EnvCallError(RuntimeError):
    """An environment was called where none may be (Iterative GRPO's improvement step)."""


def _env_classes() -> list[type]:
    seen: list[type] = []
    stack: list[type] = [Env]
    while stack:
        cls = stack.pop()
        if cls not in seen:
            seen.append(cls)
            stack.extend(cls.__subclasses__())
    return seen


_ENV_METHODS = ("reset", "step", "step_truncated", "snapshot", "restore")


@contextlib.contextmanager
def forbid_env_calls(reason: str = "the improvement step") -> Iterator[None]:
    """Make ``reset``/``step``/``step_truncated``/``snapshot``/``restore`` of every ``Env``
    class raise.

    Patches every class that defines one of those methods (``Env`` and all its
    subclasses known when the guard starts) and restores them on exit, also
    when the body raises. Process-wide while active: use it in single-threaded
    training code, not in a server.
    """

    def refuse(cls: type, name: str) -> Callable[..., Any]:
        def refused(self: Any, *args: Any, **kwargs: Any) -> Any:
            raise EnvCallError(
                f"{cls.__name__}.{name}() was called during {reason}; Iterative GRPO's "
                "improvement must not talk to an environment or counterpart"
            )

        return refused

    patched: list[tuple[type, str, Any]] = []
    try:
        for cls in _env_classes():
            for name in _ENV_METHODS:
                if name in vars(cls):
                    patched.append((cls, name, vars(cls)[name]))
                    setattr(cls, name, refuse(cls, name))
        yield
    finally:
        for cls, name, original in reversed(patched):
            setattr(cls, name, original)


# --------------------------------------------------------------------------- improve


@dataclass(frozen=True)
class LoggedState:
    """A decision point from the logs: its task and the exact context the policy saw."""

    task_id: str
    prompt_ids: list[int]


def logged_states(records: Sequence[TurnRecord]) -> list[LoggedState]:
    """One state per logged turn (duplicates kept: they weigh as often as visited)."""
    return [LoggedState(r.task_id, list(r.prompt_ids or ())) for r in records]


PROBE_STATES = 32
"""Logged states on which the policy's mean Q is measured before and after improving."""


def trainable(policy: TrainablePolicy) -> list[torch.nn.Parameter]:
    """The parameters an optimiser should update (all, or only adapters if frozen)."""
    return [p for p in policy.parameters() if p.requires_grad]


def improve_policy(
    policy: TrainablePolicy,
    optimizer: torch.optim.Optimizer,
    score: Scorer,
    states: Sequence[LoggedState],
    cfg: ImproveConfig,
    *,
    max_new_tokens: int,
    reference: TrainablePolicy | None,
    seed: int,
    check: FormatCheck | None = None,
    malformed_score: float = 0.0,
    update: Callable[..., dict[str, float]] = ppo_update,
) -> dict[str, float]:
    """Single-turn GRPO on logged states with ``score`` (Q) as the reward model.

    ``check`` (optional) rejects candidates that are no well-formed action: they
    are scored ``malformed_score`` instead of by Q. Q is fitted only on what the
    deployed policy did, so it has no data on, and often over-rates, malformed
    near-copies of good moves; a policy optimised against Q learns them (see
    ``docs/iterative-grpo.md``). The check is a pure syntax check
    (:class:`turnrl.types.ResponseChecks`), not an environment call.

    Takes no environment: everything it needs is the logged contexts. The whole
    step runs inside :func:`forbid_env_calls`, so a scorer or sampler that
    reached for an environment would raise :class:`EnvCallError`.

    Returns means over the steps of the PPO statistics (``improve_*``), plus, on
    a fixed probe set of logged states (up to ``PROBE_STATES``, ``candidates``
    responses each, same sampling seed) before and after the improvement: the
    mean raw Q (``improve_q_before``/``improve_q_after``: the improvement as Q
    sees it) and, with a ``check``, the mean score the improvement optimises
    (``improve_score_before``/``_after``, rejected responses at
    ``malformed_score``) and the share rejected (``improve_probe_malformed_before``
    /``_after``). Also the mean within-state std of the candidates' scores
    (``improve_q_spread``: how much they differ; the ``q`` estimator divides by
    it, or by ``cfg.std_floor`` if larger) and the share of candidates ``check``
    rejected (``improve_malformed``).

    ``update`` runs each PPO update (``ppo_update``'s signature; over torchrun ranks,
    :meth:`turnrl.train.rank_zero.Leader.update` spreads it).
    """
    if not states:
        raise ValueError("no logged states to improve on")
    rng = np.random.default_rng(seed)
    stats: list[dict[str, float]] = []
    q_spreads: list[float] = []
    rejected: list[float] = []
    probe = [
        states[i]
        for i in rng.choice(len(states), min(PROBE_STATES, len(states)), replace=False)
        for _ in range(cfg.candidates)
    ]

    def judge(
        chosen: Sequence[LoggedState], samples: Sequence[Sample]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raw Q, the scores optimised (rejected -> ``malformed_score``), the rejections."""
        contexts = [state.prompt_ids for state in chosen]
        q_values = np.asarray(
            score(contexts, [list(s.response_ids) for s in samples]), dtype=np.float64
        )
        bad = np.zeros(len(samples), dtype=bool)
        if check is not None:
            bad = np.array(
                [check(st, s.text) is not None for st, s in zip(chosen, samples, strict=True)]
            )
        return q_values, np.where(bad, malformed_score, q_values), bad

    def probe_scores() -> dict[str, float]:
        policy.model.eval()
        samples = policy.sample(
            [state.prompt_ids for state in probe],
            max_new_tokens=max_new_tokens,
            temperature=cfg.temperature,
            seed=derive_seed(seed, "improve_probe"),
        )
        q_values, scores, bad = judge(probe, samples)
        out = {"q": float(np.mean(q_values))}
        if check is not None:
            out.update(score=float(np.mean(scores)), probe_malformed=float(np.mean(bad)))
        return out

    with forbid_env_calls("Iterative GRPO's improvement step"):
        before = probe_scores()
        for step in range(cfg.steps):
            picks = rng.choice(len(states), min(cfg.states_per_step, len(states)), replace=False)
            chosen = [states[i] for i in picks for _ in range(cfg.candidates)]
            contexts = [s.prompt_ids for s in chosen]
            policy.model.eval()
            samples = policy.sample(
                contexts,
                max_new_tokens=max_new_tokens,
                temperature=cfg.temperature,
                seed=derive_seed(seed, "improve_sample", step),
            )
            responses = [list(s.response_ids) for s in samples]
            _, q_values, bad = judge(chosen, samples)
            if check is not None:
                rejected.append(float(bad.mean()))
            q_spreads.append(float(q_values.reshape(-1, cfg.candidates).std(axis=1).mean()))
            records = [
                TurnRecord(
                    task_id=state.task_id,
                    traj_id=f"cand{step}-{k}",
                    turn=0,
                    prompt_ids=tuple(state.prompt_ids),
                    response_ids=tuple(response),
                    logprobs=tuple(float(x) for x in sample.logprobs),
                    q=float(value),
                )
                for k, (state, response, sample, value) in enumerate(
                    zip(chosen, responses, samples, q_values, strict=True)
                )
            ]
            table = TurnTable.from_records(records, source=f"improvement step {step}")
            credit = compute_credit(table, "q", use_std=cfg.use_std, std_floor=cfg.std_floor)
            batch = build_update_batch(records, table, credit.advantages, None, cfg.aggregation)
            stats.append(
                update(
                    policy,
                    optimizer,
                    batch,
                    cfg,
                    temperature=cfg.temperature,
                    reference=reference,
                    seed=derive_seed(seed, "update", step),
                )
            )
        after = probe_scores()
    out = {f"improve_{k}": float(np.mean([s[k] for s in stats])) for k in stats[0]}
    for name in before:
        out[f"improve_{name}_before"] = before[name]
        out[f"improve_{name}_after"] = after[name]
    out["improve_q_spread"] = float(np.mean(q_spreads))
    out["improve_states"] = float(len(states))
    if rejected:
        out["improve_malformed"] = float(np.mean(rejected))
    return out
