"""Named random streams of a run: every stream derives from the config's seed by name,
so no two trainers invent their own arithmetic (same seed, same numbers)."""

from __future__ import annotations

SEED_STREAMS: dict[str, tuple[int, int]] = {
    "rollout": (1_000_003, 0),
    "update": (100_003, 0),
    "eval_tasks": (1, 7919),
    "deploy_arm": (31, 0),
    "q_fit": (1009, 0),
    "improve": (1_000_033, 0),
    "improve_sample": (7919, 0),
    "improve_probe": (1, -1),
}
"""Random streams of a run: ``name -> (multiplier, offset)``; see :func:`derive_seed`.

``rollout``: a training step's sampling (index: the step or iteration); ``update``:
the mini-batch order of an update (index: the step); ``eval_tasks``: the held-out
task set (from ``env.seed``); ``deploy_arm``: one (temperature, persona) arm of an
Iterative GRPO deployment; ``q_fit``: Q's initialisation and split; ``improve``:
an improvement step's task draws, ``improve_sample`` its candidate sampling and
``improve_probe`` its probe set. A new stream is a new entry here, whose
``(multiplier, offset)`` no other stream has."""


def derive_seed(base: int, stream: str, index: int = 0) -> int:
    """The seed of ``stream`` at ``index`` (a step, an iteration, an arm) for a run
    seeded ``base``: ``base * multiplier + offset + index``.

    Multipliers are distinct primes (or small constants kept from the first
    trainers, so their numbers never changed), which keeps streams of one run apart
    for any realistic number of steps.
    """
    try:
        multiplier, offset = SEED_STREAMS[stream]
    except KeyError:
        raise ValueError(
            f"unknown seed stream {stream!r}; known: {', '.join(sorted(SEED_STREAMS))}"
        ) from None
    return base * multiplier + offset + index
