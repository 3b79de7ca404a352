"""A command agent cannot reach a sibling rollout through the machine (issue 38).

A command agent used to read a sibling's ``TURNRL_REWARD_URL`` (its secret included)
from ``/proc/PID/environ`` and post it a reward of 1.0 (answered 200). With
``agent.user_per_rollout`` (the trainer is root: here and on CI) every rollout's
command runs as a uid of its own: the same hostile agent finds nothing to read, and
each rollout keeps its own reward. Without it, commands share the trainer's user and
the environment is readable: measured below, as docs/agents.md says.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_scripted import serving
from test_hostile_run import command, run_batch, tasks
from turnrl.cli import main as turnrl_main
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.serve import Gateway, GatewayServer
from turnrl.train.agent.programs import make_program
from turnrl.train.process_tree import descendants

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching user ids needs root")
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return build_tiny_policy(0)


@pytest.fixture
def served(policy: HFPolicy) -> Iterator[tuple[Gateway, GatewayServer]]:
    with serving(policy, default_max_tokens=4, batch_window_s=0.001) as pair:
        yield pair


@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="no system Python")
def test_rollouts_as_users_of_their_own_cannot_read_or_reward_a_sibling(
    served: tuple[Gateway, GatewayServer],
) -> None:
    """The command runs under the system Python: this machine's venv Python lives under
    /root (mode 0700), which another user cannot enter (measured: "Permission denied")."""
    before = descendants()
    program = make_program(
        None, [SYSTEM_PYTHON, *command("reads_siblings")[1:]], user_per_rollout=True
    )
    results = run_batch(served, program, tasks(4))
    assert [r.failure for r in results] == [None] * 4
    assert [r.info["siblings_read"] for r in results] == [0, 0, 0, 0]
    assert [r.info["sibling_rewards_taken"] for r in results] == [0, 0, 0, 0]
    assert [r.reward for r in results] == [0.0] * 4  # each its own reward
    uids = [r.info["uid"] for r in results]
    assert len(set(uids)) == 4 and 0 not in uids  # a fresh uid per rollout
    assert descendants() == before


# serial: its agent posts to every reward URL it finds in /proc/*/environ, which would
# include the agents of tests running beside it in other pytest-xdist workers
@pytest.mark.serial
def test_rollouts_of_the_trainers_user_can_read_a_sibling_as_documented(
    served: tuple[Gateway, GatewayServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default: the probe works, so the test above is not vacuous. The agent never
    posts its own reward (it prints 0.0), so a rollout that holds a posted 1.0 was
    rewarded by a sibling: it fails as returning 0.0 after a posted 1.0, or its own later
    request is refused (409) because the rollout already holds a reward (which of the
    two depends on timing; a failed rollout keeps no info, so the thief's count of
    posts taken is not always there to read)."""
    monkeypatch.setenv("HOSTILE_SCAN_S", "10")
    results = run_batch(served, make_program(None, command("reads_siblings")), tasks(4))
    seen = [(r.failure.reason if r.failure else None, r.info) for r in results]
    victims = [
        r
        for r in results
        if r.failure
        and (
            r.failure.reason.startswith("the agent posted reward 1 and returned 0.0")
            or "409" in r.failure.reason
        )
    ]
    assert victims, seen


def test_user_per_rollout_with_an_entrypoint_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_hostile_run import agent_args, entry, error_lines

    code = turnrl_main(
        agent_args(tmp_path, f"agent.entrypoint={entry('exits_0')}", "agent.user_per_rollout=true")
    )
    err = error_lines(capsys.readouterr().err)
    assert code == 2
    assert err == [
        "turnrl train: error: config error: override 'agent.user_per_rollout=true': "
        "agent.user_per_rollout: applies to agent.command only (an entrypoint runs in-process)"
    ]
    assert not (tmp_path / "run").exists()
