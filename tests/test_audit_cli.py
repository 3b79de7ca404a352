"""The audit on hand-built logs and the CLI's behaviour on good and bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from turnrl import TurnTable
from turnrl.cli import main
from turnrl.credit.audit import audit

EXAMPLE = REPO / "examples" / "logs" / "mixed_grouping.jsonl"
Q = [{"role": "user", "content": "q"}]


def issue_489_log() -> list[dict]:
    """Two 2-turn tool rollouts (reward 1), two direct answers (reward 0), one question."""
    after_call = [*Q, {"role": "assistant", "content": "call"}, {"role": "tool", "content": "4"}]
    rows = []
    for r in ("a", "b"):
        rows.append({"task_id": "q", "traj_id": r, "turn": 0, "prompt": Q})
        rows.append({"task_id": "q", "traj_id": r, "turn": 1, "prompt": after_call, "reward": 1})
    for r in ("c", "d"):
        rows.append({"task_id": "q", "traj_id": r, "turn": 0, "prompt": Q, "reward": 0})
    return rows


def test_audit_numbers_on_the_489_case() -> None:
    report = audit(TurnTable.from_records(issue_489_log()))
    keys = {k.key: k for k in report.group_keys}
    task = keys["task"]
    # One task group of 6 rows from 2 decision points (turn-0 question, turn-1 after the call).
    assert (task.n_groups, task.mixed_share, task.mean_decision_points) == (1, 1.0, 2.0)
    # Tool rollouts contribute 2 rows each, direct answers 1: weight ratio 2.
    assert task.length_weight_mean == 2.0 and task.length_weight_max == 2.0
    assert keys["rollout"].mixed_share == 0.0 and keys["rollout"].length_weight_max == 1.0
    # turn groups: (q,0) has 4 rows from one context, (q,1) 2 rows with equal returns -> zero adv
    assert keys["turn"].n_groups == 2 and keys["turn"].mixed_share == 0.0
    assert keys["turn"].zero_adv_share == 0.5
    assert keys["node"].rows_covered == 1.0
    est = {e.estimator: e for e in report.estimators}
    # grpo_mixed: scores [1,1,1,1,0,0] over rows, mean 2/3, sample std sqrt(12/45);
    # turn-0 rows are a, b (+1/3) and c, d (-2/3): mean (-1/6) / (std + 1e-6)
    std = (12 / 45) ** 0.5
    assert est["grpo_mixed"].adv_mean_by_turn[0] == pytest.approx(-1 / 6 / (std + 1e-6), rel=1e-12)
    # node (mean only) at turn 0: returns [1,1,0,0] minus 0.5 -> gap to itself 0
    assert est["node"].turn0_gap_mean_abs == 0.0
    # grpo (std) at turn 0 equals node with std: +-0.866 both
    assert est["grpo"].turn0_gap_mean_abs == pytest.approx(0.0, abs=1e-9)
    # later turns: grpo broadcasts +0.866 where the node baseline gives 0 (equal siblings)
    # (outcomes [1,1,0,0]: mean 0.5, std sqrt(1/3); 0.5 / (std + 1e-6))
    assert est["grpo"].later_gap_mean_abs == pytest.approx(0.5 / (3**-0.5 + 1e-6), rel=1e-12)
    assert est["turn_group"].later_gap_mean_abs == 0.0
    text = report.to_text()
    assert "WARNING: grouping by task mixes different prompts" in text
    assert "100% of task groups" in text
    assert "2.0x as often" in text


def test_audit_reports_policy_versions_per_group_key(tmp_path: Path, capsys) -> None:
    """The #489 log sampled by three weight versions (asynchronous training): each key's
    share of groups mixing versions and their spread, rows per version and the lag behind
    the newest by turn; the same from records and from the file's columnar reader."""
    versions = {("a", 0): 3, ("a", 1): 4, ("b", 0): 3, ("b", 1): 4, ("c", 0): 2, ("d", 0): 4}
    rows = [{**r, "policy_version": versions[r["traj_id"], r["turn"]]} for r in issue_489_log()]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from_file, from_records = audit(TurnTable.from_jsonl(log)), audit(TurnTable.from_records(rows))
    for report in (from_file, from_records):
        keys = {k.key: k for k in report.group_keys}
        # task: one group holding v2, v3 and v4
        assert (keys["task"].version_mixed_share, keys["task"].version_spread_max) == (1.0, 2.0)
        # turn 0 (v3, v3, v2, v4) mixes, spread 2; turn 1 (v4, v4) does not
        for key in ("turn", "node"):
            assert (keys[key].version_mixed_share, keys[key].version_spread_max) == (0.5, 2.0)
        assert report.versions == {2: 1, 3: 2, 4: 3}
        # behind v4: turn 0 rows 1, 1, 2, 0 -> 1.0; turn 1 rows 0, 0
        assert report.version_lag_by_turn == [1.0, 0.0]
    as_text = json.dumps({**from_records.to_dict(), "source": str(log)})  # NaN == NaN as text
    assert json.dumps(from_file.to_dict()) == as_text
    assert main(["audit", str(log)]) == 0
    out = capsys.readouterr().out
    assert "Policy versions (rows): v2: 1, v3: 2, v4: 3" in out
    assert "groups mixing versions" in out
    # a log without versions reports none
    plain = audit(TurnTable.from_records(issue_489_log()))
    assert plain.versions == {} and plain.version_lag_by_turn == []
    assert all(math.isnan(k.version_mixed_share) for k in plain.group_keys)
    assert "Policy versions" not in plain.to_text()


def test_audit_of_exact_log_does_not_warn() -> None:
    rows = [
        {"task_id": "q", "traj_id": r, "turn": 0, "prompt": Q, "reward": float(r == "a")}
        for r in "abc"
    ]
    text = audit(TurnTable.from_records(rows)).to_text()
    assert "WARNING" not in text
    assert "do not mix decision points" in text


def test_cli_audit_text_and_json(capsys) -> None:
    assert main(["audit", str(EXAMPLE)]) == 0
    assert "mixes different prompts" in capsys.readouterr().out
    assert main(["audit", "--json", str(EXAMPLE)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {k["key"] for k in data["group_keys"]} == {
        "task",
        "rollout",
        "turn",
        "role_turn",
        "state",
        "node",
    }


def test_cli_credit_writes_advantages_in_input_order(tmp_path: Path, capsys) -> None:
    log = tmp_path / "in.jsonl"
    rows = issue_489_log()[::-1]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    assert main(["credit", "--estimator", "grpo", str(log), "-o", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(w["traj_id"], w["turn"]) for w in written] == [(r["traj_id"], r["turn"]) for r in rows]
    by_traj = {w["traj_id"]: w["advantage"] for w in written}
    plus = 0.5 / (3**-0.5 + 1e-6)  # outcomes [1,1,0,0]: mean 0.5, sample std sqrt(1/3)
    assert by_traj == pytest.approx({"a": plus, "b": plus, "c": -plus, "d": -plus}, rel=1e-12)
    assert all(set(w) - {"advantage"} == set(r) for w, r in zip(written, rows, strict=True))


def test_cli_credit_clip_factor_and_params(tmp_path: Path) -> None:
    log = tmp_path / "in.jsonl"
    rows = issue_489_log()
    rows[0]["info_gain"], rows[2]["info_gain"] = 0.5, -0.5
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    code = main(
        ["credit", "--estimator", "a2tgpo", "--param", "alpha=0.5", str(log), "-o", str(out)]
    )
    assert code == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert all("clip_factor" in w for w in written)
    assert written[1]["clip_factor"] == 1.0  # answer turn without IG


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{bad json\n", "in.jsonl:1: malformed JSON"),
        ('{"task_id": "t", "traj_id": "a"}\n', "in.jsonl:1: field 'turn'"),
        (
            '{"task_id": "t", "traj_id": "a", "turn": 0, "reward": NaN}\n',
            "field 'reward': NaN is not a JSON number",
        ),
        ("", "the file is empty"),
    ],
)
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path: Path, capsys, content, message) -> None:
    log = tmp_path / "in.jsonl"
    log.write_text(content)
    out = tmp_path / "out.jsonl"
    assert main(["credit", "--estimator", "grpo", str(log), "-o", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    assert main(["audit", str(log)]) == 2


def test_cli_unknown_estimator_and_param(tmp_path: Path, capsys) -> None:
    out = tmp_path / "o.jsonl"
    assert main(["credit", "--estimator", "nope", str(EXAMPLE), "-o", str(out)]) == 2
    assert "unknown estimator 'nope'" in capsys.readouterr().err
    assert (
        main(["credit", "--estimator", "grpo", "--param", "gamma=1", str(EXAMPLE), "-o", str(out)])
        == 2
    )
    assert "no parameter(s) gamma" in capsys.readouterr().err
    assert not out.exists()


def test_console_script_runs_as_subprocess(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "turnrl.cli", "audit", str(EXAMPLE)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "Group keys" in done.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1]\n")
    done = subprocess.run(
        [sys.executable, "-m", "turnrl.cli", "audit", str(bad)], capture_output=True, text=True
    )
    assert done.returncode == 2 and "bad.jsonl:1" in done.stderr


def test_cli_turns_only_the_project_s_errors_into_exit_2(monkeypatch, capsys) -> None:
    """Bad input is one line and exit 2; a bug (any other exception) keeps its traceback."""
    import turnrl.cli as cli
    from turnrl.errors import InputError

    def bad_input(args):
        raise InputError("runs.jsonl", 3, "reward", "not a number")

    def bug(args):
        raise ValueError("a bug in turnrl")

    for handler, expected in ((bad_input, 2), (bug, None)):
        monkeypatch.setattr(cli, "cmd_estimators", handler)
        if expected is None:
            with pytest.raises(ValueError, match="a bug in turnrl"):
                cli.main(["estimators"])
        else:
            assert cli.main(["estimators"]) == expected
            assert "runs.jsonl:3: field 'reward': not a number" in capsys.readouterr().err
