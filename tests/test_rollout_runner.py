"""The batched rollout runner: exact tokens across turns, malformed and truncated responses."""

from __future__ import annotations

import torch

from builders import TokenizerPolicy
from turnrl import TurnTable
from turnrl.envs import make_env, make_tasks
from turnrl.policy import build_tiny_policy
from turnrl.rollout import run_episodes
from turnrl.types import Sample, TurnRecord

torch.set_num_threads(1)


class ScriptedPolicy(TokenizerPolicy):
    """The tiny policy's tokenizer, but responses are scripted per (task, turn)."""

    def __init__(self, script, max_context=None):
        super().__init__(max_context)
        self.script = script
        self.calls = []

    def sample(self, contexts, *, max_new_tokens, temperature=1.0, seed=None):
        self.calls.append(len(contexts))
        out = []
        for context in contexts:
            text, stop = self.script(self.decode(context))
            ids = self.tokens(text)[:max_new_tokens]
            if stop and len(ids) < max_new_tokens:
                ids = [*ids, self.eos_token_id]
                reason = "stop"
            else:
                reason = "length"
            out.append(Sample(ids, [-0.5] * len(ids), reason, self.decode(ids)))
        return out


def tool_then_answer(context: str):
    """Turn 0: call the calculator on the question; turn 1: answer with the tool result."""
    if "t:" not in context:
        expression = context.split("Compute ")[1].split(".")[0]
        return f"<call>{expression}</call>", True
    result = context.rsplit("t:", 1)[1].split("<|im_end|>")[0]
    return f"<answer>{result}</answer>", True


def test_contexts_grow_by_appending_exact_tokens() -> None:
    policy = ScriptedPolicy(tool_then_answer)
    tasks = make_tasks("calculator", 4, seed=1)
    batch = run_episodes(
        policy,
        lambda: make_env("calculator"),
        tasks,
        group_size=2,
        max_new_tokens=40,
        temperature=1.0,
        seed=0,
    )
    assert policy.calls == [8, 8]  # one batched call per turn, all episodes together
    table = TurnTable.from_records(batch.records)  # records are valid turn records
    assert table.n_trajectories == 8 and table.n_rows == 16
    by_traj: dict[str, list[TurnRecord]] = {}
    for record in batch.records:
        by_traj.setdefault(record.traj_id, []).append(record)
    for turns in by_traj.values():
        first, second = turns
        # turn 1's context = turn 0's context + sampled ids + the observation's ids, exactly
        assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids
        tail = second.prompt_ids[len(first.prompt_ids) :]
        assert tail[: len(first.response_ids)] == first.response_ids
        # ...and equals the chat template's rendering of the whole conversation
        rendered = policy.inner.tokenizer.apply_chat_template(
            _conversation(policy, first, second), add_generation_prompt=True, tokenize=False
        )
        assert policy.inner.tokenizer(rendered, add_special_tokens=False)["input_ids"] == list(
            second.prompt_ids
        )
        assert second.reward == 1.0 and second.done and first.tool_call
    assert all(e.correct and e.opened_with_tool for e in batch.episodes)


def _conversation(policy, first, second):
    text = policy.decode(first.prompt_ids)
    question = text.split("u:")[1].split("<|im_end|>")[0]
    system = text.split("s:")[1].split("<|im_end|>")[0]
    tool = policy.decode(second.prompt_ids).rsplit("t:", 1)[1].split("<|im_end|>")[0]
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
        {"role": "assistant", "content": first.response},
        {"role": "tool", "content": tool},
    ]


def test_malformed_and_truncated_responses_are_observations_not_crashes() -> None:
    def script(context: str):
        if "Invalid" not in context:
            return "<call>" + "1+" * 20, False  # cut at max_new_tokens, no end token
        return "<answer>0</answer>", True

    policy = ScriptedPolicy(script)
    tasks = make_tasks("calculator", 2, seed=3)
    batch = run_episodes(
        policy,
        lambda: make_env("calculator"),
        tasks,
        group_size=1,
        max_new_tokens=20,
        temperature=1.0,
        seed=0,
    )
    first = [r for r in batch.records if r.turn == 0]
    assert all(r.stop_reason == "length" and r.malformed for r in first)
    second = [r for r in batch.records if r.turn == 1]
    for a, b in zip(first, second, strict=True):
        # the unsampled end-of-turn token closes the truncated turn inside the next context
        start = len(a.prompt_ids) + len(a.response_ids)
        assert b.prompt_ids[start] == policy.eos_token_id
        assert policy.eos_token_id not in a.response_ids
    assert all(e.malformed == 1 and e.truncated_responses == 1 for e in batch.episodes)


def test_episodes_stop_when_the_context_is_full() -> None:
    policy = ScriptedPolicy(lambda c: ("<call>1+1</call>", True), max_context=140)
    tasks = make_tasks("calculator", 1, seed=0)
    batch = run_episodes(
        policy,
        lambda: make_env("calculator", max_turns=10),
        tasks,
        group_size=1,
        max_new_tokens=30,
        temperature=1.0,
        seed=0,
    )
    (episode,) = batch.episodes
    assert episode.end == "context" and 1 <= episode.turn < 10


def test_real_tiny_policy_records_match_sampling_logprobs() -> None:
    policy = build_tiny_policy(0)
    tasks = make_tasks("calculator", 2, seed=0)
    batch = run_episodes(
        policy,
        lambda: make_env("calculator"),
        tasks,
        group_size=2,
        max_new_tokens=8,
        temperature=1.0,
        seed=5,
    )
    contexts = [r.prompt_ids for r in batch.records]
    responses = [r.response_ids for r in batch.records]
    logp, _ = policy.response_logprobs(contexts, responses)
    for i, record in enumerate(batch.records):
        n = len(record.response_ids)
        assert torch.allclose(logp[i, :n], torch.tensor(record.logprobs), atol=1e-5)


def test_truncation_zero_reward_ends_the_episode_at_a_cut_response() -> None:
    def script(context: str):
        if "t:" not in context:
            return "<call>" + "1+" * 20, False  # cut at max_new_tokens, no end token
        return "<answer>0</answer>", True

    tasks = make_tasks("calculator", 2, seed=3)
    batch = run_episodes(
        ScriptedPolicy(script),
        lambda: make_env("calculator", truncation="zero_reward", turn_cost=0.1),
        tasks,
        group_size=2,
        max_new_tokens=20,
        temperature=1.0,
        seed=0,
    )
    assert [r.turn for r in batch.records] == [0, 0, 0, 0]  # no retry turn
    assert all(r.stop_reason == "length" and r.done for r in batch.records)
    assert all(r.reward == -0.1 and not r.malformed for r in batch.records)
    assert all(e.correct is False and e.outcome == -0.1 for e in batch.episodes)
    assert all(e.truncated_responses == 1 and e.turn == 1 for e in batch.episodes)
    assert all(e.opened_with_tool is False for e in batch.episodes)


def test_tool_open_rate_counts_tool_calls_at_turn_zero_only() -> None:
    from turnrl.train.metrics import episode_metrics

    def script(context: str):  # "a+b": answer at once; "a-b": a malformed turn, then a call
        if "+" in context.split("Compute ")[1].split(".")[0]:
            return "<answer>0</answer>", True
        if "Invalid" not in context:
            return "<call>", True
        return "<call>1+1</call>" if "t:" not in context else "<answer>2</answer>", True

    tasks = [t for t in make_tasks("calculator", 40, seed=5) if t.tags == ("easy",)][:6]
    batch = run_episodes(
        ScriptedPolicy(script),
        lambda: make_env("calculator"),
        tasks,
        group_size=1,
        max_new_tokens=30,
        temperature=1.0,
        seed=0,
    )
    direct = ["+" in t.payload["expression"] for t in tasks]
    assert 0 < sum(direct) < len(tasks)
    metrics = episode_metrics(batch.episodes)
    assert metrics["tool_open_rate"] == 0.0  # every tool call came after turn 0
    assert metrics["tool_rate"] == (len(tasks) - sum(direct)) / len(tasks)
