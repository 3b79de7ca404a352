"""Advantages for a verl-shaped batch: turnrl estimators vs verl's built-in GRPO, same run.

Run (in the verl venv, see requirements/integrations.txt)::

    .venv-integrations/bin/python benchmarks/verl_adv.py

Two synthetic batches of 65,536 rows and 256 response tokens (seed 0):

* **trajectory rows** (verl's multi-turn agent loop): one row per trajectory, 8 rows
  per ``uid``, 1-4 assistant segments per row separated by tool tokens (mask 0),
  the outcome reward on the last assistant token;
* **turn rows** (Agent Lightning's transition batches): one row per LLM call, 8
  trajectories of 1-7 turns per task, final reward on the last turn.

Every method is called the way verl calls it (``get_adv_estimator_fn(name)(...)``
with torch tensors, or verl's ``compute_advantage`` on a ``DataProto`` for the
hook); times include everything from tensors in to advantage tensor out. verl's
``grpo`` and ``turnrl_grpo`` are checked to give the same advantages on the
trajectory rows (``torch.allclose``, atol 1e-5). Results go to the
"## verl-shaped batch" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("VERL_USE_EXTERNAL_PLUGINS", "none")
from verl import DataProto
from verl.trainer.ppo import core_algos, ray_trainer

from turnrl.credit import compute_credit
from turnrl.integrations.tokens import build_table, scatter_to_tokens, split_turns
from turnrl.integrations.verl import hook, turnrl_uid

sys.path.insert(0, str(Path(__file__).parent))
from results_file import replace_section

SECTION = "## verl-shaped batch"
COMMAND = ".venv-integrations/bin/python benchmarks/verl_adv.py"


def trajectory_rows(n_rows: int, length: int, group: int, rng: np.random.Generator) -> dict:
    """One row per trajectory: 1-4 assistant segments of 8-48 tokens, 4-16 tool tokens apart."""
    mask = np.zeros((n_rows, length), dtype=np.int64)
    rewards = np.zeros((n_rows, length), dtype=np.float32)
    n_segments = rng.integers(1, 5, size=n_rows)
    seg_len = rng.integers(8, 49, size=(n_rows, 4))
    gap = rng.integers(4, 17, size=(n_rows, 4))
    outcome = rng.integers(0, 2, size=n_rows).astype(np.float32)
    for r in range(n_rows):  # data generation only (not timed)
        pos = 0
        for k in range(n_segments[r]):
            end = min(pos + seg_len[r, k], length)
            mask[r, pos:end] = 1
            last = end - 1
            pos = end + gap[r, k]
            if pos >= length - 1:
                break
        rewards[r, last] = outcome[r]
    uids = np.array([f"prompt-{r // group}" for r in range(n_rows)], dtype=object)
    return {
        "token_level_rewards": torch.from_numpy(rewards),
        "response_mask": torch.from_numpy(mask),
        "uid": uids,
    }


def turn_rows(n_rows: int, length: int, group: int, rng: np.random.Generator) -> dict:
    """One row per turn: trajectories of 1-7 turns, ``group`` per task; reward on the last turn."""
    task, traj, turn, final = [], [], [], []
    t = 0
    while len(turn) < n_rows:
        n = int(rng.integers(1, 8))
        for k in range(n):
            task.append(f"q{t // group}")
            traj.append(f"traj{t}")
            turn.append(k)
            final.append(k == n - 1)
        t += 1
    task, traj, turn = task[:n_rows], traj[:n_rows], np.array(turn[:n_rows])
    final = np.array(final[:n_rows])
    final[-1] = True
    lengths = rng.integers(8, length + 1, size=n_rows)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    rewards = np.zeros((n_rows, length), dtype=np.float32)
    rewards[np.arange(n_rows), lengths - 1] = final * rng.integers(0, 2, size=n_rows)
    return {
        "token_level_rewards": torch.from_numpy(rewards),
        "response_mask": torch.from_numpy(mask),
        "task": np.array(task, dtype=object),
        "traj": np.array(traj, dtype=object),
        "turn": turn,
    }


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Best wall time of ``repeats`` calls (one call if the first takes over 5 s)."""
    best, result = float("inf"), None
    for i in range(repeats):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
        if i == 0 and best > 5.0:
            break
    return best, result


def verl_call(name: str, cols: dict, index: np.ndarray) -> Callable[[], object]:
    fn = core_algos.get_adv_estimator_fn(name)
    return lambda: fn(
        token_level_rewards=cols["token_level_rewards"],
        response_mask=cols["response_mask"],
        index=index,
        config=None,
    )[0]


def stage_times(cols: dict, repeats: int) -> str:
    """Where turnrl_turn_group's time goes on the trajectory rows."""
    mask = cols["response_mask"].numpy()
    rewards = cols["token_level_rewards"].numpy()
    t_split, turns = timed(lambda: split_turns(mask, one_turn_per_row=False), repeats)
    t_table, table = timed(lambda: build_table(turns, rewards, task_id=cols["uid"]), repeats)
    t_est, credit = timed(lambda: compute_credit(table, "turn_group"), repeats)
    t_scatter, _ = timed(lambda: scatter_to_tokens(credit.advantages, turns), repeats)
    return (
        f"turnrl_turn_group on the trajectory rows ({table.n_rows:,} turns), by stage: "
        f"split mask into turns {t_split * 1e3:.0f} ms, build TurnTable {t_table * 1e3:.0f} ms "
        f"(factorising the string uids), estimator {t_est * 1e3:.0f} ms, "
        f"scatter to tokens {t_scatter * 1e3:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=65_536)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    load = os.getloadavg()[0]
    traj_cols = trajectory_rows(args.rows, args.length, 8, rng)
    turn_cols = turn_rows(args.rows, args.length, 8, rng)
    structured = np.array(
        [
            turnrl_uid(task, traj_id=traj, turn=int(k))
            for task, traj, k in zip(
                turn_cols["task"], turn_cols["traj"], turn_cols["turn"], strict=True
            )
        ],
        dtype=object,
    )
    hook.install()
    batch = DataProto.from_dict(
        tensors={k: turn_cols[k] for k in ("token_level_rewards", "response_mask")},
        non_tensors={
            "uid": turn_cols["task"],
            "turnrl_traj_id": turn_cols["traj"],
            "turnrl_turn": turn_cols["turn"],
        },
    )

    cases = [
        (
            "trajectory rows",
            "verl `grpo` (built-in)",
            verl_call("grpo", traj_cols, traj_cols["uid"]),
        ),
        (
            "trajectory rows",
            "verl `grpo_vectorized` (built-in)",
            verl_call("grpo_vectorized", traj_cols, traj_cols["uid"]),
        ),
        (
            "trajectory rows",
            "`turnrl_grpo` (segments)",
            verl_call("turnrl_grpo", traj_cols, traj_cols["uid"]),
        ),
        (
            "trajectory rows",
            "`turnrl_turn_group` (segments)",
            verl_call("turnrl_turn_group", traj_cols, traj_cols["uid"]),
        ),
        (
            "turn rows",
            "verl `grpo` (built-in, uid = task)",
            verl_call("grpo", turn_cols, turn_cols["task"]),
        ),
        (
            "turn rows",
            "`turnrl_turn_group` (structured uids)",
            verl_call("turnrl_turn_group", turn_cols, structured),
        ),
        (
            "turn rows",
            "`turnrl_turn_group` (hook: batch fields)",
            lambda: ray_trainer.compute_advantage(batch, adv_estimator="turnrl_turn_group").batch[
                "advantages"
            ],
        ),
    ]
    results = {}
    rows = []
    for layout, label, fn in cases:
        seconds, adv = timed(fn, args.repeats)
        results[label] = adv
        rows.append((layout, label, seconds))
        print(f"{layout:16} {label:42} {seconds * 1e3:10.1f} ms", flush=True)
    same = torch.allclose(
        results["verl `grpo` (built-in)"].float(), results["`turnrl_grpo` (segments)"], atol=1e-5
    )
    print(f"verl grpo == turnrl_grpo on trajectory rows: {same}")
    breakdown = stage_times(traj_cols, args.repeats)
    print(breakdown)

    base = {layout: s for layout, label, s in rows if label.startswith("verl `grpo` (built-in")}
    lines = [
        "| batch | method | time (best of 3) | speedup vs verl `grpo` |",
        "|---|---|---:|---:|",
        *[
            f"| {layout} | {label} | {s * 1e3:,.1f} ms | {base[layout] / s:.1f}x |"
            for layout, label, s in rows
        ],
    ]
    n_segments = int(
        split_turns(traj_cols["response_mask"].numpy(), one_turn_per_row=False).n_turns
    )
    text = "\n".join(
        [
            SECTION,
            "",
            f"- command: `{COMMAND}`",
            f"- date: {dt.datetime.now():%Y-%m-%d %H:%M}",
            f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, torch {torch.__version__} (1 thread), numpy "
            f"{np.__version__}; shared with other agents' jobs (1-min load average {load:.1f} at "
            "start), so absolute times are noisy; ratios compare runs in the same process",
            f"- data (seed 0): {args.rows:,} rows x {args.length} response tokens each. Trajectory "
            f"rows: 8 rows per uid, {n_segments:,} assistant segments (1-4 per row) separated by "
            "tool tokens, outcome reward on the last assistant token. Turn rows: one row per LLM "
            "call, 8 trajectories of 1-7 turns per task, reward on the final turn",
            "- method: each estimator called as verl calls it (`get_adv_estimator_fn(name)` on "
            "torch tensors, or verl's `compute_advantage` on a `DataProto` with the turnrl hook "
            "installed); times cover tensors in to `(bs, L)` advantages out, including the "
            "turnrl conversion (mask -> turns -> TurnTable -> estimator -> tokens)",
            f"- check: verl `grpo` and `turnrl_grpo` give the same advantages on the trajectory "
            f"rows (`torch.allclose`, atol 1e-5): {'yes' if same else 'NO'}",
            f"- {breakdown}",
            "",
            *lines,
            "",
        ]
    )
    if not args.no_write:
        replace_section(SECTION, text)
        print(f"written to the {SECTION!r} section of benchmarks/RESULTS.md")


if __name__ == "__main__":
    main()
