"""The agent loop refuses a rollout when *any* of its turns was sampled at another
temperature than the update recomputes log-probs at, not only when all were."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import agent_rollout
from turnrl.train.agent.loop import refuse_untrainable
from turnrl.train.agent.runner import RolloutResult


def _rollout(name: str, temperatures: list[float]) -> RolloutResult:
    """A rollout of one policy version whose turn ``k`` was sampled at ``temperatures[k]``."""
    return agent_rollout(name, [2] * len(temperatures), temperatures)


def test_one_turn_at_another_temperature_refuses_the_whole_rollout() -> None:
    results = [
        _rollout("cool", [1.0, 1.0, 1.0]),
        _rollout("last", [1.0, 1.0, 0.7]),
        _rollout("first", [0.7, 1.0]),
    ]
    refuse_untrainable(results, temperature=1.0)
    cool, last, first = results
    assert cool.failure is None and len(cool.records) == 3
    for refused in (last, first):
        assert refused.records == []
        assert refused.failure is not None
        assert refused.failure.reason == (
            "the agent asked for temperature [0.7, 1.0], but training samples at "
            "policy.temperature=1.0 (drop the agent's temperature argument)"
        )


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from([0.5, 1.0]), min_size=1, max_size=6))
def test_a_rollout_is_kept_exactly_when_every_turn_is_at_the_training_temperature(
    temperatures: list[float],
) -> None:
    (result,) = results = [_rollout("r", temperatures)]
    refuse_untrainable(results, temperature=1.0)
    kept = all(t == 1.0 for t in temperatures)
    assert (result.failure is None) == kept
    assert len(result.records) == (len(temperatures) if kept else 0)
