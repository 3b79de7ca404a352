"""Planted bugs the suite did not catch (issue 38): each test here fails with its bug.

* evaluation tasks drawn with the training seed (they come from a derived seed);
* LoRA dropped on a whole-model warm start (``warm_start.init_from`` without adapters);
* ``--allowed-host`` ignored on a wildcard bind of ``turnrl serve``;
* the run lock never released in-process (a run opened and closed twice);
* a prompt exactly filling the model's context accepted (refused, as documented);
* a two-role program's warm-start turns classified per rollout instead of per role.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import hostile_requests as hostile
from conftest import PARITY
from test_hostile_run import subprocess_env
from turnrl.envs import make_tasks
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.policy.lora import is_adapter_model
from turnrl.serve import Gateway, GatewayConfig, parse_chat_request
from turnrl.serve.errors import GatewayError
from turnrl.serve.guard import LOOPBACK_NAMES, allowed_host_names
from turnrl.train.agent.config import TasksConfig
from turnrl.train.agent.tasks import load_tasks
from turnrl.train.agent.warm_quality import turn_positions
from turnrl.train.config import EnvConfig, PolicyConfig, WarmStartConfig
from turnrl.train.eval_tasks import agent_eval_tasks
from turnrl.train.lifecycle import Lifecycle
from turnrl.train.online.trainer import OnlineTrainer
from turnrl.train.run import RunDirectory, initial_policy
from turnrl.train.run_lock import LOCK_FILE, is_locked_here
from turnrl.train.seeds import derive_seed
from turnrl.train.task_split import task_split
from turnrl.types import TurnRecord


def ids(tasks: list[Any]) -> list[str]:
    return [t.task_id for t in tasks]


# ------------------------------------------- evaluation tasks come from a derived seed


def test_environment_eval_tasks_come_from_the_derived_seed() -> None:
    env = EnvConfig(name="calculator", n_train_tasks=64, n_eval_tasks=16, seed=3)
    split = task_split(env)
    derived = make_tasks("calculator", 16, derive_seed(3, "eval_tasks"))
    same_seed = make_tasks("calculator", 16, 3)
    assert ids(split.eval) == ids(derived)
    assert ids(split.eval) != ids(same_seed)  # so the training seed's draw would be caught
    assert ids(split.train) == ids(make_tasks("calculator", 64, 3))


def test_agent_eval_tasks_come_from_the_derived_seed() -> None:
    tasks = TasksConfig(train="calculator", n_train=32, n_eval=16, seed=5)
    derived = load_tasks("calculator", n=16, seed=derive_seed(5, "eval_tasks"))
    assert ids(agent_eval_tasks(tasks)) == ids(derived)
    assert ids(agent_eval_tasks(tasks)) != ids(load_tasks("calculator", n=16, seed=5))


def test_the_environment_trainer_evaluates_on_the_derived_seed_s_tasks(
    tmp_path: Path, tiny_train: Any
) -> None:
    config = tiny_train(tmp_path / "run", "env.seed=2", "env.n_eval_tasks=8")
    trainer = OnlineTrainer(config, quiet=True)
    try:
        derived = make_tasks(
            "calculator", 8, derive_seed(2, "eval_tasks"), **config.env.task_kwargs
        )
        assert ids(trainer.eval_tasks) == ids(derived)
        same_seed = make_tasks("calculator", 8, 2, **config.env.task_kwargs)
        assert ids(trainer.eval_tasks) != ids(same_seed)
    finally:
        trainer.close()


# ------------------------------------------------ LoRA on a whole-model warm start


def test_lora_is_added_to_a_whole_model_warm_start(tmp_path: Path) -> None:
    saved = build_tiny_policy(7)
    saved.save(tmp_path / "warm")
    config = PolicyConfig(lora_rank=4, lora_alpha=8.0)
    policy = initial_policy(
        build_tiny_policy(0), WarmStartConfig(init_from=str(tmp_path / "warm")), config
    )
    assert is_adapter_model(policy.model)
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base = policy.model.get_base_model().state_dict()
    for name, tensor in saved.model.state_dict().items():  # the warm start's weights
        module, _, kind = name.rpartition(".")
        wrapped = f"{module}.base_layer.{kind}"  # a layer with adapters
        assert torch.equal(base[name if name in base else wrapped], tensor), name
    whole = initial_policy(
        build_tiny_policy(0), WarmStartConfig(init_from=str(tmp_path / "warm")), PolicyConfig()
    )
    assert not is_adapter_model(whole.model)  # lora_rank 0: the whole model trains


# ------------------------------------------- --allowed-host on a wildcard bind


def test_allowed_hosts_of_a_wildcard_bind_keep_the_given_names() -> None:
    assert allowed_host_names("0.0.0.0", ["proxy.example"]) == frozenset(
        {*LOOPBACK_NAMES, "proxy.example"}
    )
    assert allowed_host_names("::", ["Proxy.Example"]) == frozenset(
        {*LOOPBACK_NAMES, "proxy.example"}
    )
    assert allowed_host_names("0.0.0.0") is None


def test_turnrl_serve_on_a_wildcard_bind_answers_only_the_allowed_host(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("k" * 32 + "\n")
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys; from turnrl.cli import main; sys.exit(main())",
         "serve", "--host", "0.0.0.0", "--port", "0", "--api-key-file", str(key_file),
         "--allowed-host", "proxy.example"],
        stderr=subprocess.PIPE, text=True, env=subprocess_env(), start_new_session=True,
    )  # fmt: skip
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        assert line.startswith("turnrl serve: http://0.0.0.0:"), line
        port = int(line.split("http://0.0.0.0:")[1].split("/")[0])
        base = f"http://127.0.0.1:{port}/health"

        def health(host: str) -> int:
            return hostile.send(base, method="GET", key="k" * 32, headers={"Host": host}).status

        deadline = time.monotonic() + 60
        while health("localhost") != 200:  # the server runs once the key line is printed
            assert time.monotonic() < deadline, "turnrl serve did not answer"
            time.sleep(0.2)
        assert health("proxy.example") == 200
        assert health(f"proxy.example:{port}") == 200
        assert health("evil.example") == 400  # DNS rebinding: refused
    finally:
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=60)
        if server.stderr is not None:
            server.stderr.close()
    with pytest.raises(ProcessLookupError):
        os.killpg(server.pid, 0)  # nothing of it is left


# ------------------------------------------------ the run lock, released in-process


def another_process_can_lock(run_dir: Path) -> bool:
    """Whether a separate process can take ``run_dir``'s lock now (and lets it go)."""
    probe = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "except BlockingIOError:\n    sys.exit(1)\n"
    )
    lock = str(run_dir / LOCK_FILE)
    return subprocess.run([sys.executable, "-c", probe, lock], timeout=60).returncode == 0


def test_a_run_directory_opened_and_closed_twice_in_one_process_is_released(
    tmp_path: Path, tiny_train: Any
) -> None:
    config = tiny_train(tmp_path / "run")
    held = []
    for resume in (False, True):
        run = RunDirectory.open(config, resume=resume, quiet=True)
        run.start()
        assert is_locked_here(run.path) and not another_process_can_lock(run.path)
        run.close()
        held.append(run)  # still referenced: only close() can have released it
        assert not is_locked_here(run.path)
        assert another_process_can_lock(run.path)


def test_a_finished_trainer_releases_its_run_directory_while_it_is_still_referenced(
    tmp_path: Path, tiny_train: Any
) -> None:
    config = tiny_train(tmp_path / "run", *PARITY, "train.steps=1")
    trainer = OnlineTrainer(config, quiet=True)
    Lifecycle(trainer).run()
    assert not is_locked_here(trainer.run_directory.path)
    assert another_process_can_lock(trainer.run_directory.path)
    again = RunDirectory.open(config, resume=True, quiet=True)
    again.close()
    assert not is_locked_here(again.path)


# --------------------------------------------- a prompt exactly filling the context


CONTEXT = 48
"""Positions of the small tiny model these tests build."""


@pytest.fixture(scope="module")
def short_policy() -> HFPolicy:
    policy = build_tiny_policy(0, max_positions=CONTEXT)
    assert policy.max_context == CONTEXT
    return policy


def test_sampling_after_a_context_that_fills_every_position_is_refused(
    short_policy: HFPolicy,
) -> None:
    with pytest.raises(ValueError, match=rf"{CONTEXT} context tokens \+ 1 more exceed"):
        short_policy.sample([[5] * CONTEXT], max_new_tokens=4, seed=0)
    (sample,) = short_policy.sample([[5] * (CONTEXT - 1)], max_new_tokens=4, seed=0)
    assert len(sample.response_ids) == 1  # one position left: one token
    with pytest.raises(ValueError, match="exceed the model's max positions"):
        short_policy.response_logprobs([[5] * (CONTEXT - 1)], [[5, 5]])
    logp, _ = short_policy.response_logprobs([[5] * (CONTEXT - 1)], [[5]])
    assert tuple(logp.shape) == (1, 1)


def test_the_gateway_refuses_a_prompt_that_fills_the_context(short_policy: HFPolicy) -> None:
    empty = short_policy.encode_initial([{"role": "user", "content": ""}])
    config = GatewayConfig(default_max_tokens=4, batch_window_s=0.001)
    with Gateway(short_policy, config) as gateway:

        def ask(rollout: str, length: int) -> dict[str, Any]:
            message = {"role": "user", "content": "x" * (length - len(empty))}
            assert len(short_policy.encode_initial([message])) == length  # one id a character
            body = json.loads(hostile.chat_json([message]))
            return gateway.complete(parse_chat_request(body), rollout)

        with pytest.raises(GatewayError) as refused:
            ask("full", CONTEXT)
        assert refused.value.status == 400
        assert refused.value.code == "context_length_exceeded"
        assert f"the conversation is {CONTEXT} tokens" in str(refused.value)
        reply = ask("room-for-one", CONTEXT - 1)
        assert reply["usage"]["completion_tokens"] == 1


# ------------------------------------- a two-role program's turns, classified per role


def turn(traj: str, turn_: int, role: str, call: bool) -> TurnRecord:
    return TurnRecord(
        task_id="t", traj_id=traj, turn=turn_, role=role, prompt_ids=(1,), response_ids=(2,),
        tool_call=call,
    )  # fmt: skip


def test_a_checker_s_verdict_after_the_solver_s_call_is_a_direct_answer() -> None:
    """Per rollout, the checker's verdict after the solver called would count as a
    "result" (a call came before it in the rollout); per role it is a direct answer."""
    records = [
        turn("w-0", 0, "solver", True),
        turn("w-0", 1, "solver", False),
        turn("w-0", 2, "checker", False),
        turn("w-0", 3, "solver", False),
    ]
    assert turn_positions(records) == ["call", "result", "direct", "result"]
