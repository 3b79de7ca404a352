"""An in-process agent whose every call carries a seed derived from its rollout id and
call index, so what it samples does not depend on which process runs the gateway or on
timing: the agent-loop runs of tests/test_distributed_agent.py compare equal records."""

from __future__ import annotations

import zlib
from typing import Any


def seeded_two_calls(task: dict[str, Any], llm: Any) -> float:
    """Two calls (the second extends the first), each seeded by ``(rollout, call)``; the
    reward is the last reply's first character code / 1000 (a group almost always has
    non-zero advantages)."""
    client = llm.openai_client()
    messages = [{"role": "user", "content": task["question"]}]
    reply = ""
    for call in range(2):
        seed = zlib.crc32(f"{llm.rollout_id}/{call}".encode())
        response = client.chat.completions.create(
            model=llm.model, messages=messages, max_tokens=8, seed=seed
        )
        reply = response.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Again."}]
    return ord(reply[0]) / 1000 if reply else 0.0
