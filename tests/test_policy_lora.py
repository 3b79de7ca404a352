"""LoRA adapters on the tiny policy: only adapters train, adapter-only state and saves,
merged frozen clones, and a LoRA training run that resumes exactly. Skips without peft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.policy.lora import add_lora, is_adapter_dir, is_adapter_model, lora_policy
from turnrl.train.config import PolicyConfig, RunConfig, load_config
from turnrl.train.online.trainer import OnlineTrainer
from turnrl.train.run import with_lora
from turnrl.train.update.sft import conversation_examples, supervised_warm_start

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _lora(seed: int = 0, rank: int = 2) -> HFPolicy:
    return lora_policy(build_tiny_policy(seed), rank=rank, alpha=4.0, targets=["q_proj", "v_proj"])


def _batch(policy: HFPolicy) -> tuple[list[list[int]], list[list[int]]]:
    context = policy.encode_initial([{"role": "user", "content": "Compute 2+3."}])
    response = policy.tokenizer("<answer>5</answer>", add_special_tokens=False)["input_ids"]
    return [context, context[:-3]], [[*response, policy.eos_token_id], response[:4]]


def test_only_adapters_are_trainable_and_outputs_start_unchanged() -> None:
    base = build_tiny_policy(0)
    contexts, responses = _batch(base)
    with torch.no_grad():
        expected, _ = base.response_logprobs(contexts, responses)
    policy = lora_policy(build_tiny_policy(0), rank=2, alpha=4.0, targets=["q_proj", "v_proj"])
    assert is_adapter_model(policy.model) and not is_adapter_model(base.model)
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    # 2 layers x 2 targets x (A, B)
    assert len(names) == 8 and all("lora_" in n for n in names)
    assert len(list(policy.parameters())) == 8
    with torch.no_grad():
        got, _ = policy.response_logprobs(contexts, responses)
    assert torch.equal(got, expected)  # B starts at zero


def test_state_dict_holds_adapters_only_and_round_trips() -> None:
    policy = _lora()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    state = policy.state_dict()
    assert len(state) == 8 and all("lora_" in k for k in state)
    other = _lora(seed=0)
    other.load_state_dict(state)
    assert all(torch.equal(state[k], v) for k, v in other.state_dict().items())
    with pytest.raises(ValueError, match="keys the model lacks"):
        other.load_state_dict(
            {**state, "base_model.model.nonsense.lora_A.weight": state[next(iter(state))]}
        )


def test_one_sft_step_changes_only_adapters() -> None:
    policy = _lora()
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    messages = [
        {"role": "system", "content": "Tool: <call>expr</call>. Reply <answer>n</answer>."},
        {"role": "user", "content": "Compute 2+3."},
        {"role": "assistant", "content": "<answer>5</answer>"},
    ]
    supervised_warm_start(
        policy, conversation_examples(policy, messages), steps=2, lr=1e-2, batch_size=1, seed=0
    )
    changed = {n for n, p in policy.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)


def test_save_and_load_round_trip_with_base_saved_alongside(tmp_path: Path) -> None:
    policy = _lora()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05)
    contexts, responses = _batch(policy)
    with torch.no_grad():
        expected, _ = policy.response_logprobs(contexts, responses)
    policy.save(tmp_path / "saved")
    assert is_adapter_dir(tmp_path / "saved") and (tmp_path / "saved" / "base").is_dir()
    loaded = HFPolicy.from_pretrained(tmp_path / "saved")
    assert is_adapter_model(loaded.model) and len(list(loaded.parameters())) == 8
    with torch.no_grad():
        got, _ = loaded.response_logprobs(contexts, responses)
    assert torch.allclose(got, expected, atol=1e-6)
    # saved again, the adapter points at the first save's base by absolute path
    loaded.save(tmp_path / "again")
    config = json.loads((tmp_path / "again" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp_path / "saved" / "base").resolve())
    assert not (tmp_path / "again" / "base").exists()


def test_missing_base_directory_is_a_clear_error(tmp_path: Path) -> None:
    _lora().save(tmp_path / "saved")
    HFPolicy.from_pretrained(tmp_path / "saved").save(tmp_path / "again")
    for path in (tmp_path / "saved" / "base").iterdir():
        path.unlink()
    (tmp_path / "saved" / "base").rmdir()
    with pytest.raises(
        FileNotFoundError, match=r"adapter_config\.json: field 'base_model_name_or_path'"
    ):
        HFPolicy.from_pretrained(tmp_path / "again")


def test_frozen_clone_is_merged_and_equal() -> None:
    policy = _lora()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05)
    frozen = policy.clone_frozen()
    assert not is_adapter_model(frozen.model) and list(frozen.parameters()) == []
    contexts, responses = _batch(policy)
    with torch.no_grad():
        expected, _ = policy.response_logprobs(contexts, responses)
        got, _ = frozen.response_logprobs(contexts, responses)
    assert torch.allclose(got, expected, atol=1e-5)
    assert is_adapter_model(policy.model)  # the original keeps its adapters


def test_bad_lora_settings_are_clear_errors() -> None:
    model = build_tiny_policy(0).model
    with pytest.raises(ValueError, match="rank must be >= 1"):
        add_lora(model, rank=0, alpha=1.0)
    with pytest.raises(ValueError, match=r"\['qkv'\] are not modules"):
        add_lora(model, rank=2, alpha=1.0, targets=["q_proj", "qkv"])


def test_rank_zero_is_full_fine_tuning() -> None:
    policy = build_tiny_policy(0)
    assert with_lora(policy, PolicyConfig(lora_rank=0)) is policy
    wrapped = with_lora(policy, PolicyConfig(lora_rank=2))
    assert is_adapter_model(wrapped.model)
    assert with_lora(wrapped, PolicyConfig(lora_rank=4)) is wrapped  # never wrapped twice


LORA = (
    "policy.lora_rank=4",
    "policy.lora_alpha=8.0",
    "warm_start.steps=4",
    "env.n_train_tasks=8",
    "env.n_eval_tasks=2",
    "train.steps=2",
    "train.checkpoint_every=1",
    "train.epochs=1",
    "train.kl_coef=0.05",
    "train.log_rollouts_every=0",
    "env.env_kwargs={max_turns = 2, turn_cost = 0.0}",
)
"""The shared tiny run (conftest), on LoRA adapters with a KL reference; episodes of at
most 2 turns (sampling is most of a step's time; what is checked is the adapters)."""


def test_lora_run_checkpoints_adapters_and_resumes_exactly(
    tmp_path: Path, tiny_train, read_metrics
) -> None:
    straight = OnlineTrainer(tiny_train(tmp_path / "a", *LORA), quiet=True).run()
    OnlineTrainer(tiny_train(tmp_path / "b", *LORA), quiet=True).run(stop_after=1)
    resumed = OnlineTrainer(tiny_train(tmp_path / "b", *LORA), resume=True, quiet=True).run()
    assert read_metrics(resumed) == read_metrics(straight)
    a = torch.load(straight / "checkpoints" / "step-000002.pt", weights_only=True)["model"]
    b = torch.load(resumed / "checkpoints" / "step-000002.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all("lora_" in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert is_adapter_dir(straight / "warm_start")


def test_smollm2_recipe_is_a_valid_config() -> None:
    config = load_config(RunConfig, REPO / "examples" / "calculator_smollm2.toml", [])
    assert config.policy.model == "smollm2" and config.policy.lora_rank > 0
    assert config.env.env_kwargs["fmt"] == "hermes"
    assert config.train.threads == 1  # measured fastest on a shared machine (RESULTS.md)
