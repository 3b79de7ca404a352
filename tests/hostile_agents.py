"""Misbehaving agent programs: each one tries to break the run it is trained in.

Used as ``agent.entrypoint = "<this file>:NAME"`` or run as a command
(``python hostile_agents.py NAME``). The tests in ``test_hostile_run.py`` assert
that each one costs at most its own rollout (or, where the run must stop, that it
stops with one line and exit code 2), that nothing earlier on disk is lost, and
that no process it started is left.

Environment variables they read (set by the tests):

* ``HOSTILE_MARKER``: a unique word put in the argv of every process they spawn,
  so a test can scan ``/proc`` for leftovers;
* ``HOSTILE_PIDS``: a file they append the pids they spawned to;
* ``HOSTILE_FLAG``: a file whose existence switches ``spawns_and_hangs`` from good
  behaviour to spawning children and hanging; ``hold_while_flag`` waits while it
  exists;
* ``HOSTILE_BLOCK_S``: how long ``async_blocks_loop`` blocks its event loop (15 s);
* ``HOSTILE_RUN_DIR``: the run directory ``deletes_run_dir`` deletes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

SLEEPER = "import sys, time; time.sleep(3600)"
"""What a spawned child runs (the marker follows as an argument)."""


def _odd(task: dict[str, Any]) -> bool:
    return int(str(task["task_id"]).rsplit("-", 1)[-1]) % 2 == 1


def _one_call(llm: Any) -> str:
    """One chat completion through the official client (a turn of the rollout)."""
    reply = llm.openai_client().chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return reply.choices[0].message.content or ""


async def _one_call_async(llm: Any) -> str:
    reply = await llm.async_openai_client().chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return reply.choices[0].message.content or ""


# ------------------------------------------------------------- BaseException from an agent


def exits_0(task: dict[str, Any], llm: Any) -> float:
    _one_call(llm)
    sys.exit(0)


def exits_3(task: dict[str, Any], llm: Any) -> float:
    _one_call(llm)
    sys.exit(3)


def keyboard_interrupt(task: dict[str, Any], llm: Any) -> float:
    _one_call(llm)
    raise KeyboardInterrupt


def raises_cancelled(task: dict[str, Any], llm: Any) -> float:
    """A sync agent raising the loop's own cancellation type: still only its failure."""
    import asyncio

    _one_call(llm)
    raise asyncio.CancelledError


async def async_exits_0(task: dict[str, Any], llm: Any) -> float:
    await _one_call_async(llm)
    sys.exit(0)


async def async_exits_3(task: dict[str, Any], llm: Any) -> float:
    await _one_call_async(llm)
    sys.exit(3)


async def async_keyboard_interrupt(task: dict[str, Any], llm: Any) -> float:
    await _one_call_async(llm)
    raise KeyboardInterrupt


def exits_on_odd(task: dict[str, Any], llm: Any) -> float:
    """``sys.exit(0)`` on odd tasks, else one call and reward 1."""
    _one_call(llm)
    if _odd(task):
        sys.exit(0)
    return 1.0


async def async_interrupts_on_odd(task: dict[str, Any], llm: Any) -> float:
    """``KeyboardInterrupt`` from an async agent on odd tasks, else reward 1."""
    await _one_call_async(llm)
    if _odd(task):
        raise KeyboardInterrupt
    return 1.0


# ------------------------------------------------------------------ timeouts, rewards


async def async_blocks_loop(task: dict[str, Any], llm: Any) -> float:
    """Blocks its event loop (``time.sleep`` in a coroutine) for ``HOSTILE_BLOCK_S``."""
    time.sleep(float(os.environ.get("HOSTILE_BLOCK_S", "15")))
    return 1.0


def huge_reward(task: dict[str, Any], llm: Any) -> float:
    """A finite reward whose group std overflows."""
    _one_call(llm)
    return 1e308


def hold_while_flag(task: dict[str, Any], llm: Any) -> float:
    """Waits (at most a minute) while ``HOSTILE_FLAG`` exists, then one call, reward 1."""
    flag = Path(os.environ["HOSTILE_FLAG"])
    deadline = time.monotonic() + 60
    while flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    _one_call(llm)
    return 1.0


def deletes_run_dir(task: dict[str, Any], llm: Any) -> float:
    """Deletes the run directory (``HOSTILE_RUN_DIR``) in the middle of the run."""
    _one_call(llm)
    shutil.rmtree(os.environ["HOSTILE_RUN_DIR"], ignore_errors=True)
    return 1.0


# ------------------------------------------------------------------------ as a command


def _spawn(*, new_session: bool) -> int:
    """A sleeping child with the marker in its argv (in its own session if asked)."""
    child = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, os.environ["HOSTILE_MARKER"]],
        start_new_session=new_session,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with open(os.environ["HOSTILE_PIDS"], "a", encoding="utf-8") as handle:
        handle.write(f"{child.pid}\n")
    return child.pid


def _command_call() -> str:
    """One chat completion over plain HTTP (starts fast), with the run's key."""
    request = urllib.request.Request(
        f"{os.environ['OPENAI_BASE_URL']}/chat/completions",
        data=json.dumps(
            {
                "model": os.environ["OPENAI_MODEL"],
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            }
        ).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}",
        },
        method="POST",
    )
    reply = json.loads(urllib.request.urlopen(request, timeout=60).read())
    return reply["choices"][0]["message"]["content"] or ""


def _command(name: str) -> int:
    if name == "spawns_and_hangs":
        if Path(os.environ["HOSTILE_FLAG"]).exists():
            _spawn(new_session=False)  # in the agent's process group
            _spawn(new_session=True)  # escapes the group: a setsid grandchild of the trainer
            time.sleep(3600)
        _command_call()
        print(json.dumps({"reward": 1.0}))
    elif name == "escapes_and_exits":
        _command_call()
        _spawn(new_session=True)  # left running when the agent exits normally
        print(json.dumps({"reward": 1.0}))
    elif name == "huge_reward_line":
        _command_call()
        pad = "x" * (10 * 1024 * 1024)
        sys.stdout.write(json.dumps({"reward": 1.0, "info": {"pad": pad}}) + "\n")
    elif name == "big_task":
        task = json.loads(Path(os.environ["TURNRL_TASK_FILE"]).read_text(encoding="utf-8"))
        _command_call()
        info = {
            "blob_bytes": len(task["blob"]),
            "env_has_task": "TURNRL_TASK" in os.environ,
            "task_file": os.environ["TURNRL_TASK_FILE"],
        }
        print(json.dumps({"reward": 1.0, "info": info}))
    elif name == "reads_siblings":
        _reads_siblings()
    else:
        print(f"unknown hostile agent {name!r}", file=sys.stderr)
        return 2
    return 0


# ------------------------------------------------------------- rewards of NumPy types


def numpy_reward(task: dict[str, Any], llm: Any) -> Any:
    """Returns the reward ``HOSTILE_REWARD`` names: a NumPy scalar (``float32``,
    ``float64``, ``int64``, ``bool``, ``nan``) or a string."""
    import numpy as np

    _one_call(llm)
    return {
        "float32": np.float32(0.5),
        "float64": np.float64(0.5),
        "int64": np.int64(1),
        "bool": np.bool_(True),
        "nan": np.float32("nan"),
        "string": "0.5",
    }[os.environ["HOSTILE_REWARD"]]


# ------------------------------------------------------------------- a diverging update


def random_reward(task: dict[str, Any], llm: Any) -> float:
    """One call, then a random reward in [0, 1): the group's rewards differ, so every
    advantage is non-zero and an update with a huge learning rate diverges."""
    import random

    _one_call(llm)
    return random.random()


# ---------------------------------------------------------------- success flags


def string_success(task: dict[str, Any], llm: Any) -> Any:
    """Reward 0 and ``info.success = "false"`` (truthy in Python): not a success."""
    _one_call(llm)
    return {"reward": 0.0, "info": {"success": "false"}}


def numeric_success(task: dict[str, Any], llm: Any) -> Any:
    """Reward 0 with ``info.success`` 1 on odd tasks and 0 on even ones (both valid)."""
    _one_call(llm)
    return {"reward": 0.0, "info": {"success": int(_odd(task))}}


# ------------------------------------------------------------- reaching a sibling


def _sibling_reward_urls() -> list[str]:
    """Reward URLs (secrets included) of the other rollouts' commands: every process
    environment this process may read in ``/proc`` (same user, or root)."""
    own = os.environ["TURNRL_ROLLOUT_ID"]
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path("/proc", name, "environ").read_bytes().split(b"\0")
        except OSError:  # another user's process: not readable
            continue
        values = dict(v.decode(errors="replace").partition("=")[::2] for v in environ if v)
        if "TURNRL_REWARD_URL" in values and values.get("TURNRL_ROLLOUT_ID") != own:
            found.append(values["TURNRL_REWARD_URL"])
    return sorted(set(found))


def _reads_siblings() -> None:
    """One call; then, until one of its posts is taken or ``HOSTILE_SCAN_S`` seconds have
    passed, looks for its siblings' reward URLs in ``/proc/*/environ`` and posts 1.0 to
    each new one found; reports what it found and how many posts were taken (reward 0).
    It stays alive while it has taken nothing, so a sibling that starts later (a loaded
    machine staggers the starts) still finds it running."""
    _command_call()
    deadline = time.monotonic() + float(os.environ.get("HOSTILE_SCAN_S", "3"))
    tried: set[str] = set()
    taken = 0
    while not taken and time.monotonic() < deadline:
        for url in _sibling_reward_urls():
            if url not in tried:
                tried.add(url)
                taken += _post_reward(url)
        time.sleep(0.05)
    info = {"siblings_read": len(tried), "sibling_rewards_taken": taken, "uid": os.getuid()}
    print(json.dumps({"reward": 0.0, "info": info}))


def _post_reward(url: str) -> bool:
    """Post reward 1.0 to ``url``; whether the gateway took it (200)."""
    request = urllib.request.Request(
        url,
        data=json.dumps({"reward": 1.0}).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}",
        },
        method="POST",
    )
    with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=10) as answer:
        return bool(answer.status == 200)
    return False


if __name__ == "__main__":
    sys.exit(_command(sys.argv[1]))
