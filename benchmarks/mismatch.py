"""Train/inference mismatch per step: a short ``turnrl train`` with ``train.log_mismatch``.

Prints each step's ``mismatch_*`` metrics (docs/backends.md) for one backend; run it in
the venv that has the backend (``hf``: ``.venv``; ``vllm``: ``.venv-vllm``)::

    .venv/bin/python benchmarks/mismatch.py --backend hf
    .venv-vllm/bin/python benchmarks/mismatch.py --backend vllm
    .venv-vllm/bin/python benchmarks/mismatch.py --backend vllm --skip-sync   # what a
                                                  # missed weight push looks like

The model is the tiny one with head size 32 (``policy.heads = 2``, which vLLM's CPU
attention accepts) on the calculator, or on ``--env parity`` (tests/conftest.py's
environment, where an untrained model gets varied rewards, so every update moves the
weights). ``--skip-sync`` replaces the trainer's weight push by nothing: the engine keeps
sampling from the initial weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["hf", "vllm"], required=True)
    parser.add_argument("--env", choices=["calculator", "parity"], default="parity")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--skip-sync", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "tests"))
    import conftest  # registers the parity environment
    import turnrl.train.online.trainer as online
    from turnrl.train.config import RunConfig, load_config

    run_dir = Path(tempfile.mkdtemp(prefix="turnrl-mismatch-")) / "run"
    overrides = [
        *conftest.TINY_TRAIN,
        *(conftest.PARITY if args.env == "parity" else ()),
        f"train.steps={args.steps}",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "train.log_rollouts_every=0",
        "train.log_mismatch=true",
        f"policy.backend={args.backend}",
        "policy.heads=2",
        f"run_dir={run_dir}",
    ]
    config = load_config(RunConfig, ROOT / "examples" / "calculator.toml", overrides)
    if args.skip_sync:
        online.push_weights = lambda *_args, **_kwargs: None
    online.OnlineTrainer(config, quiet=True).run()
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["step"] >= 1:
            stats = {k: f"{v:.2e}" for k, v in row.items() if k.startswith("mismatch_")}
            print(json.dumps({"backend": args.backend, "step": row["step"], **stats}))


if __name__ == "__main__":
    main()
