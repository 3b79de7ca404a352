"""tests/launched.py: a launcher that runs past its time leaves no process behind, not
even a child in a session of its own (as torchrun starts its ranks)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from launched import run_launcher

LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
)
open(sys.argv[1], "w").write(str(child.pid))
print("launched", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited and waits for its parent


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds children through /proc")
def test_a_launcher_past_its_time_fails_the_test_and_leaves_nothing(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="ran past 3 s"):
        run_launcher(
            [sys.executable, "-c", LAUNCHER, str(pid_file)], env=dict(os.environ), timeout=3
        )
    assert time.monotonic() - started < 60
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10  # the orphan is reaped by init once killed
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_a_launcher_that_ends_gives_its_output_and_status(tmp_path: Path) -> None:
    done = run_launcher(
        [sys.executable, "-c", "import sys; print('out'); sys.exit('err')"],
        env=dict(os.environ),
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (1, "out\n", "err\n")
