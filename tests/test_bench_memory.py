"""benchmarks/memory.py's pieces that need no SmolLM2 run: the synthetic 4-turn
trajectory, each arm's update fields, the median table and the 20 GiB extrapolation."""

from __future__ import annotations

import importlib.util
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from conftest import REPO

_spec = importlib.util.spec_from_file_location("bench_memory", REPO / "benchmarks" / "memory.py")
assert _spec is not None and _spec.loader is not None
memory = importlib.util.module_from_spec(_spec)
sys.modules["bench_memory"] = memory
_path = list(sys.path)
_spec.loader.exec_module(memory)
# memory.py puts benchmarks/ first on sys.path, where benchmarks/agents.py shadows the
# openai-agents package (``agents``) for every later test of this process: seen under
# pytest-xdist, where the agent tests ran after this file in one worker
sys.path[:] = _path


@pytest.mark.parametrize("tokens", [2048, 8192, 10000])
def test_trajectory_is_four_growing_turns_ending_at_the_size(tokens) -> None:
    contexts, responses = memory.trajectory(tokens, vocab=500)
    share = tokens // 4
    assert [len(c) + len(r) for c, r in zip(contexts, responses, strict=True)] == [
        share,
        2 * share,
        3 * share,
        tokens,
    ]
    assert all(len(r) == memory.RESPONSE for r in responses)
    for k in range(3):  # each turn's context holds the previous turn's context + response
        assert contexts[k + 1][: len(contexts[k]) + memory.RESPONSE] == contexts[k] + responses[k]
    assert all(10 <= t < 500 for c in contexts for t in c)
    assert memory.trajectory(tokens, vocab=500) == (contexts, responses)  # fixed per size


def test_arm_fields() -> None:
    assert memory.arm_fields("none", 8192) == {"max_tokens_per_batch": 8192}
    assert memory.arm_fields("none", 1000) == {"max_tokens_per_batch": 2048}
    assert memory.arm_fields("chunks", 2048) == {
        "max_tokens_per_batch": 2048,
        "logprob_chunk_tokens": memory.CHUNK,
    }
    every = memory.arm_fields("all", 2048)
    assert every["gradient_checkpointing"] is True
    assert every["precision"] == "bf16-mixed"
    assert every["logprob_chunk_tokens"] == memory.CHUNK
    trl = ["trl"] if memory.TRL_PYTHON.exists() else []  # where the TRL venv is built
    assert memory.default_arms()[0] == "none"
    assert memory.default_arms()[-2 - len(trl) :] == ["all-fp32", "all", *trl]
    assert memory.arm_fields("trl", 8192) == {"max_tokens_per_batch": 8192}  # unused by TRL
    assert "precision" not in memory.arm_fields("all-fp32", 2048)
    assert memory.packing_available()  # landed: rows packed, 2048 positions a forward
    assert memory.arm_fields("packing", 8192) == {"update": "rows", "max_tokens_per_batch": 2048}
    assert every["update"] == "rows" and every["max_tokens_per_batch"] == 2048
    assert "packing" in memory.default_arms()
    with pytest.raises(SystemExit, match="unknown arm 'fast'"):
        memory.arm_fields("fast", 2048)


def _row(arm: str, tokens: int, peak: float, round_: int = 0, **extra) -> dict:
    return {
        "arm": arm,
        "tokens": tokens,
        "round": round_,
        "peak_mib": peak,
        "before_mib": 1024.0,
        "wall_s": tokens / 1000,
        "cpu_s": tokens / 2000,
        "activation_mib": 1.0,
        **extra,
    }


def test_summary_table_and_extrapolation() -> None:
    results = [
        _row("none", 2048, 2048.0),
        _row("none", 2048, 4096.0, round_=1),
        _row("none", 8192, 5120.0),
        _row("all", 2048, 1024.0),
        _row("all", 8192, 2048.0),
        {"arm": "chunks", "tokens": 8192, "failed": "killed (out of memory?)"},
    ]
    cells = memory.summary(results)
    assert cells[("none", 2048)]["peak_mib"] == 3072.0 and cells[("none", 2048)]["n"] == 2
    assert cells[("chunks", 8192)] == {"failed": "killed (out of memory?)", "n": 1}
    # through (2048, 1 GiB) and (8192, 2 GiB): 20 GiB at 8192 + 18 GiB / (1 GiB / 6144)
    assert memory.extrapolated_tokens(cells, "all").startswith("~118,784 ")
    assert memory.extrapolated_tokens(cells, "chunks") == "n/a"
    args = Namespace(sizes=[2048, 8192], arms=["none", "chunks", "all"])
    text = memory.table(args, cells)
    lines = text.splitlines()
    assert lines[0] == "| arm | 2k tokens | 8k tokens |"
    assert lines[2].startswith("| `none` | 3.00 GiB; +2.00 over loaded; 1.00 ms/token (0.50 CPU)")
    assert "| `chunks` | not run | failed: killed (out of memory?) |" in lines
    assert lines[4].startswith("| `all` | 1.00 GiB (0.33x none);")
    report = memory.report(args, results, None)
    assert report.split("\n\n")[1] == text  # what --write puts between the doc's markers
    assert "Longest trajectory under 20 GiB, `all`: ~118,784 (extrapolated" in report
    assert "Not run here: 16k, 32k tokens." in report


def test_the_trl_arm_runs_trl_memory_in_the_trl_venv(monkeypatch, tmp_path) -> None:
    import turnrl.policy.pretrained

    monkeypatch.setattr(turnrl.policy.pretrained, "smollm2_path", lambda: Path("/models/smol"))
    out = tmp_path / "out.json"
    python = Path(sys.executable)
    command = memory.child_command("trl", 4096, out, python)
    script = str(REPO / "benchmarks" / "trl_memory.py")
    model = ["--model", "/models/smol", "--tokens", "4096", "--out", str(out)]
    assert command == [str(python), script, *model]
    assert memory.child_command("all", 4096, out, python)[2:5] == ["--child", "all", "4096"]
    with pytest.raises(SystemExit, match="make setup-integrations"):
        memory.child_command("trl", 4096, out, tmp_path / "no-venv" / "python")
    monkeypatch.setattr(memory, "TRL_PYTHON", tmp_path / "no-venv" / "python")
    assert "trl" not in memory.default_arms()


def test_a_trl_row_without_an_activation_meter_is_summarised() -> None:
    trl = _row("trl", 2048, 3072.0)
    del trl["activation_mib"]
    cells = memory.summary([_row("none", 2048, 2048.0), trl])
    assert cells[("trl", 2048)]["peak_mib"] == 3072.0
    assert "activation_mib" not in cells[("trl", 2048)]
    assert cells[("none", 2048)]["activation_mib"] == 1.0
