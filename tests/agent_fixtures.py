"""Agent programs for the agent-loop tests: well-behaved ones and every kind of bad one.

Used as ``agent.entrypoint = "<this file>:NAME"`` or run as a command
(``python agent_fixtures.py NAME``). Each good agent logs what it sent and got
to ``$TURNRL_TEST_LOG`` (one JSON line per call) when that is set, so tests can
compare it with the turn records.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

QUESTION_PROMPT = "Say a number."


def _log(entry: dict[str, Any]) -> None:
    path = os.environ.get("TURNRL_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")


def _chat(client: Any, model: str, messages: list[dict[str, Any]], rollout: str) -> str:
    response = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
    content = response.choices[0].message.content or ""
    _log({"rollout": rollout, "sent": messages, "got": content})
    return content


def parity(text: str) -> float:
    """The reward of the fixtures: 1 if the reply starts with an odd character code, else 0
    (about half of a random model's replies, so groups have something to learn)."""
    return float(ord(text[0]) % 2) if text else 0.0


def two_calls(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    """Two calls (the second extends the first); the reward is the last reply's parity."""
    client = llm.openai_client()
    messages = [{"role": "user", "content": task["question"]}]
    first = _chat(client, llm.model, messages, llm.rollout_id)
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "Again."}]
    second = _chat(client, llm.model, messages, llm.rollout_id)
    return {"reward": parity(second), "info": {"success": parity(second) == 1.0}}


def best_of_three(task: dict[str, Any], llm: Any) -> float:
    """One call with ``n = 3`` whose choices the agent votes on and never continues:
    the gateway keeps choice 0 untrained (no later call says which was kept), so no
    row of the step trains."""
    client = llm.openai_client()
    messages = [{"role": "user", "content": task["question"]}]
    answer = client.chat.completions.create(model=llm.model, messages=messages, max_tokens=8, n=3)
    return max(parity(choice.message.content or "") for choice in answer.choices)


def two_calls_graded(task: dict[str, Any], llm: Any) -> float:
    """``two_calls`` with a reward that differs between almost any two replies (the
    first character's code / 1000), so a group has non-zero advantages (a test that
    needs the update to change the weights does not depend on luck)."""
    client = llm.openai_client()
    messages = [{"role": "user", "content": task["question"]}]
    first = _chat(client, llm.model, messages, llm.rollout_id)
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "Again."}]
    second = _chat(client, llm.model, messages, llm.rollout_id)
    return ord(second[0]) / 1000 if second else 0.0


class PushGate:
    """Holds the rollouts whose id starts with ``prefix`` between their two calls until
    ``pushed`` is set, and counts their first calls (``first_calls``): a test of partial
    rollouts (tests/test_async_agent_loop.py) makes the trainer's update wait for the
    first calls and opens the gate after the new weights are served, so each such
    rollout's two calls are sampled by two versions, whatever the timing."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.first_calls = threading.Semaphore(0)
        self.pushed = threading.Event()


PUSH_GATE: PushGate | None = None
"""Set by a test that imports this module by name (``agent_fixtures:across_a_push``)."""


def across_a_push(task: dict[str, Any], llm: Any) -> float:
    """``two_calls_graded``, held at :data:`PUSH_GATE` between the two calls."""
    client = llm.openai_client()
    messages = [{"role": "user", "content": task["question"]}]
    first = _chat(client, llm.model, messages, llm.rollout_id)
    gate = PUSH_GATE
    if gate is not None and llm.rollout_id.startswith(gate.prefix):
        gate.first_calls.release()
        if not gate.pushed.wait(120):
            raise TimeoutError("the push the test waits for never came")
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "Again."}]
    second = _chat(client, llm.model, messages, llm.rollout_id)
    return ord(second[0]) / 1000 if second else 0.0


async def async_two_roles(task: dict[str, Any], llm: Any) -> float:
    """An async agent with two roles: a solver call, then a checker call."""
    client = llm.async_openai_client()
    messages = [{"role": "user", "content": task["question"]}]
    solver = await client.chat.completions.create(model="solver", messages=messages, max_tokens=6)
    answer = solver.choices[0].message.content or ""
    check = [{"role": "user", "content": f"Is {answer!r} right?"}]
    checker = await client.chat.completions.create(model="checker", messages=check, max_tokens=4)
    return parity(checker.choices[0].message.content or "")


def raises(task: dict[str, Any], llm: Any) -> float:
    _chat(llm.openai_client(), llm.model, [{"role": "user", "content": "hi"}], llm.rollout_id)
    raise ValueError(f"boom on {task['task_id']}")


def hangs(task: dict[str, Any], llm: Any) -> float:
    time.sleep(3600)
    return 1.0


async def async_hangs(task: dict[str, Any], llm: Any) -> float:
    await asyncio.sleep(3600)
    return 1.0


def no_reward(task: dict[str, Any], llm: Any) -> None:
    _chat(llm.openai_client(), llm.model, [{"role": "user", "content": "hi"}], llm.rollout_id)


def nan_reward(task: dict[str, Any], llm: Any) -> float:
    _chat(llm.openai_client(), llm.model, [{"role": "user", "content": "hi"}], llm.rollout_id)
    return float("nan")


def no_call(task: dict[str, Any], llm: Any) -> float:
    return 1.0


def posts_reward(task: dict[str, Any], llm: Any) -> None:
    _chat(llm.openai_client(), llm.model, [{"role": "user", "content": "hi"}], llm.rollout_id)
    _post(llm.reward_url, 0.25, llm.api_key)


def fails_on_odd(task: dict[str, Any], llm: Any) -> float:
    """Fails for tasks whose number is odd, else one call and reward 1."""
    if int(task["task_id"].rsplit("-", 1)[-1]) % 2:
        raise RuntimeError("odd task")
    _chat(llm.openai_client(), llm.model, [{"role": "user", "content": "hi"}], llm.rollout_id)
    return 1.0


def wrong_signature(task: dict[str, Any]) -> float:
    return 0.0


def _post(url: str, reward: float, api_key: str) -> None:
    request = urllib.request.Request(
        url,
        data=json.dumps({"reward": reward}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=30).read()


# ------------------------------------------------------------------------- as a command


class _RawClient:
    """Just enough of ``openai.OpenAI`` for ``_chat``, over urllib (no slow imports)."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.chat = self
        self.completions = self

    def create(self, **body: Any) -> Any:
        request = urllib.request.Request(
            f"{self.base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
            method="POST",
        )
        reply = json.loads(urllib.request.urlopen(request, timeout=60).read())
        message = type("Message", (), {"content": reply["choices"][0]["message"]["content"]})
        choice = type("Choice", (), {"message": message})
        return type("Response", (), {"choices": [choice]})


def _command(name: str) -> int:
    if name == "hangs":  # first, before slow imports: the test's timeout is short
        # A grandchild in the same process group: it must be killed with the command.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(os.environ["TURNRL_TEST_PIDS"], "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {child.pid}\n")
        print("about to hang", file=sys.stderr, flush=True)
        time.sleep(3600)
    task = json.loads(os.environ["TURNRL_TASK"])
    client = _RawClient(os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"])
    model = os.environ["OPENAI_MODEL"]
    rollout = os.environ["TURNRL_ROLLOUT_ID"]
    if name == "good":
        messages = [{"role": "user", "content": task["question"]}]
        reply = _chat(client, model, messages, rollout)
        print("some chatter on stdout")
        print(json.dumps({"reward": parity(reply), "info": {"success": True}}))
    elif name == "posts":
        _chat(client, model, [{"role": "user", "content": "hi"}], rollout)
        _post(os.environ["TURNRL_REWARD_URL"], 0.75, os.environ["OPENAI_API_KEY"])
    elif name == "exits":
        _chat(client, model, [{"role": "user", "content": "hi"}], rollout)
        print("something went wrong in the agent", file=sys.stderr)
        return 3
    elif name == "silent":
        _chat(client, model, [{"role": "user", "content": "hi"}], rollout)
        print("no reward line")
    elif name == "nan":
        _chat(client, model, [{"role": "user", "content": "hi"}], rollout)
        print('{"reward": NaN}')
    return 0


if __name__ == "__main__":
    sys.exit(_command(sys.argv[1]))
