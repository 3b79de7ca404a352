"""Write rollouts.jsonl: Agent Lightning rollout dumps of the shape users report.

Two questions, four rollouts each, with 1 to 4 LLM calls per rollout (a tool-using
agent: call, tool result, call, ...). Every rollout of a question starts from the
same prompt tokens; each later prompt is the previous prompt, the response and the
tool result, as Agent Lightning's tracer records them. Rollouts that call the tool
more often succeed more often here, so the default grouping (one group per
question, every triplet scored with its rollout's final reward) weights long
rollouts up. Deterministic: ``python examples/agentlightning/make_rollouts.py``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUESTIONS = {"q-17": [101, 7, 19, 5], "q-42": [101, 7, 23, 11, 2]}
# (number of LLM calls, final reward) for the four rollouts of each question
PLANS = {
    "q-17": [(1, 0.0), (2, 0.0), (3, 1.0), (4, 1.0)],
    "q-42": [(1, 1.0), (3, 0.0), (2, 1.0), (4, 1.0)],
}


def rollout(data_id: str, index: int, n_calls: int, final: float, rng: random.Random) -> dict:
    prompt = list(QUESTIONS[data_id])
    triplets = []
    for call in range(n_calls):
        response = [rng.randrange(200, 300) for _ in range(rng.randint(2, 4))] + [2]
        last = call == n_calls - 1
        triplets.append(
            {
                "prompt": {"token_ids": list(prompt)},
                "response": {
                    "token_ids": response,
                    "logprobs": [{"logprob": round(-rng.random(), 4)} for _ in response],
                },
                # Agent Lightning matches the emitted reward span to the last LLM call
                "reward": final if last else None,
                "metadata": {"agent_name": "solver", "response_id": f"{data_id}-{index}-{call}"},
            }
        )
        tool_result = [rng.randrange(300, 400) for _ in range(3)]
        prompt = prompt + response + tool_result
    return {
        "rollout_id": f"ro-{data_id}-{index}",
        "final_reward": final,
        "triplets": triplets,
        "metadata": {"data_id": data_id},
    }


def main() -> None:
    rng = random.Random(0)
    lines = [
        json.dumps(rollout(data_id, i, n, final, rng))
        for data_id, plan in PLANS.items()
        for i, (n, final) in enumerate(plan)
    ]
    (HERE / "rollouts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
