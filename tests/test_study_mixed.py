"""Studies whose arms run different commands (``turnrl iterate`` and ``turnrl train``)
and whose settings need warm starts of their own: the cells they expand to, the runner
keeping a setting's warm start with its cells, and tables restricted to some arms or
paired against a table's own baseline. Also the iterative-grpo declaration itself."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from turnrl.study.catalogue import ITERATIVE_GRPO, ITERATIVE_PERSONA
from turnrl.study.declaration import Arm, Metric, Setting, Study, Table, WarmStarts, cells
from turnrl.study.runner import FINISHED, MISSING, cell_state, read_metrics, run_study
from turnrl.study.tables import build

FAKE = textwrap.dedent(
    """
    # A stand-in for `turnrl iterate` / `turnrl train`: fails when its root holds
    # fail-<setting>, else writes a run whose end value is the seed / 10 (+ 0.5 for
    # the arm that passes bonus=1).
    import json, pathlib, sys
    args = sys.argv[1:]
    value = dict(a.split("=", 1) for a in args if "=" in a)
    run_dir = pathlib.Path(value["run_dir"])
    root = pathlib.Path(__file__).parent
    with open(root / "invocations.jsonl", "a") as log:
        log.write(json.dumps(args) + "\\n")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text("")
    if (root / f"fail-{value['env']}").exists():
        sys.exit(3)
    seed = int(value.get("seed", value.get("train.seed", 0)))
    end = seed / 10 + 0.5 * int(value.get("bonus", 0))
    rows = [{"step": 0, "v": 0.0}, {"step": 1, "v": end}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
    """
)

V = Metric("v", "value")


def mixed_study(root: Path) -> Study:
    (root / "fake.py").write_text(FAKE)
    for name in ("iterate.toml", "train.toml"):
        (root / name).write_text("")
    other = ("{python}", str(root / "fake.py"), "train")
    return Study(
        name="mixed",
        title="mixed",
        config="iterate.toml",
        program=("{python}", str(root / "fake.py"), "iterate"),
        seed_override="seed={seed}",
        arms=(
            Arm("it", ("bonus=0",)),
            Arm("it2", ("bonus=1",)),
            Arm(
                "on",
                ("bonus=1",),
                config="train.toml",
                program=other,
                seed_override="train.seed={seed}",
            ),
        ),
        seeds=(0, 1),
        settings=(Setting("a", ("env=a",)), Setting("b", ("env=b",))),
        warm_starts=WarmStarts(
            count=2,
            per_seed=True,
            per_setting=True,
            overrides=("iterations=0",),
            seed_override="seed={warm}",
        ),
        baseline="on",
        tables=(
            Table("paired", "paired", (V,)),
            Table("paired-it", "paired", (V,), arms=("it", "it2"), baseline="it"),
            Table("seeds", "seeds", (V,), arms=("it2",)),
        ),
    )


def test_cells_take_each_arms_command_and_each_settings_warm_start(tmp_path: Path) -> None:
    every = cells(mixed_study(tmp_path), tmp_path)
    base = tmp_path / "runs" / "studies" / "mixed"
    assert [c.key for c in every if c.is_warm_start] == [
        "warm/a/ws0",
        "warm/a/ws1",
        "warm/b/ws0",
        "warm/b/ws1",
    ]
    warm = every[2]  # warm/b/ws0: the setting's overrides, then the warm start's
    assert warm.argv[2:] == (
        "iterate",
        "--config",
        f"{tmp_path}/iterate.toml",
        "env=b",
        "iterations=0",
        "seed=0",
        f"run_dir={base}/warm/b/ws0",
    )
    by_key = {c.key: c for c in every}
    online = by_key["b/on/seed1"]
    assert online.argv[1:] == (
        str(tmp_path / "fake.py"),
        "train",
        "--config",
        f"{tmp_path}/train.toml",
        "env=b",
        "bonus=1",
        f"warm_start.init_from={base}/warm/b/ws1/warm_start",
        "train.seed=1",
        f"run_dir={base}/b/on/seed1",
    )
    assert online.warm_from == "warm/b/ws1"
    assert by_key["a/it/seed0"].argv[-3:] == (
        f"warm_start.init_from={base}/warm/a/ws0/warm_start",
        "seed=0",
        f"run_dir={base}/a/it/seed0",
    )
    assert len(every) == 4 + 2 * 2 * 3


def test_only_runs_the_warm_start_of_the_selected_setting(tmp_path: Path) -> None:
    study = mixed_study(tmp_path)
    outcomes = run_study(study, tmp_path, only=["b/on/seed1"])
    assert [o.cell.key for o in outcomes] == ["warm/b/ws1", "b/on/seed1"]
    assert all(o.returncode == 0 for o in outcomes)


def test_a_failed_warm_start_skips_only_its_own_cells(tmp_path: Path) -> None:
    study = mixed_study(tmp_path)
    (tmp_path / "fail-a").write_text("")
    outcomes = run_study(study, tmp_path)
    assert {o.cell.key: o.returncode for o in outcomes} == {
        "warm/a/ws0": 3,
        "warm/a/ws1": 3,
        "warm/b/ws0": 0,
        "warm/b/ws1": 0,
        **{f"b/{arm}/seed{s}": 0 for arm in ("it", "it2", "on") for s in (0, 1)},
    }
    states = {c.key: cell_state(c) for c in cells(study, tmp_path) if not c.is_warm_start}
    assert {k for k, s in states.items() if s == MISSING} == {
        f"a/{arm}/seed{s}" for arm in ("it", "it2", "on") for s in (0, 1)
    }
    assert {k for k, s in states.items() if s == FINISHED} == {
        f"b/{arm}/seed{s}" for arm in ("it", "it2", "on") for s in (0, 1)
    }


def test_tables_keep_their_arms_and_pair_against_their_own_baseline(tmp_path: Path) -> None:
    study = mixed_study(tmp_path)
    run_study(study, tmp_path)
    done = [c for c in cells(study, tmp_path) if not c.is_warm_start]
    paired, paired_it, seeds = (build(study, t, done, read_metrics) for t in study.tables)
    # against the study's baseline "on" (seed / 10 + 0.5): it is 0.5 lower in each pair
    assert "| a | it − on | value | 2 seeds | -0.50, -0.50 | -0.50 |" in paired
    assert "| a | it2 − on | value | 2 seeds | +0.00, +0.00 | +0.00 |" in paired
    # the table's own baseline "it", and no row of the arm it leaves out
    assert "| b | it2 − it | value | 2 seeds | +0.50, +0.50 | +0.50 |" in paired_it
    assert [line.split(" | ")[:2] for line in paired_it.splitlines()[2:4]] == [
        ["| a", "it2 − it"],
        ["| b", "it2 − it"],
    ]
    assert paired_it.splitlines()[4] == ""  # two rows: "on" is not in this table
    assert seeds.splitlines()[2:][:4] == [
        "| a | it2 | 0 | 0.00 → 0.50 |",
        "| a | it2 | 1 | 0.00 → 0.60 |",
        "| b | it2 | 0 | 0.00 → 0.50 |",
        "| b | it2 | 1 | 0.00 → 0.60 |",
    ]
    assert seeds.endswith(
        "Start: the first value each run logged (not all at the same step); end: the last."
    )


def test_a_table_naming_an_unknown_arm_or_baseline_is_refused(tmp_path: Path) -> None:
    study = mixed_study(tmp_path)
    with pytest.raises(ValueError, match="baseline 'x' is not an arm"):
        Study(**{**study.__dict__, "tables": (Table("p", "paired", (V,), baseline="x"),)})
    with pytest.raises(ValueError, match="table 'p': unknown arms"):
        Study(**{**study.__dict__, "tables": (Table("p", "seeds", (V,), arms=("x",)),)})


@pytest.mark.parametrize("study", [ITERATIVE_GRPO, ITERATIVE_PERSONA], ids=lambda s: s.name)
def test_iterative_studies_run_iterate_and_train_from_one_warm_start(
    study: Study, tmp_path: Path
) -> None:
    """examples/iterative_grpo/run.py's matrix: per setting and seed one warm start
    (``turnrl iterate``, no iteration); Iterative GRPO arms iterate from it, online GRPO
    trains from it; the seed reaches each command under its own name."""
    every = cells(study, tmp_path)
    base = tmp_path / "runs" / "studies" / study.name
    warm = next(c for c in every if c.key == "warm/split_money/ws2")
    assert warm.argv[:5] == (sys.executable, "-m", "turnrl.cli", "iterate", "--quiet")
    assert {"env.name=split_money", "iterations=0", "seed=2"} <= set(warm.argv)
    init = f"warm_start.init_from={base}/warm/split_money/ws2/warm_start"
    online = next(c for c in every if c.key == "split_money/online-grpo/seed2")
    assert online.argv[3] == "train"
    assert online.argv[6] == str(tmp_path / "examples/iterative_grpo/online.toml")
    assert {"env.name=split_money", init, "train.seed=2"} <= set(online.argv)
    for cell in every:
        if not cell.is_warm_start and cell.arm != "online-grpo" and cell.seed == 2:
            assert cell.argv[3] == "iterate"
            assert cell.setting != "split_money" or {init, "seed=2", "threads=1"} <= set(cell.argv)
    persona = [a for a in warm.argv if a.startswith("warm_start.persona_styles")]
    assert persona == (
        ['warm_start.persona_styles={ "Negotiate hard." = "strong" }']
        if study is ITERATIVE_PERSONA
        else []
    )


def test_online_recipe_loads_and_matches_the_iterate_budget() -> None:
    """24 steps x 16 conversations = 3 iterations x 128: the equal-conversations rule."""
    from turnrl.train.config import RunConfig, load_config
    from turnrl.train.iterate.config import IterateConfig

    root = Path(__file__).resolve().parents[1]
    online = load_config(RunConfig, root / "examples/iterative_grpo/online.toml", [])
    iterate = load_config(IterateConfig, root / "examples/iterate_haggle.toml", [])
    per_step = online.rollout.tasks_per_step * online.rollout.group_size
    per_iteration = iterate.deploy.tasks_per_iteration * iterate.deploy.conversations_per_task
    assert online.train.steps * per_step == iterate.iterations * per_iteration == 384
    assert online.train.lr == iterate.improve.lr and online.train.kl_coef == iterate.improve.kl_coef
    assert json.loads(json.dumps(online.env.env_kwargs)) == {"max_turns": 6}
