"""How command agents are kept apart (``agent.isolation``): what works here, measured.

Every rollout's command holds its rollout's secret (in ``TURNRL_REWARD_URL``, in its
environment and memory). A sibling that can read ``/proc/PID/environ`` of it can
post that rollout's reward: on Linux any process of the same uid can (and root any),
whatever user namespace it is in. Two ways keep a sibling out, each measured before
a run's first rollout:

* ``"namespaces"``: each rollout's command starts in new user, PID and mount
  namespaces (util-linux ``unshare``), with a fresh ``/proc`` that shows its own
  processes only, as uid :data:`NAMESPACE_UID` inside, which has no capabilities:
  it cannot unmount that ``/proc`` to uncover the machine's. Its siblings (and the
  trainer) have no PID it can see, read or signal. On the machine its files are
  still the trainer's uid's (it reads the trainer's Python where a separate uid
  cannot), and when it ends the kernel kills everything it started.
* ``"user"``: each rollout's command runs as a fresh uid no other rollout of the run
  has had (the trainer must be root): a sibling may see its PID but not read its
  environment, signal it or read its files. Its program, interpreter and the files
  named on its command line must be reachable by that uid (checked first, as that
  uid): a pyenv Python under ``/root`` (mode 0700) is not.

``"auto"`` (the default) takes the first of those two that works here and otherwise
runs the command as the trainer's user with one warning line naming why; ``"none"``
is that old behaviour on purpose. A named kind that does not work here is a config
error naming why.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Literal

from turnrl.train.agent.contract import AgentConfigError
from turnrl.train.process_tree import die_with_parent

Isolation = Literal["auto", "namespaces", "user", "none"]
ISOLATIONS: tuple[str, ...] = ("auto", "namespaces", "user", "none")

NAMESPACE_UID = 1000
"""The uid (and gid) a command has inside its user namespace: any uid but 0 (root in
the namespace would keep the capabilities to unmount its ``/proc``); it is the
trainer's uid outside."""
PROBE_TIMEOUT_S = 20.0
"""How long one check of a mechanism may take."""
PROBE_UID = 1_499_999_999
"""The uid the ``"user"`` check runs as: no account has it (rollouts count up from
:data:`turnrl.train.agent.command.ROLLOUT_UID_BASE`, above it), so what it reaches is
what any fresh uid reaches."""


def namespace_prefix() -> list[str]:
    """The argv before a command that runs it in namespaces of its own: ``unshare``
    maps the trainer's uid to :data:`NAMESPACE_UID`, forks the command as PID 1 of a
    new PID namespace with a fresh ``/proc``, and SIGKILLs it when ``unshare`` itself
    dies (which dies with the trainer: ``PR_SET_PDEATHSIG``)."""
    program = shutil.which("unshare") or "unshare"
    return [
        program,
        f"--map-user={NAMESPACE_UID}",
        f"--map-group={NAMESPACE_UID}",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
        "--",
    ]


@functools.cache
def namespaces_problem() -> str | None:
    """Why ``"namespaces"`` does not work here (None when it does): a trial
    ``unshare ... true`` must exit 0. Measured once per process."""
    if not sys.platform.startswith("linux"):
        return f"user and PID namespaces are Linux only (this is {sys.platform})"
    if shutil.which("unshare") is None:
        return "no 'unshare' program (util-linux) on PATH"
    true = shutil.which("true") or "/bin/true"
    failed = _trial([*namespace_prefix(), true])
    return None if failed is None else f"'unshare' failed here: {failed}"


def _trial(argv: list[str], uid: int | None = None) -> str | None:
    """Run a check (as ``uid`` when given); None when it exits 0, else what went wrong
    (its last stderr line, or why it could not run)."""
    try:
        trial = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            preexec_fn=None
            if uid is None
            else functools.partial(die_with_parent, os.getpid(), uid),
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if trial.returncode == 0:
        return None
    return (trial.stderr.strip().splitlines() or [f"exit code {trial.returncode}"])[-1]


def user_problem(paths: Sequence[str]) -> str | None:
    """Why ``"user"`` does not work for a command that needs ``paths`` (None when it
    does; :func:`turnrl.train.agent.command.files_needed`): the trainer must be root,
    and a process of a fresh uid must be able to read every one (checked by such a
    process)."""
    if os.geteuid() != 0:
        return "switching user ids needs the trainer to run as root"
    check = 'for p; do test -r "$p" || { echo "cannot read $p" >&2; exit 1; }; done'
    shell = shutil.which("sh") or "/bin/sh"
    failed = _trial([shell, "-c", check, "sh", *paths], uid=PROBE_UID)
    return None if failed is None else f"another user cannot reach what the command needs: {failed}"


def choose_isolation(requested: str, paths: Sequence[str]) -> str:
    """The isolation a command agent that needs ``paths`` runs with: ``requested``
    itself when it works here (else :class:`AgentConfigError` naming why), or for
    ``"auto"`` the first of ``"namespaces"`` and ``"user"`` that works, else ``"none"``
    with one warning line on stderr naming why."""
    option = "agent.isolation"
    if requested not in ISOLATIONS:
        raise AgentConfigError(
            f"{option}: expected one of {', '.join(ISOLATIONS)}, got {requested!r}"
        )
    if requested == "none":
        return "none"
    problems = {
        "namespaces": namespaces_problem if requested in ("auto", "namespaces") else None,
        "user": functools.partial(user_problem, paths) if requested in ("auto", "user") else None,
    }
    why: list[str] = []
    for kind, check in problems.items():
        if check is None:
            continue
        problem = check()
        if problem is None:
            return kind
        if requested == kind:
            raise AgentConfigError(f"{option} = {kind!r} does not work here: {problem}")
        why.append(f"{kind}: {problem}")
    print(
        f"turnrl: warning: {option} = 'auto': command agents run as the trainer's user, so a "
        f"sibling can read their reward secret ({'; '.join(why)})",
        file=sys.stderr,
    )
    return "none"
