"""turnrl inside the real TRL: env rollouts as rollout_func, turnrl advantages in GRPOTrainer.

Runs in the Agent Lightning + TRL venv (requirements/integrations-agl.txt); skipped where trl
is not installed. One training step on the tiny offline model, on CPU.
"""

from __future__ import annotations

import dataclasses
import os
from typing import ClassVar

import numpy as np
import pytest

pytest.importorskip("trl", reason="trl is not installed (see requirements/integrations-agl.txt)")
torch = pytest.importorskip("torch")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl import GRPOConfig  # noqa: E402

from turnrl.credit import compute_advantages  # noqa: E402
from turnrl.integrations.trl import (  # noqa: E402
    TurnRLGRPOTrainer,
    episode_completion,
    make_rollout_func,
    outcome_reward,
    task_dataset,
)
from turnrl.policy import HFPolicy, build_tiny_model, build_tiny_tokenizer  # noqa: E402
from turnrl.table import TurnTable  # noqa: E402
from turnrl.types import Env, StepResult, Task, TurnRecord  # noqa: E402

torch.set_num_threads(1)


def test_episode_completion_concatenates_turns_with_env_mask() -> None:
    records = [
        TurnRecord(task_id="t", traj_id="a", turn=0, prompt_ids=[1, 2], response_ids=[5, 6],
                   logprobs=[-0.1, -0.2], reward=0.0, state_key="s0"),
        TurnRecord(task_id="t", traj_id="a", turn=1, prompt_ids=[1, 2, 5, 6, 8, 9],
                   response_ids=[7], logprobs=[-0.3], reward=1.0, state_key="s1"),
    ]  # fmt: skip
    out = episode_completion(records)
    assert out["prompt_ids"] == [1, 2]
    assert out["completion_ids"] == [5, 6, 8, 9, 7]
    assert out["env_mask"] == [1, 1, 0, 0, 1]
    assert out["logprobs"] == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert out["turnrl_turn_rewards"] == [0.0, 1.0]
    assert out["turnrl_outcome"] == 1.0
    records[1] = dataclasses.replace(records[1], prompt_ids=[1, 3, 5, 6])
    with pytest.raises(ValueError, match="does not extend"):
        episode_completion(records)


class VowelEnv(Env):
    """Two turns; each turn's reward is the share of vowels in the response (varies by sample)."""

    def reset(self, task: Task) -> list[dict[str, str]]:
        self.turn = 0
        return [{"role": "user", "content": f"task {task.task_id}: say vowels"}]

    def step(self, response: str) -> StepResult:
        self.turn += 1
        reward = sum(c in "aeiou" for c in response) / max(len(response), 1)
        done = self.turn == 2
        observation = None if done else {"role": "user", "content": "again"}
        return StepResult(observation, reward, done, {"state_key": f"turn{self.turn}"})

    def snapshot(self) -> int:
        return self.turn

    def restore(self, snapshot: int) -> None:
        self.turn = snapshot


class Recorder(TurnRLGRPOTrainer):
    """Keeps what the step trained on, to compare with turnrl on the same rows."""

    seen: ClassVar[list[tuple[list[dict], dict]]] = []

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        Recorder.seen.append(([dict(row) for row in inputs], output))
        return output


@pytest.mark.parametrize("load", ["built", "saved"])
def test_one_training_step_on_the_tiny_model(tmp_path, load: str) -> None:
    """``saved``: the model and tokenizer come back through the standard transformers
    calls from a turnrl-saved directory (what a TRL user does) and train the same way."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    if load == "saved":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        HFPolicy(model, tokenizer).save(tmp_path / "model")
        tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
        assert type(tokenizer).__name__ == "Qwen2Tokenizer"  # not turnrl's own class
    tasks = [Task("t0", {}), Task("t1", {})]
    config = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=1,
        learning_rate=1e-2,
        beta=0.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = Recorder(
        model=model,
        args=config,
        processing_class=tokenizer,
        reward_funcs=[outcome_reward],
        train_dataset=task_dataset(tasks),
        rollout_func=make_rollout_func(VowelEnv, tasks, max_new_tokens=6, max_turns=3),
        turnrl_estimator="turn_group",
    )
    before = [p.detach().clone() for p in model.parameters()]
    Recorder.seen.clear()
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    inputs, output = Recorder.seen[0]
    # the prompts TRL trained on are turnrl's own token ids (spaces included)
    reference = HFPolicy(build_tiny_model(build_tiny_tokenizer()), build_tiny_tokenizer())
    for row, ids, keep in zip(inputs, output["prompt_ids"], output["prompt_mask"], strict=True):
        messages = VowelEnv().reset(Task(row["turnrl_task_id"], {}))
        assert ids[keep.bool()].tolist() == reference.encode_initial(messages)
    advantages = output["advantages"]
    mask = (output["completion_mask"] * output["tool_mask"]).bool()
    assert advantages.shape == mask.shape and (advantages[~mask] == 0).all()
    # the same rows built by hand: one trajectory per completion, its turns and rewards
    rows = {"task": [], "traj": [], "turn": [], "reward": []}
    for i, row in enumerate(inputs):
        for k, reward in enumerate(row["turnrl_turn_rewards"]):
            rows["task"].append(row["turnrl_task_id"])
            rows["traj"].append(f"c{i}")
            rows["turn"].append(k)
            rows["reward"].append(reward)
    want = compute_advantages(
        TurnTable.from_arrays(
            task_id=rows["task"], traj_id=rows["traj"], turn=rows["turn"], reward=rows["reward"]
        ),
        "turn_group",
    )
    got = []
    for i in range(len(inputs)):
        m = mask[i].tolist()
        starts = [t for t in range(len(m)) if m[t] and (t == 0 or not m[t - 1])]
        got += [advantages[i, t].item() for t in starts]
    assert len(got) == len(want) == 8  # one assistant segment per env turn, 2 turns x 4 episodes
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_exact_node_ids_hash_prompt_and_earlier_completion_tokens() -> None:
    from turnrl.integrations.tokens import split_turns
    from turnrl.integrations.trl import exact_node_ids
    from turnrl.table import default_node_id

    output = {
        "prompt_ids": torch.tensor([[0, 1, 2], [3, 4, 5]]),
        "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        "completion_ids": torch.tensor([[7, 8, 9, 6], [7, 0, 0, 0]]),
    }
    turns = split_turns(np.array([[1, 0, 1, 1], [1, 0, 0, 0]]), one_turn_per_row=False)
    nodes = exact_node_ids(turns, ["t", "u"], output)
    assert nodes == [
        [default_node_id("t", [1, 2], None), default_node_id("t", [1, 2, 7, 8], None)],
        [default_node_id("u", [3, 4, 5], None)],
    ]


def test_the_documented_example_runs_as_written(tmp_path) -> None:
    """docs/integrations-trl.md's code block, executed unchanged on CPU in a fresh process."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "integrations-trl.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.DOTALL)
    assert len(blocks) == 1, "the TRL doc is expected to hold exactly one Python example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "runs" / "trl" / "model" / "tokenizer.json").is_file()
    assert "'train_runtime'" in done.stdout + done.stderr  # the training loop ran to its end
