"""A command agent cannot reach a sibling rollout through the machine (issue 38).

A command agent used to read a sibling's ``TURNRL_REWARD_URL`` (its secret included)
from ``/proc/PID/environ`` and post it a reward of 1.0 (answered 200). Now
``agent.isolation`` (default ``"auto"``) keeps siblings apart where the machine allows
it, and here (root in a container, util-linux ``unshare``) both mechanisms work:
measured below with the same hostile agent, which finds nothing to read under either,
and each rollout keeps its own reward. ``"none"`` (commands share the trainer's user)
leaves the environment readable: measured too, as docs/agents.md says.
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
from turnrl.train.agent import isolation
from turnrl.train.agent.command import files_needed, resolve_command
from turnrl.train.agent.contract import AgentConfigError
from turnrl.train.agent.programs import make_program
from turnrl.train.process_tree import descendants

SYSTEM_PYTHON = "/usr/bin/python3"
NAMESPACES = isolation.namespaces_problem()
"""Why user+PID namespaces do not work here (None: they do, measured at import)."""


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return build_tiny_policy(0)


@pytest.fixture
def served(policy: HFPolicy) -> Iterator[tuple[Gateway, GatewayServer]]:
    with serving(policy, default_max_tokens=4, batch_window_s=0.001) as pair:
        yield pair


def assert_isolated(results: list, uid: int | None = None) -> None:
    """Every rollout ran, read no sibling's secret, took no sibling's reward, and kept
    its own reward 0.0; all ran as ``uid`` when given, else each as a uid of its own."""
    seen = [(r.failure.reason if r.failure else None, r.info) for r in results]
    assert [r.failure for r in results] == [None] * 4, seen
    assert [r.info["siblings_read"] for r in results] == [0, 0, 0, 0]
    assert [r.info["sibling_rewards_taken"] for r in results] == [0, 0, 0, 0]
    assert [r.reward for r in results] == [0.0] * 4
    uids = [r.info["uid"] for r in results]
    if uid is not None:
        assert uids == [uid] * 4
    else:
        assert len(set(uids)) == 4 and 0 not in uids  # a fresh uid per rollout


@pytest.mark.skipif(NAMESPACES is not None, reason=f"no namespaces here: {NAMESPACES}")
def test_by_default_rollouts_in_namespaces_cannot_read_or_reward_a_sibling(
    served: tuple[Gateway, GatewayServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default (``"auto"``) takes namespaces here; the agent runs under the venv's
    Python (under /root, mode 0700: out of reach of another uid) and scans for 3 s."""
    before = descendants()
    program = make_program(None, command("reads_siblings"))
    assert program.isolation == "namespaces"
    assert_isolated(run_batch(served, program, tasks(4)), uid=isolation.NAMESPACE_UID)
    assert descendants() == before


@pytest.mark.skipif(os.geteuid() != 0, reason="switching user ids needs root")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="no system Python")
def test_rollouts_as_users_of_their_own_cannot_read_or_reward_a_sibling(
    served: tuple[Gateway, GatewayServer],
) -> None:
    """The command runs under the system Python: this machine's venv Python lives under
    /root (mode 0700), which another user cannot enter (measured: "Permission denied")."""
    before = descendants()
    program = make_program(None, [SYSTEM_PYTHON, *command("reads_siblings")[1:]], isolation="user")
    assert_isolated(run_batch(served, program, tasks(4)))
    assert descendants() == before


# serial: its agent posts to every reward URL it finds in /proc/*/environ, which would
# include the agents of tests running beside it in other pytest-xdist workers
@pytest.mark.serial
def test_rollouts_of_the_trainers_user_can_read_a_sibling_as_documented(
    served: tuple[Gateway, GatewayServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``"none"``, the behaviour before: the probe works, so the tests above are not
    vacuous. The agent never
    posts its own reward (it prints 0.0), so a rollout that holds a posted 1.0 was
    rewarded by a sibling: it fails as returning 0.0 after a posted 1.0, or its own later
    request is refused (409) because the rollout already holds a reward (which of the
    two depends on timing; a failed rollout keeps no info, so the thief's count of
    posts taken is not always there to read)."""
    monkeypatch.setenv("HOSTILE_SCAN_S", "10")
    program = make_program(None, command("reads_siblings"), isolation="none")
    results = run_batch(served, program, tasks(4))
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


def test_isolation_with_an_entrypoint_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_hostile_run import agent_args, entry, error_lines

    code = turnrl_main(
        agent_args(tmp_path, f"agent.entrypoint={entry('exits_0')}", "agent.isolation=user")
    )
    err = error_lines(capsys.readouterr().err)
    assert code == 2
    assert err == [
        "turnrl train: error: config error: override 'agent.isolation=user': "
        "agent.isolation: applies to agent.command only (an entrypoint runs in-process)"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching user ids needs root")
def test_a_user_isolation_the_command_is_out_of_reach_of_is_refused_first() -> None:
    """This machine's venv Python is under /root (mode 0700): asked for by name,
    ``"user"`` is refused before any rollout, naming what another uid cannot read."""
    argv = resolve_command(command("reads_siblings"))
    problem = isolation.user_problem(files_needed(argv))
    if problem is None:
        pytest.skip("another uid reaches this Python here")
    with pytest.raises(AgentConfigError) as caught:
        make_program(None, argv, isolation="user")
    assert str(caught.value) == f"agent.isolation = 'user' does not work here: {problem}"
    assert problem.startswith("another user cannot reach what the command needs: cannot read /")


@pytest.fixture
def nothing_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where neither mechanism works (as measured on one without unshare,
    not root)."""
    monkeypatch.setattr(isolation, "namespaces_problem", lambda: "no 'unshare' program")
    monkeypatch.setattr(isolation, "user_problem", lambda paths: "not root")


@pytest.mark.usefixtures("nothing_works")
def test_auto_falls_back_to_the_trainers_user_with_one_warning_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    program = make_program(None, command("reads_siblings"))
    assert program.isolation == "none"
    assert capsys.readouterr().err.splitlines() == [
        "turnrl: warning: agent.isolation = 'auto': command agents run as the trainer's "
        "user, so a sibling can read their reward secret (namespaces: no 'unshare' "
        "program; user: not root)"
    ]


@pytest.mark.usefixtures("nothing_works")
@pytest.mark.parametrize(
    ("kind", "why"), [("namespaces", "no 'unshare' program"), ("user", "not root")]
)
def test_a_named_isolation_that_does_not_work_here_is_refused(kind: str, why: str) -> None:
    with pytest.raises(AgentConfigError) as caught:
        make_program(None, command("reads_siblings"), isolation=kind)
    assert str(caught.value) == f"agent.isolation = {kind!r} does not work here: {why}"


def test_none_is_the_old_behaviour_and_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert make_program(None, command("reads_siblings"), isolation="none").isolation == "none"
    assert capsys.readouterr().err == ""
