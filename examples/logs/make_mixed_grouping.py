"""Write ``mixed_grouping.jsonl``: a calculator-agent log shaped like the legacy case.

Several rollouts of each question; tool-using rollouts take two turns (call, then
answer), direct answers take one. This is the shape of the Agent Lightning #489
report, where every LLM call of every rollout shared the question's group id.
The first question reproduces that report's numbers exactly (two 2-turn tool
rollouts with reward 1, two direct answers with reward 0).

Run: ``python examples/logs/make_mixed_grouping.py`` (deterministic).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SYSTEM = {
    "role": "system",
    "content": "Use <call>EXPR</call> for the calculator. Reply <answer>N</answer>.",
}


def rollout(
    task_id: str, traj_id: str, a: int, b: int, use_tool: bool, correct: bool
) -> list[dict]:
    question = [SYSTEM, {"role": "user", "content": f"Compute {a}*{b}."}]
    answer = a * b if correct else a * b + 10
    if not use_tool:
        return [
            dict(
                task_id=task_id,
                traj_id=traj_id,
                turn=0,
                prompt=question,
                response=f"<answer>{answer}</answer>",
                reward=float(correct),
                done=True,
            )
        ]
    call = f"<call>{a}*{b}</call>"
    after_call = [
        *question,
        {"role": "assistant", "content": call},
        {"role": "tool", "content": str(a * b)},
    ]
    return [
        dict(
            task_id=task_id,
            traj_id=traj_id,
            turn=0,
            prompt=question,
            response=call,
            reward=0.0,
            done=False,
        ),
        dict(
            task_id=task_id,
            traj_id=traj_id,
            turn=1,
            prompt=after_call,
            response=f"<answer>{answer}</answer>",
            reward=float(correct),
            done=True,
        ),
    ]


def main() -> None:
    rng = random.Random(489)
    rows: list[dict] = []
    # The reported case: 2 tool rollouts (reward 1), 2 direct answers (reward 0).
    plan = [[(True, True), (True, True), (False, False), (False, False)]]
    for _ in range(7):
        plan.append([(rng.random() < 0.5, False) for _ in range(4)])
    for t, rollouts in enumerate(plan):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        for r, (use_tool, correct) in enumerate(rollouts):
            if t > 0:
                correct = (use_tool and rng.random() < 0.9) or (not use_tool and rng.random() < 0.1)
            rows += rollout(f"calc-{t}", f"calc-{t}-r{r}", a, b, use_tool, correct)
    out = Path(__file__).with_name("mixed_grouping.jsonl")
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} records to {out}")


if __name__ == "__main__":
    main()
