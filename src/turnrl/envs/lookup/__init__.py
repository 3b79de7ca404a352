"""``lookup``: a search agent answering multi-hop questions over a small knowledge base.

The setting A2TGPO and IGPO were made for (several retrieval calls, then an
answer, the gold answer known), small enough for a ~0.1M-parameter
character-level model. Each task has its own knowledge base of a dozen or so
short facts about people, companies and cities, generated from a seed, with
near-twin names as distractors (:mod:`.kb`). A question follows 1, 2 or 3
relations::

    u: Ada Lin's mentor's firm's city?
    a: <call>Ada Lin mentor</call>
    t: Ada Lin mentor: Bo Kay
       Ada Lim mentor: Cy Dee
    a: <call>Bo Kay firm</call>
    t: Bo Kay firm: Orbix
       ...
    a: <call>Orbix city</call>
    t: Orbix city: Rome
    a: <answer>Rome</answer>          reward 1

* :class:`LookupEnv` (:mod:`.env`): the environment, registered as ``lookup``
  (``make_env("lookup", k=3, max_turns=5)``, ``make_tasks("lookup", n, seed,
  hop_fractions=(0.4, 0.4, 0.2))``). Tool-call syntax of the calculator;
  snapshots; ``state_key`` = the set of facts retrieved so far (GiGPO);
  ``reference_response`` = the gold answer (information gain);
  ``gold_found()`` = gold-chain facts retrieved so far (PATR's heuristic
  scorer, in :mod:`turnrl.rollout.scorers`).
* ``search`` is BM25 (:mod:`.retriever`, the ``bm25s`` package of the
  ``lookup`` extra) over the task's fact lines, returning the ``k`` best.
* :func:`demonstration` (:mod:`.teacher`): a teacher that searches hop by hop,
  with imperfect variants (stops early, skips a hop) mixed in by
  ``warm_start.tool_fraction`` for the built-in SFT warm start.

**As a tool set for any agent** (:mod:`.tools`, e.g. an OpenAI-client agent run
by the agent loop): :class:`LookupTools` holds one task's ``search(query)`` and
``answer(text)`` as plain functions, :data:`TOOL_SCHEMAS` are their OpenAI
function-calling schemas, :meth:`LookupTools.call` runs a tool call from its
name and JSON arguments and never raises, and :meth:`LookupTools.reward` scores
the final answer. :func:`task_record` turns a task into the JSON object a task
file holds; ``LookupTools`` accepts that object too::

    from turnrl.envs import make_tasks
    from turnrl.envs.lookup import TOOL_SCHEMAS, LookupTools, task_record

    record = task_record(make_tasks("lookup", 1, seed=0)[0])
    record["question"]                                 # "Lu Vos's firm?"
    tools = LookupTools(record)
    tools.call("search", '{"query": "Lu Vos firm"}')   # "Lu Vos firm: Kepo\n..."
    tools.call("answer", {"text": "Kepo"})             # "Answer recorded."
    tools.reward()                                     # 1.0
"""

from __future__ import annotations

from turnrl.envs.lookup.env import TAGS_SYSTEM_PROMPT, LookupEnv
from turnrl.envs.lookup.kb import (
    CHAINS,
    HOPS,
    RELATIONS,
    Fact,
    KBSize,
    KnowledgeBase,
    Question,
    lookup_tasks,
    valid_questions,
)
from turnrl.envs.lookup.teacher import demo_options, demo_variants, demonstration
from turnrl.envs.lookup.tools import (
    TOOL_NAMES,
    TOOL_SCHEMAS,
    LookupTools,
    is_correct,
    normalise_answer,
    task_record,
)

__all__ = [
    "CHAINS",
    "HOPS",
    "RELATIONS",
    "TAGS_SYSTEM_PROMPT",
    "TOOL_NAMES",
    "TOOL_SCHEMAS",
    "Fact",
    "KBSize",
    "KnowledgeBase",
    "LookupEnv",
    "LookupTools",
    "Question",
    "demo_options",
    "demo_variants",
    "demonstration",
    "is_correct",
    "lookup_tasks",
    "normalise_answer",
    "task_record",
    "valid_questions",
]
