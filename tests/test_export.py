"""``turnrl export`` and the ``policy/`` every finished run writes (docs/export.md).

The run's policy is rebuilt here as a resumed run rebuilds it (the saved warm start,
then the checkpoint's weights, through turnrl's own ``HFPolicy``); the export is read
with plain ``transformers`` (``AutoModelForCausalLM``, ``AutoTokenizer``), and peft for
the adapters. Log-probs of the same token sequences must agree within ``LOGP_TOL``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import PARITY
from turnrl.cli import main
from turnrl.errors import OutputError
from turnrl.policy import factory
from turnrl.policy.tiny import ALPHABET, IM_END, IM_START
from turnrl.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from turnrl.train.config import RunConfig, load_config
from turnrl.train.export import MANIFEST, export_run, write_policy_directory
from turnrl.train.lifecycle import Lifecycle
from turnrl.train.online.trainer import OnlineTrainer

LOGP_TOL = 1e-5
"""Largest |export - checkpoint| log-prob per token (float32 on the CPU)."""

REPO = Path(__file__).resolve().parents[1]
RUN = (
    *PARITY,
    "env.n_train_tasks=8",
    "env.n_eval_tasks=2",
    "rollout.group_size=2",
    "rollout.tasks_per_step=2",
    "policy.max_new_tokens=8",
    "policy.heads=2",
    "train.steps=2",
    "train.eval_every=0",
    "train.checkpoint_every=2",
    "train.minibatch_size=4",
    "train.threads=1",
    "train.log_rollouts_every=0",
    "train.lr=0.01",
)
"""A 2-step tiny run on the parity environment (rewards vary from the start, so the
steps move the weights), heads 2 (the model vLLM's CPU attention accepts)."""

CONVERSATIONS = [
    ([{"role": "user", "content": "What is 2+2?"}], "4"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "7*6"}], "42 ok"),
    ([{"role": "user", "content": "Say {x: [1, 2]}\nthen stop."}], "{x: [1, 2]}~"),
]
"""Contexts (chat messages) and response texts the log-probs are compared on."""


def train(run_dir: Path, *extra: str) -> Path:
    config = load_config(
        RunConfig, REPO / "examples" / "calculator.toml", [*RUN, f"run_dir={run_dir}", *extra]
    )
    return Lifecycle(OnlineTrainer(config, quiet=True)).run()


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run that also exported every step (``train.export_every = 1``)."""
    return train(tmp_path_factory.mktemp("full") / "run", "train.export_every=1")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(tmp_path_factory.mktemp("lora") / "run", "policy.lora_rank=4")


def checkpoint_policy(run_dir: Path, step: int) -> Any:
    """The run's policy at ``step`` as a resumed run builds it (warm start + checkpoint)."""
    policy = factory.load_policy(run_dir / "warm_start")
    saved = dict(list_checkpoints(run_dir))
    policy.load_state_dict(load_checkpoint(saved[step])["model"])
    return policy


def turnrl_logprobs(policy: Any) -> list[torch.Tensor]:
    out = []
    for messages, response in CONVERSATIONS:
        context = policy.encode_initial(messages)
        ids = policy.tokenizer.encode(response, add_special_tokens=False)
        with torch.no_grad():
            logp, _ = policy.response_logprobs([context], [ids])
        out.append(logp[0, : len(ids)])
    return out


def transformers_logprobs(model: Any, tokenizer: Any, run_policy: Any) -> list[torch.Tensor]:
    """Log-probs of the responses by a plain forward of ``model``; the export's tokenizer
    must give the run's tokens (checked on the way)."""
    out = []
    for messages, response in CONVERSATIONS:
        context = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        if isinstance(context, dict) or hasattr(context, "input_ids"):
            context = context["input_ids"]
        ids = tokenizer.encode(response, add_special_tokens=False)
        assert list(context) == run_policy.encode_initial(messages)
        assert ids == run_policy.tokenizer.encode(response, add_special_tokens=False)
        sequence = torch.tensor([[*context, *ids]])
        with torch.no_grad():
            logits = model(sequence).logits[0].float()
        logp = torch.log_softmax(logits[:-1], dim=-1)
        picked = logp.gather(1, sequence[0, 1:, None])[:, 0]
        out.append(picked[len(context) - 1 :])
    return out


def max_gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert [len(x) for x in a] == [len(y) for y in b]
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def load_export(directory: Path) -> tuple[Any, Any]:
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(directory))


def export(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["export", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ----------------------------------------------------------------------------- full weights


def test_export_gives_the_checkpoints_log_probs_in_plain_transformers(
    full_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "export"
    code, printed, _ = export(capsys, str(full_run), "-o", str(out))
    assert code == 0 and f"checkpoint step 2 (weights) to {out}" in printed
    for name in ("model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"):
        assert (out / name).is_file(), name
    template = (out / "chat_template.jinja").read_text()
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == template
    assert json.loads((out / MANIFEST).read_text()) == {
        "format": "merged",
        "run_dir": str(full_run.resolve()),
        "step": 2,
    }
    run_policy = checkpoint_policy(full_run, 2)
    model, tokenizer = load_export(out)
    assert model.config.num_attention_heads == 2
    gap = max_gap(turnrl_logprobs(run_policy), transformers_logprobs(model, tokenizer, run_policy))
    print(f"max |export - checkpoint| log-prob: {gap:.2e}")
    assert gap < LOGP_TOL
    # not vacuous: the checkpoint is not the warm start (the steps moved the weights)
    warm = factory.load_policy(full_run / "warm_start")
    assert max_gap(turnrl_logprobs(warm), turnrl_logprobs(run_policy)) > 1e-3


def test_a_finished_run_writes_policy_and_the_periodic_step_exports(full_run: Path) -> None:
    final = full_run / "policy"
    assert json.loads((final / MANIFEST).read_text())["step"] == 2
    for step in (1, 2):  # train.export_every = 1; the final export kept both
        manifest = json.loads((final / f"step-{step}" / MANIFEST).read_text())
        assert manifest["step"] == step and manifest["format"] == "merged"
    # step 1 was checkpointed for its export although train.checkpoint_every = 2
    assert [step for step, _ in list_checkpoints(full_run)] == [1, 2]
    run_policy = checkpoint_policy(full_run, 1)
    model, tokenizer = load_export(final / "step-1")
    gap = max_gap(turnrl_logprobs(run_policy), transformers_logprobs(model, tokenizer, run_policy))
    print(f"max |export - checkpoint| log-prob: {gap:.2e}")
    assert gap < LOGP_TOL
    leftovers = [p.name for p in full_run.iterdir() if p.name.startswith(".")]
    assert not [name for name in leftovers if name != ".turnrl.lock"]


def test_step_option_exports_an_earlier_checkpoint(
    full_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "step1"
    code, printed, _ = export(capsys, str(full_run), "--step", "1", "-o", str(out))
    assert code == 0 and "checkpoint step 1" in printed
    a = (out / "model.safetensors").read_bytes()
    b = (full_run / "policy" / "step-1" / "model.safetensors").read_bytes()
    assert a == b


# ----------------------------------------------------------------------------- tokenizer

TINY_TEXT = st.lists(
    st.one_of(st.sampled_from(ALPHABET), st.sampled_from([IM_START, IM_END])), max_size=40
).map("".join)


@pytest.fixture(scope="module")
def tokenizers_pair(full_run: Path) -> tuple[Any, Any]:
    """The run's tokenizer (turnrl's loader) and ``AutoTokenizer`` on the export."""
    run_tokenizer = factory.load_policy(full_run / "warm_start").tokenizer
    return run_tokenizer, AutoTokenizer.from_pretrained(str(full_run / "policy"))


@settings(max_examples=200, deadline=None)
@given(text=TINY_TEXT)
def test_autotokenizer_encodes_every_tiny_text_as_the_run(
    tokenizers_pair: tuple[Any, Any], text: str
) -> None:
    run_tokenizer, exported = tokenizers_pair
    assert exported.encode(text, add_special_tokens=False) == run_tokenizer.encode(
        text, add_special_tokens=False
    )


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=30))
def test_tokenizer_json_encodes_any_text_as_the_run(
    full_run: Path, tokenizers_pair: tuple[Any, Any], text: str
) -> None:
    from tokenizers import Tokenizer

    exact = Tokenizer.from_file(str(full_run / "policy" / "tokenizer.json"))
    run_tokenizer, _ = tokenizers_pair
    assert exact.encode(text, add_special_tokens=False).ids == run_tokenizer.encode(
        text, add_special_tokens=False
    )


def test_autotokenizer_departs_only_outside_the_alphabet(tokenizers_pair: tuple[Any, Any]) -> None:
    """The documented departure (docs/export.md): transformers builds its own Qwen2
    tokenizer for a ``qwen2`` model, whose byte-level BPE has no unknown token, so a
    character the tiny model has no token for is dropped, not ``<|unk|>``."""
    run_tokenizer, exported = tokenizers_pair
    assert run_tokenizer.encode("a\u00e9b", add_special_tokens=False) == [
        run_tokenizer.convert_tokens_to_ids(t) for t in ("a", "<|unk|>", "b")
    ]
    assert exported.encode("a\u00e9b", add_special_tokens=False) == run_tokenizer.encode(
        "ab", add_special_tokens=False
    )
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "2+2?"}]
    assert exported.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        f"{IM_START}s:s{IM_END}\n{IM_START}u:2+2?{IM_END}\n{IM_START}a:"
    )


# ----------------------------------------------------------------------------- LoRA


def test_lora_export_merges_the_adapters(
    lora_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "merged"
    assert export(capsys, str(lora_run), "-o", str(out))[0] == 0
    assert not (out / "adapter_config.json").exists()
    run_policy = checkpoint_policy(lora_run, 2)
    model, tokenizer = load_export(out)
    assert "lora" not in " ".join(name for name, _ in model.named_parameters())
    gap = max_gap(turnrl_logprobs(run_policy), transformers_logprobs(model, tokenizer, run_policy))
    print(f"max |export - checkpoint| log-prob: {gap:.2e}")
    assert gap < LOGP_TOL
    warm = factory.load_policy(lora_run / "warm_start")  # adapters B = 0: the base
    assert max_gap(turnrl_logprobs(warm), turnrl_logprobs(run_policy)) > 1e-3
    # the run's own policy/ is the same merged export
    final = (lora_run / "policy" / "model.safetensors").read_bytes()
    assert final == (out / "model.safetensors").read_bytes()


def test_adapters_export_loads_with_peft_on_its_base(
    lora_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from peft import PeftModel

    out = tmp_path / "adapters"
    code, printed, _ = export(capsys, str(lora_run), "--adapters", "-o", str(out))
    assert code == 0 and "(LoRA adapters)" in printed
    config = json.loads((out / "adapter_config.json").read_text())
    # the tiny base was never a directory: it is written inside the export, named there
    assert config["base_model_name_or_path"] == str((out / "base").resolve())
    assert json.loads((out / MANIFEST).read_text())["format"] == "adapters"
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"])
    model = PeftModel.from_pretrained(base, str(out)).eval()
    run_policy = checkpoint_policy(lora_run, 2)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    gap = max_gap(turnrl_logprobs(run_policy), transformers_logprobs(model, tokenizer, run_policy))
    print(f"max |export - checkpoint| log-prob: {gap:.2e}")
    assert gap < LOGP_TOL


# ----------------------------------------------------------------------------- errors


def test_bad_runs_and_steps_are_one_line_naming_them(
    full_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out")
    code, _, err = export(capsys, str(tmp_path / "nope"), "-o", out)
    assert (
        code == 2 and err == f"turnrl export: error: {tmp_path / 'nope'}: no such run directory\n"
    )
    code, _, err = export(capsys, str(full_run), "--step", "7", "-o", out)
    assert code == 2 and err.count("\n") == 1
    assert f"{full_run}: --step 7: no checkpoint of that step" in err and "saved steps: 1, 2" in err
    bare = tmp_path / "bare"
    (bare / "warm_start").mkdir(parents=True)
    (bare / "warm_start" / "config.json").write_text("{}")
    code, _, err = export(capsys, str(bare), "-o", out)
    assert code == 2 and f"{bare}: no checkpoint in {bare / 'checkpoints'}" in err
    code, _, err = export(capsys, str(tmp_path), "-o", out)
    assert code == 2 and "not a turnrl run directory" in err
    code, _, err = export(capsys, str(full_run), "--adapters", "-o", out)
    assert code == 2 and "--adapters: this policy has no LoRA adapters" in err
    assert not Path(out).exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_non_empty_output_is_refused_unless_overwrite(
    full_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me\n")
    code, _, err = export(capsys, str(full_run), "-o", str(out))
    assert code == 2 and f"{out}: exists and is not empty; give --overwrite" in err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert export(capsys, str(full_run), "-o", str(out), "--overwrite")[0] == 0
    assert not (out / "mine.txt").exists() and (out / "model.safetensors").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export(capsys, str(full_run), "-o", str(empty))[0] == 0  # an empty one is fine


def test_a_failed_write_leaves_the_old_directory_and_no_temp(
    full_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    export_run(full_run, out, warm_start=full_run / "warm_start")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("transformers.PreTrainedTokenizerBase.save_pretrained", broken)
    with pytest.raises(OutputError) as err:
        export_run(full_run, out, warm_start=full_run / "warm_start", step=1, overwrite=True)
    assert str(err.value) == f"{out}: cannot write: no space left on device"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_replacing_keeps_only_what_keep_accepts(tmp_path: Path) -> None:
    policy = factory.build_tiny_policy(0, heads=2, kv_heads=1)
    out = tmp_path / "policy"
    (out / "step-3").mkdir(parents=True)
    (out / "step-3" / "x").write_text("3")
    (out / "stale.txt").write_text("old")
    write_policy_directory(
        policy, out, overwrite=True, keep=lambda entry: entry.name.startswith("step-")
    )
    assert (out / "step-3" / "x").read_text() == "3" and not (out / "stale.txt").exists()
    assert (out / "config.json").is_file()


def test_export_keeps_the_runs_precision(tmp_path: Path) -> None:
    """A bfloat16 run exports bfloat16 weights (the checkpoint's values, not widened)."""
    run = tmp_path / "run"
    policy = factory.build_tiny_policy(0, heads=2, kv_heads=1)
    policy.model.to(torch.bfloat16)
    policy.save(run / "warm_start")
    (run / "config.toml").write_text('[policy]\ndtype = "bfloat16"\n')
    state = {k: v.clone() + 0.5 for k, v in policy.state_dict().items()}
    save_checkpoint(run, 3, state, None)
    out, step = export_run(run, tmp_path / "out", warm_start=run / "warm_start")
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype="auto")
    assert step == 3 and model.dtype == torch.bfloat16
    exported = model.state_dict()
    assert all(torch.equal(exported[k], v) for k, v in state.items() if k in exported)
