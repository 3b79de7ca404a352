"""A scripted teacher for the supervised warm start: it searches hop by hop.

The teacher searches ``"<entity> <relation>"`` for each relation of the
question in turn, reads the entity to follow from the top result (it does not
peek at the knowledge base), and answers with the last entity it reached. The
observations come from stepping a real :class:`LookupEnv`, so they are exactly
what the environment returns.

Two imperfect behaviours give RL a gap to close (:func:`demo_options` draws
them for the warm start's mix, see ``warm_start.tool_fraction``):

* ``hops_searched = h`` (< hops): the teacher stops after ``h`` searches and
  answers the entity it has (with ``h = 0``: the subject itself);
* ``skip_first = True``: it skips the first relation of a ``mentor`` chain, so
  "Ada Lin's mentor's firm?" is answered with Ada Lin's own firm (never the
  right answer: questions are generated without such shortcuts).
"""

from __future__ import annotations

import random
from typing import Any

from turnrl.envs.lookup.env import LookupEnv
from turnrl.envs.tools import format_answer
from turnrl.types import Message, Task


def demonstration(
    task: Task,
    *,
    hops_searched: int | None = None,
    skip_first: bool = False,
    **env_kwargs: Any,
) -> list[Message]:
    """The full conversation of the teacher on ``task`` (see the module docstring).

    With the defaults the teacher answers correctly in ``hops + 1`` turns; a
    perfect demonstration that does not is an error (the retriever lost a gold
    fact), never silently kept.
    """
    chain = list(task.payload["chain"])
    env = LookupEnv(**{**env_kwargs, "max_turns": len(chain) + 1})  # room for every hop
    messages = env.reset(task)
    if skip_first:
        chain = chain[1:]
    if hops_searched is not None:
        if not 0 <= hops_searched <= len(chain):
            raise ValueError(f"hops_searched must be in [0, {len(chain)}], got {hops_searched}")
        chain = chain[:hops_searched]
    entity = task.payload["subject"]
    for relation in chain:
        call = env.registry.format_call(env.fmt, "search", f"{entity} {relation}")
        messages.append({"role": "assistant", "content": call})
        result = env.step(call)
        assert result.observation is not None  # max_turns leaves room for the answer
        messages.append(result.observation)
        top = result.observation["content"].split("\n", 1)[0]
        head = f"{entity} {relation}: "
        if not top.startswith(head):
            raise RuntimeError(f"{task.task_id}: top result for {head!r} is {top!r}")
        entity = top[len(head) :]
    answer = format_answer(entity)
    messages.append({"role": "assistant", "content": answer})
    final = env.step(answer)
    perfect = hops_searched is None and not skip_first
    if perfect and not final.info["correct"]:
        raise RuntimeError(f"{task.task_id}: the teacher's answer {entity!r} was judged wrong")
    return messages


def demo_options(
    task: Task, rng: random.Random, tool_fraction: float, easy_tool_fraction: float
) -> dict[str, Any]:
    """The teacher's behaviour on ``task`` for the warm-start mix.

    A ``tool_fraction`` share of demonstrations search every hop; the rest are
    imperfect: half of those on ``mentor`` chains of two or more hops skip the
    first relation, every other one stops after a uniformly drawn number of
    searches below the hop count. (``easy_tool_fraction`` is the calculator's and
    is not used.)
    """
    chain = task.payload["chain"]
    if rng.random() < tool_fraction:
        return {}
    if chain[0] == "mentor" and len(chain) > 1 and rng.random() < 0.5:
        return {"skip_first": True}
    return {"hops_searched": rng.randrange(len(chain))}


def demo_variants(
    task: Task, tool_fraction: float, easy_tool_fraction: float
) -> list[tuple[float, dict[str, Any]]]:
    """Every behaviour :func:`demo_options` draws for ``task``, with its probability
    (a variant of probability 0 is left out)."""
    chain = task.payload["chain"]
    imperfect = 1.0 - tool_fraction
    variants: list[tuple[float, dict[str, Any]]] = [(tool_fraction, {})]
    if chain[0] == "mentor" and len(chain) > 1:
        variants.append((imperfect / 2, {"skip_first": True}))
        imperfect /= 2
    variants += [(imperfect / len(chain), {"hops_searched": h}) for h in range(len(chain))]
    return [(p, kwargs) for p, kwargs in variants if p > 0.0]
