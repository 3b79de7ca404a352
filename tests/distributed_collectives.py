"""One of 2 gloo ranks for tests/test_distributed.py's ``test_collectives_on_two_gloo_ranks``.

A module of its own, importing only torch and :mod:`turnrl.train.distributed`: the
ranks are ``torch.multiprocessing`` spawns, and each spawn imports the module of the
function it runs. From the test module that would be the tests' conftest and the
policy stack (transformers), tens of seconds per rank on a busy 2-core machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from turnrl.errors import UsageError
from turnrl.train import distributed as dist
from turnrl.train.distributed import World


def _refusal(call: Callable[[], object]) -> str | None:
    """The message of the ``UsageError`` ``call`` raises, or None when it returns."""
    try:
        call()
    except UsageError as error:
        return str(error)
    return None


def collectives_worker(rank: int, init_file: str, out_dir: str) -> None:
    """One of 2 gloo ranks: the collectives of :mod:`turnrl.train.distributed` on hand-built
    values; writes what it saw to ``out_dir/rank{rank}.pt``."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2
    )
    world = World(rank, 2, rank)
    try:
        both, only_rank0, nobody = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
        both.grad = torch.full((3,), float(rank + 1))  # 1 and 2
        if rank == 0:
            only_rank0.grad = torch.tensor([1.0, 2.0, 3.0])
        dist.reduce_gradients([both, only_rank0, nobody], world)
        seen: dict[str, Any] = {
            "both": both.grad,
            "only_rank0": only_rank0.grad,
            "nobody": nobody.grad,
            "count": dist.sum_over_ranks(torch.tensor(rank + 3, dtype=torch.float64), world),
            "gathered": dist.gather_objects({"rank": rank}, world),
            "broadcast": dist.broadcast_object(f"from {rank}", world),
        }
        tensor = torch.full((2,), float(rank))
        dist.broadcast_tensors_([tensor], world)
        seen["tensor"] = tensor
        seen["scatter"] = dist.scatter_objects(["to 0", "to 1"] if rank == 0 else None, world)

        def refuse_on_rank1() -> None:
            if rank == 1:
                raise UsageError("rank 1 refuses")

        def refuse() -> None:
            raise UsageError("rank 0 refuses")

        seen["all_agree"] = _refusal(lambda: dist.all_agree(refuse_on_rank1, world))
        seen["on_main"] = _refusal(lambda: dist.on_main(refuse, world))
        torch.save(seen, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.shutdown()
