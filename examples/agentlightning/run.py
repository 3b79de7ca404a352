"""Agent Lightning rollouts -> turn records -> audit -> turnrl credit, end to end.

Reads ``rollouts.jsonl`` (Agent Lightning rollout dumps: several rollouts of one
question with different numbers of LLM calls), converts them with
``turnrl.integrations.agentlightning``, writes ``runs/agl-turns.jsonl`` (turn
records), prints the audit of the grouping, then the advantage of every triplet
under Agent Lightning's default grouping (``grpo_mixed``: one group per question,
every triplet scored with its rollout's final reward) and under two turnrl
replacements. Needs only turnrl (the dumps are plain JSON)::

    python examples/agentlightning/run.py
"""

from __future__ import annotations

from pathlib import Path

from turnrl.credit import compute_advantages
from turnrl.credit.audit import audit, format_audit
from turnrl.integrations.agentlightning import read_rollouts_jsonl, rollouts_to_records
from turnrl.io import atomic_write_text
from turnrl.records import dumps_record
from turnrl.table import TurnTable

HERE = Path(__file__).resolve().parent
ESTIMATORS = ("grpo_mixed", "turn_group", "node")


def main() -> None:
    rollouts = read_rollouts_jsonl(HERE / "rollouts.jsonl")
    records = rollouts_to_records(rollouts)
    out = Path("runs") / "agl-turns.jsonl"
    out.parent.mkdir(exist_ok=True)
    atomic_write_text(out, "".join(dumps_record(r) + "\n" for r in records))
    print(f"{len(rollouts)} rollouts -> {len(records)} turn records -> {out}\n")

    table = TurnTable.from_jsonl(out)
    print(format_audit(audit(table, list(ESTIMATORS))))

    advantages = {name: compute_advantages(table, name) for name in ESTIMATORS}
    print("\nadvantage of each triplet (grpo_mixed = Agent Lightning's default grouping)")
    print(f"{'rollout':12} {'turn':>4} {'reward':>6} " + " ".join(f"{n:>10}" for n in ESTIMATORS))
    for row in table.traj_order:
        traj = table.traj_names[table.traj_code[row]]
        cells = " ".join(f"{advantages[n][row]:>10.3f}" for n in ESTIMATORS)
        print(f"{traj:12} {table.turn[row]:>4} {table.reward[row]:>6.1f} {cells}")


if __name__ == "__main__":
    main()
