"""benchmarks/arms.py: the alternating-rounds machinery every backend benchmark shares.

Arm names, worker command lines, the table cells, and ``alternate`` driving real
worker processes (small scripts that answer with ``serve_rounds``): rounds come back in
order, each worker sees only its own rounds, library chatter on stdout is skipped, and
a worker that dies is an error naming it rather than a hang.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO

_spec = importlib.util.spec_from_file_location("bench_arms", REPO / "benchmarks" / "arms.py")
assert _spec is not None and _spec.loader is not None
arms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(arms)


@pytest.mark.parametrize(
    ("name", "parsed"), [("hf", ("hf", None)), ("hf-1", ("hf", 1)), ("vllm-12", ("vllm", 12))]
)
def test_parse_arm(name: str, parsed: tuple[str, int | None]) -> None:
    assert arms.parse_arm(name) == parsed


@pytest.mark.parametrize("name", ["", "hf-", "hf-x", "hf-0", "-2"])
def test_parse_arm_refuses(name: str) -> None:
    with pytest.raises(ValueError, match="BACKEND-THREADS"):
        arms.parse_arm(name)


def test_parse_arms() -> None:
    assert arms.parse_arms("hf,hf-1,vllm") == ["hf", "hf-1", "vllm"]
    for bad in ("vllm", "hf,hf", "hf,tgi", "hf-1,vllm"):
        with pytest.raises(ValueError, match="hf in it"):
            arms.parse_arms(bad)


def test_worker_command_puts_the_arm_threads_last() -> None:
    assert arms.worker_command("hf-1", "py", "b.py", ["--threads", "2", "--n", "3"]) == [
        "py", "b.py", "--threads", "2", "--n", "3", "--backend", "hf", "--threads", "1",
    ]  # fmt: skip
    assert arms.worker_command("vllm", "vpy", "b.py", []) == ["vpy", "b.py", "--backend", "vllm"]
    built = arms.commands(["hf", "vllm"], "vpy", "b.py", ["-q"])
    assert built == {
        "hf": [sys.executable, "b.py", "-q", "--backend", "hf"],
        "vllm": ["vpy", "b.py", "-q", "--backend", "vllm"],
    }


def test_table_cells() -> None:
    assert arms.spread([3.0, 1.0, 2.0, 10.0]) == "2.5 (1.0-10.0)"
    assert arms.spread([0.123], digits=2) == "0.12 (0.12-0.12)"
    values = {"vllm": 3.0, "hf": 2.0, "hf-1": 4.0}
    assert arms.ratio_cells(values.__getitem__, "vllm", ["hf", "hf-1"]) == " | 1.50x | 0.75x"
    assert arms.bases_of(["vllm", "hf-1", "hf"]) == ["hf", "hf-1"]
    assert arms.bases_of({"vllm": 1}) == []


WORKER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {benchmarks!r})
    from arms import serve_rounds
    name = sys.argv[1]
    print("a library says hello", flush=True)
    count = iter(range(100))
    serve_rounds(lambda: {{"arm": name, "round": next(count)}}, {{"arm": name}})
    """
)


def write_worker(tmp_path: Path) -> Path:
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(benchmarks=str(REPO / "benchmarks")))
    return script


def test_alternate_runs_rounds_in_turn(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = write_worker(tmp_path)
    commands = {arm: [sys.executable, str(script), arm] for arm in ("a", "b")}
    ready, runs = arms.alternate(commands, rounds=3)
    assert {arm: {k: v for k, v in r.items() if k != "seconds"} for arm, r in ready.items()} == {
        "a": {"arm": "a"},
        "b": {"arm": "b"},
    }
    assert all(r["seconds"] > 0 for r in ready.values())
    assert runs == {arm: [{"arm": arm, "round": i} for i in range(3)] for arm in ("a", "b")}
    printed = capsys.readouterr().out.splitlines()
    order = [line.split(":")[0] for line in printed if line.startswith("round ")]
    assert order == ["round 0 a", "round 0 b", "round 1 a", "round 1 b", "round 2 a", "round 2 b"]
    assert printed.count("a library says hello") == 2  # echoed, not taken for an answer


def test_a_worker_that_dies_is_an_error_naming_it(tmp_path: Path) -> None:
    dying = tmp_path / "dying.py"
    dying.write_text("import sys\nprint('no answer')\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match=r"dying\.py.*ended with 3"):
        arms.alternate({"a": [sys.executable, str(dying)]}, rounds=1)
