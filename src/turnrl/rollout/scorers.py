"""Process scorers: how promising is a partial trajectory? (PATR's budget allocator)

A scorer maps branches (episode state plus the records of their path) to one
float each, higher is better. PATR only uses the scores to decide which
branches to expand, keep or prune; they never enter the advantages.

Built in, by name (``rollout.params.scorer``):

* ``heuristic``: the environment's own progress signal plus the reward so far.
  FrozenLake: minus the Manhattan distance to the goal, plus accumulated
  reward. Calculator: accumulated reward, +0.5 once a tool result is in the
  context, -0.5 per malformed turn. Lookup: the share of the gold chain's facts
  retrieved so far, plus reward, -0.5 per malformed turn. Other environments:
  accumulated reward minus 0.5 per malformed turn. Add more with
  :func:`register_heuristic`.
* ``judge``: the policy as judge, cheaply: the mean log-prob of the tokens it
  sampled on the path so far (recorded at sampling, no extra forward pass).
* a learned value model: :class:`ValueScorer` wraps any
  ``value_fn(contexts) -> scores`` over token-id contexts; make one available
  by name with :func:`register_scorer`, or name a factory as
  ``"package.module:factory"`` (imported, never evaluated).
* a blend: a table ``{heuristic = 1.0, judge = 0.1}`` sums weighted scores.

Departure from PATR (arXiv 2607.15610): its scorers include a process reward
model and an LLM judge reading the serialised partial trajectory; the ``judge``
here is the policy's own confidence, which costs nothing but knows nothing the
policy does not.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from turnrl.envs import CalculatorEnv, FrozenLakeEnv, LookupEnv
from turnrl.rollout.tree import Branch
from turnrl.types import Env, Policy, state_key_of


class Scorer(Protocol):
    def __call__(self, branches: Sequence[Branch], policy: Policy) -> list[float]: ...


# ----------------------------------------------------------------- heuristics

_HEURISTICS: dict[type, Callable[[Branch], float]] = {}


def register_heuristic(env_type: type[Env]) -> Callable[[Callable[[Branch], float]], Any]:
    """Decorator: the ``heuristic`` score of branches whose environment is an ``env_type``."""

    def decorate(fn: Callable[[Branch], float]) -> Callable[[Branch], float]:
        _HEURISTICS[env_type] = fn
        return fn

    return decorate


def _malformed_penalty(branch: Branch) -> float:
    return 0.5 * branch.episode.malformed


@register_heuristic(FrozenLakeEnv)
def frozenlake_progress(branch: Branch) -> float:
    """Minus the Manhattan distance from the agent to the goal, plus reward so far.

    A finished episode that missed the goal (a hole, or out of turns) scores
    below any live one: ``-2 * size``.
    """
    rows = tuple(branch.episode.task.payload["map"])
    size = len(rows[0])
    if branch.episode.done and not branch.episode.correct:
        return -2.0 * size + branch.episode.outcome
    key = state_key_of(branch.episode.env) or ""
    position = int(key.rsplit(":", 1)[1])  # FrozenLakeEnv's key is "<task_id>:<cell>"
    goal = "".join(rows).index("G")
    (r, c), (gr, gc) = divmod(position, size), divmod(goal, size)
    return -float(abs(r - gr) + abs(c - gc)) + branch.episode.outcome


@register_heuristic(CalculatorEnv)
def calculator_progress(branch: Branch) -> float:
    """Reward so far, +0.5 when a tool result is in the context, -0.5 per malformed turn."""
    has_result = any(r.tool_call and not r.malformed for r in branch.records)
    return branch.episode.outcome + 0.5 * has_result - _malformed_penalty(branch)


@register_heuristic(LookupEnv)
def lookup_progress(branch: Branch) -> float:
    """Share of the gold chain's facts retrieved so far, plus reward so far, -0.5 per
    malformed turn. A finished episode with a wrong answer scores -1 (below any live one)."""
    env = branch.episode.env
    assert isinstance(env, LookupEnv)
    if branch.episode.done and not branch.episode.correct:
        return -1.0 + branch.episode.outcome
    progress = env.gold_found() / env.hops
    return progress + branch.episode.outcome - _malformed_penalty(branch)


def heuristic(branches: Sequence[Branch], policy: Policy) -> list[float]:
    """The registered heuristic of each branch's environment type (see the module doc)."""
    scores = []
    for b in branches:
        fn = next((f for t, f in _HEURISTICS.items() if isinstance(b.episode.env, t)), None)
        scores.append(fn(b) if fn else b.episode.outcome - _malformed_penalty(b))
    return scores


def judge(branches: Sequence[Branch], policy: Policy) -> list[float]:
    """Mean behaviour log-prob of the branch's sampled tokens (0 before any turn)."""
    out = []
    for b in branches:
        logprobs = [x for r in b.records for x in r.logprobs or ()]
        out.append(float(np.mean(logprobs)) if logprobs else 0.0)
    return out


class ValueScorer:
    """A learned value model as a scorer: ``value_fn(contexts) -> one value per context``,
    called once per scoring round with every branch's current token context."""

    def __init__(self, value_fn: Callable[[list[list[int]]], Sequence[float]]) -> None:
        self.value_fn = value_fn

    def __call__(self, branches: Sequence[Branch], policy: Policy) -> list[float]:
        values = list(self.value_fn([list(b.episode.context) for b in branches]))
        if len(values) != len(branches):
            raise ValueError(f"value model returned {len(values)} scores for {len(branches)}")
        return [float(v) for v in values]


# ------------------------------------------------------------------- registry

_SCORERS: dict[str, Callable[[], Scorer]] = {
    "heuristic": lambda: heuristic,
    "judge": lambda: judge,
}


def register_scorer(name: str, factory: Callable[[], Scorer]) -> None:
    """Make ``factory()`` available as ``scorer = name`` (e.g. a :class:`ValueScorer`)."""
    if name in _SCORERS:
        raise ValueError(f"scorer {name!r} is already registered")
    _SCORERS[name] = factory


class _Blend:
    def __init__(self, parts: list[tuple[float, Scorer]]) -> None:
        self.parts = parts

    def __call__(self, branches: Sequence[Branch], policy: Policy) -> list[float]:
        total = np.zeros(len(branches))
        for weight, scorer in self.parts:
            total += weight * np.asarray(scorer(branches, policy), dtype=float)
        return total.tolist()


def make_scorer(spec: str | dict[str, float]) -> Scorer:
    """A scorer from its config value: a registered name, ``"module:factory"``, or a
    ``{name: weight}`` table (weighted sum)."""
    if isinstance(spec, dict):
        if not spec:
            raise ValueError("scorer blend is empty")
        return _Blend([(float(w), make_scorer(name)) for name, w in spec.items()])
    if spec in _SCORERS:
        return _SCORERS[spec]()
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"scorer {spec!r}: cannot load {attr!r} from {module_name!r}") from err
        return factory()
    raise ValueError(
        f"unknown scorer {spec!r}; known: {', '.join(sorted(_SCORERS))}, "
        "a 'module:factory' path, or a {name = weight} table"
    )
