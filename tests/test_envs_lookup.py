"""The lookup environment: knowledge bases, questions, BM25 search, episodes, tools, teacher."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("bm25s", reason="the lookup environment needs the 'lookup' extra (bm25s)")

import turnrl.envs as envs
from tree_scripted import ScriptedPolicy, SpyLearn, context
from turnrl.envs.lookup import (
    TOOL_SCHEMAS,
    KBSize,
    KnowledgeBase,
    LookupEnv,
    LookupTools,
    demo_options,
    demonstration,
    lookup_tasks,
    normalise_answer,
    task_record,
    valid_questions,
)
from turnrl.envs.lookup.kb import Question, generate_kb, hop_counts, question_task
from turnrl.envs.lookup.retriever import fact_index
from turnrl.rollout import RolloutBatch, start_episode
from turnrl.rollout.scorers import heuristic
from turnrl.rollout.tree import Branch, step_branches
from turnrl.types import Task

FACTS = [
    ["Ada Lin", "mentor", "Bo Kay"],
    ["Ada Lim", "mentor", "Cy Dee"],
    ["Bo Kay", "firm", "Orbix"],
    ["Cy Dee", "firm", "Orbex"],
    ["Ada Lin", "firm", "Orbex"],
    ["Ada Lim", "firm", "Orbix"],
    ["Orbix", "city", "Rome"],
    ["Orbex", "city", "Oslo"],
]
KB = KnowledgeBase.from_payload(FACTS)
THREE_HOP = question_task(KB, Question("Ada Lin", ("mentor", "firm", "city"), "Rome", (0, 2, 6)))
ONE_HOP = question_task(KB, Question("Orbix", ("city",), "Rome", (6,)))
seeds = st.integers(0, 2**31 - 1)
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------ generation


def test_hand_built_question_and_its_task() -> None:
    assert THREE_HOP.payload["question"] == "Ada Lin's mentor's firm's city?"
    assert THREE_HOP.tags == ("hop3",) and THREE_HOP.task_id.startswith("lookup-h3-")
    # Ada Lin's own firm (Orbex) is in Oslo: the answer is 3 facts away, not 2.
    assert KB.distance("Ada Lin", "Rome") == 3 and KB.distance("Ada Lin", "Oslo") == 2
    texts = {h: sorted(q.text for q in valid_questions(KB, h)) for h in (1, 2, 3)}
    assert texts[3] == ["Ada Lim's mentor's firm's city?", "Ada Lin's mentor's firm's city?"]
    assert "Ada Lin's mentor's firm?" in texts[2] and len(texts[1]) == 8
    assert json.loads(json.dumps(THREE_HOP.payload)) == THREE_HOP.payload  # JSON-safe


def test_shortcut_questions_are_rejected() -> None:
    # Bo Kay works at Ada Lin's own firm: her mentor's firm is 1 fact away.
    kb = KnowledgeBase.from_payload(
        [["Ada Lin", "mentor", "Bo Kay"], ["Bo Kay", "firm", "Orbix"], ["Ada Lin", "firm", "Orbix"]]
    )
    assert [q.text for q in valid_questions(kb, 2)] == []


@SETTINGS
@given(seed=seeds, n=st.integers(0, 12))
def test_generation_is_deterministic_per_seed(seed: int, n: int) -> None:
    a, b = lookup_tasks(n, seed), lookup_tasks(n, seed)
    assert a == b
    counts = hop_counts(n, (0.4, 0.4, 0.2))
    assert [sum(f"hop{h}" in t.tags for t in a) for h in (1, 2, 3)] == counts
    assert sum(counts) == n
    if n >= 4:
        assert lookup_tasks(n, seed + 1) != a


def test_hop_counts_round_to_n() -> None:
    assert hop_counts(10, (0.4, 0.4, 0.2)) == [4, 4, 2]
    assert hop_counts(7, (1, 1, 1)) == [3, 2, 2]
    assert hop_counts(5, (0, 1, 0)) == [0, 5, 0]
    with pytest.raises(ValueError, match="hop_fractions"):
        hop_counts(5, (0.5, 0.5))


@SETTINGS
@given(seed=seeds)
def test_every_question_needs_exactly_its_hop_count(seed: int) -> None:
    for task in lookup_tasks(6, seed, (1, 1, 1)):
        p = task.payload
        kb = KnowledgeBase.from_payload(p["facts"])
        hops = len(p["chain"])
        assert task.tags == (f"hop{hops}",)
        # the gold chain exists and leads to the answer ...
        assert kb.follow(p["subject"], p["chain"]) == p["gold"]
        assert kb.facts[p["gold"][-1]].object == p["answer"]
        # ... and no shorter path of facts links the subject to the answer
        assert kb.distance(p["subject"], p["answer"]) == hops
        # every entity on the chain is distinct and each subject has a near-twin
        entities = [p["subject"], *(kb.facts[i].object for i in p["gold"])]
        assert len(set(entities)) == len(entities)
        # the perfect teacher answers right with exactly `hops` searches
        messages = demonstration(task)
        calls = [m for m in messages if m["role"] == "assistant"]
        assert len(calls) == hops + 1 and calls[-1]["content"] == f"<answer>{p['answer']}</answer>"


@SETTINGS
@given(seed=seeds)
def test_people_and_companies_come_with_near_twins(seed: int) -> None:
    kb = generate_kb(random.Random(seed), KBSize())
    people = {f.subject for f in kb.facts if f.relation == "firm"}
    companies = {f.subject for f in kb.facts if f.relation == "city"}
    for name in people:  # a twin shares a name word (and with it the retriever's attention)
        words = set(name.split())
        assert any(words & set(other.split()) for other in people - {name}), name
    for name in companies:  # one letter apart
        assert any(
            len(o) == len(name) and sum(a != b for a, b in zip(o, name, strict=True)) == 1
            for o in companies - {name}
        ), name


# -------------------------------------------------------------------- retrieval


def test_bm25_ranking_on_the_hand_built_kb() -> None:
    index = fact_index(KB.texts)
    assert index.search("Ada Lin mentor", 3) == [0, 4, 1]
    assert index.search("ada lin's MENTOR?", 3) == [0, 4, 1]  # case and punctuation ignored
    assert index.search("Bo Kay firm", 3) == [2, 0, 3]
    assert index.search("Orbix city", 2) == [6, 7]
    assert index.search("Rome", 3) == [6]  # facts sharing no word are never returned
    assert index.search("zzz", 3) == [] and index.search("!!!", 3) == []
    assert index.search("Ada Lin mentor " * 100, 1) == [0]  # long queries are cut, not refused


@SETTINGS
@given(seed=seeds, k=st.integers(1, 4))
def test_the_exact_entity_and_relation_find_the_gold_fact_first(seed: int, k: int) -> None:
    kb = generate_kb(random.Random(seed), KBSize())
    index = fact_index(kb.texts)
    for i, fact in enumerate(kb.facts):
        assert index.search(f"{fact.subject} {fact.relation}", k)[0] == i, fact.text
        assert i in index.search(fact.text, k)


# --------------------------------------------------------------------- episodes


def test_perfect_three_hop_episode() -> None:
    env = LookupEnv()
    messages = env.reset(THREE_HOP)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == "Ada Lin's mentor's firm's city?"
    key0 = env.state_key()
    step = env.step("<call>Ada Lin mentor</call>")
    assert step.observation == {
        "role": "tool",
        "content": "Ada Lin mentor: Bo Kay\nAda Lin firm: Orbex\nAda Lim mentor: Cy Dee",
    }
    assert (step.reward, step.done) == (0.0, False)
    assert step.info["tool_call"] and step.info["new_facts"] == 3 and step.info["gold_found"] == 1
    assert step.info["state_key"] != key0
    assert env.step("<call>search: Bo Kay firm</call>").info["gold_found"] == 2
    assert env.step("<call>Orbix city</call>").info["gold_found"] == 3
    final = env.step("Rome, I think. <answer>rome.</answer>")
    assert (final.observation, final.reward, final.done) == (None, 1.0, True)
    assert final.info["correct"] is True and final.info["turn"] == 3


def test_wrong_answer_answer_tool_turn_cost_and_truncation() -> None:
    env = LookupEnv(turn_cost=0.1)
    env.reset(THREE_HOP)
    assert env.step("<call>Ada Lin firm</call>").reward == pytest.approx(-0.1)
    final = env.step("<answer>Oslo</answer>")  # the skipped-hop answer
    assert final.reward == pytest.approx(-0.1) and final.info["correct"] is False
    env.reset(ONE_HOP)
    assert env.step("<call>answer: Rome</call>").reward == pytest.approx(0.9)
    short = LookupEnv(max_turns=2)
    short.reset(ONE_HOP)
    assert not short.step("<call>Orbix city</call>").done
    last = short.step("<call>Orbix city</call>")
    assert last.done and last.reward == 0.0 and last.observation is None
    assert last.info["truncated"] and last.info["correct"] is False


def test_hermes_format_tools_and_prompt() -> None:
    env = LookupEnv(fmt="hermes")
    system = env.reset(ONE_HOP)[0]["content"]
    assert '"name": "search"' in system and '"name": "answer"' in system
    call = '<tool_call>{"name": "search", "arguments": {"query": "Orbix city"}}</tool_call>'
    assert env.step(call).observation["content"].startswith("Orbix city: Rome")
    answer = '<tool_call>{"name": "answer", "arguments": {"text": "Rome"}}</tool_call>'
    assert env.step(answer).reward == 1.0


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("<call>Ada Lin mentor", "unclosed <call>"),
        ("<call></call>", "empty <call>"),
        ("Rome", "no <call> or <answer> found"),
        ("<call>google: Ada Lin</call>", "unknown tool 'google'; tools: answer, search"),
        ("<call>a</call><answer>b</answer>", "both a tool call and an answer"),
        ("<answer>Rome</answer> done", "unexpected text after the closing tag"),
    ],
)
def test_malformed_calls_and_unknown_tools_get_an_observation(response: str, reason: str) -> None:
    env = LookupEnv()
    env.reset(ONE_HOP)
    key = env.state_key()
    step = env.step(response)
    assert not step.done and step.info["malformed"] and not step.info["tool_call"]
    assert step.observation["role"] == "user" and reason in step.observation["content"]
    assert step.info["state_key"] == key  # nothing learnt
    assert env.check_response(ONE_HOP, response) is not None
    assert env.check_response(ONE_HOP, "<call>Orbix city</call>") is None


@SETTINGS
@given(text=st.text(max_size=80))
def test_any_text_is_an_action_or_an_observation_never_an_exception(text: str) -> None:
    env = LookupEnv()
    env.reset(ONE_HOP)
    step = env.step(text)
    assert step.done or step.observation["content"]


def test_state_key_is_the_set_of_facts_retrieved() -> None:
    a, b = LookupEnv(), LookupEnv()
    a.reset(THREE_HOP)
    b.reset(THREE_HOP)
    a.step("<call>Ada Lin mentor</call>")
    a.step("<call>Orbix city</call>")
    b.step("<call>Orbix city</call>")
    b.step("<call>Bogus</call>")  # finds nothing
    assert a.state_key() != b.state_key()
    b.step("<call>Ada Lin mentor</call>")
    assert a.state_key() == b.state_key()  # same facts, other order, one more turn
    assert LookupEnv().state_key() is None  # before reset


@SETTINGS
@given(actions=st.lists(st.sampled_from(["<call>Ada Lin mentor</call>", "<call>Bo Kay firm</call>",
                                         "<call>Orbix city</call>", "???", "<call>x: y</call>"]),
                        min_size=1, max_size=4))  # fmt: skip
def test_snapshots_round_trip(actions: list[str]) -> None:
    env = LookupEnv(max_turns=8)
    env.reset(THREE_HOP)
    for action in actions[:-1]:
        env.step(action)
    saved, key = env.snapshot(), env.state_key()
    first = env.step(actions[-1])
    if not first.done:  # move on, so restoring has something to undo
        env.step("<call>Orbix city</call>")
    env.restore(saved)
    assert env.state_key() == key
    again = env.step(actions[-1])
    assert again == first
    fresh = LookupEnv(max_turns=8)
    fresh.restore(saved)  # into another instance
    assert fresh.step(actions[-1]) == first


def test_restore_refuses_a_foreign_snapshot_and_steps_need_a_running_episode() -> None:
    env = LookupEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("<answer>x</answer>")
    with pytest.raises(TypeError, match="LookupEnv snapshot"):
        env.restore("state")
    env.reset(ONE_HOP)
    env.step("<answer>Rome</answer>")
    with pytest.raises(RuntimeError, match="over"):
        env.step("<answer>Rome</answer>")


def test_reference_response_and_registry() -> None:
    env = envs.make_env("lookup", k=2)
    assert isinstance(env, LookupEnv) and env.k == 2
    assert env.reference_response(THREE_HOP) == "<answer>Rome</answer>"
    assert envs.make_tasks("lookup", 5, seed=3) == lookup_tasks(5, 3)
    with pytest.raises(ValueError, match="k must be"):
        LookupEnv(k=0)


def test_answers_are_normalised() -> None:
    assert normalise_answer("  Bo  Kay. ") == "bo kay"
    assert normalise_answer("BO-KAY") == "bo kay"
    assert normalise_answer("Rome!") == normalise_answer("rome")
    assert normalise_answer("Romeo") != normalise_answer("Rome")


# ----------------------------------------------------------------------- tools


def test_tools_for_an_external_agent() -> None:
    record = json.loads(json.dumps(task_record(THREE_HOP)))  # as a task file holds it
    assert record["task_id"] == THREE_HOP.task_id and record["tags"] == ["hop3"]
    tools = LookupTools(record, k=1)
    assert tools.call("search", '{"query": "Ada Lin mentor"}') == "Ada Lin mentor: Bo Kay"
    assert tools.call("search", {"query": "zzz"}) == "No fact matches."
    assert tools.call("search", "{not json") == "error: search arguments are not valid JSON"
    assert tools.call("search", "[1]") == "error: search arguments must be a JSON object"
    bad = 'error: search takes exactly one string argument "query"'
    assert tools.call("search", {"query": 3}) == bad
    assert tools.call("search", {"query": "a", "k": 9}) == bad
    assert tools.call("browse", "{}") == "error: unknown tool 'browse'; tools: answer, search"
    assert tools.reward() == 0.0  # no answer yet
    assert tools.call("answer", {"text": "Oslo"}) == "Answer recorded."
    assert tools.reward() == 0.0
    tools.answer(" rome ")
    assert tools.reward() == 1.0 and tools.answers == ["Oslo", " rome "]
    assert LookupTools(THREE_HOP).search("Orbix city") == (
        "Orbix city: Rome\nOrbex city: Oslo\nBo Kay firm: Orbix"
    )
    names = [s["function"]["name"] for s in TOOL_SCHEMAS]
    assert names == ["search", "answer"]
    for schema in TOOL_SCHEMAS:
        assert schema["type"] == "function"
        assert schema["function"]["parameters"]["required"] == list(
            schema["function"]["parameters"]["properties"]
        )


# ---------------------------------------------------------------------- teacher


def test_imperfect_teachers_answer_wrong() -> None:
    early = demonstration(THREE_HOP, hops_searched=1)
    assert [m["content"] for m in early if m["role"] == "assistant"] == [
        "<call>Ada Lin mentor</call>",
        "<answer>Bo Kay</answer>",
    ]
    skip = demonstration(THREE_HOP, skip_first=True)
    assert [m["content"] for m in skip if m["role"] == "assistant"] == [
        "<call>Ada Lin firm</call>",
        "<call>Orbex city</call>",
        "<answer>Oslo</answer>",
    ]
    assert demonstration(ONE_HOP, hops_searched=0)[-1]["content"] == "<answer>Orbix</answer>"
    with pytest.raises(ValueError, match="hops_searched"):
        demonstration(ONE_HOP, hops_searched=2)


def test_demo_options_mix() -> None:
    tasks = lookup_tasks(400, 0)
    rng = random.Random(0)
    options = [demo_options(t, rng, 0.6, 0.0) for t in tasks]
    perfect = sum(o == {} for o in options) / len(options)
    assert 0.5 < perfect < 0.7
    for task, option in zip(tasks, options, strict=True):
        if "hops_searched" in option:
            assert 0 <= option["hops_searched"] < len(task.payload["chain"])
        if option.get("skip_first"):
            assert task.payload["chain"][0] == "mentor" and len(task.payload["chain"]) > 1
    assert all(demo_options(t, rng, 1.0, 0.0) == {} for t in tasks[:20])
    assert envs.get_env_spec("lookup").demo_options is demo_options


# ------------------------------------------------------------ PATR's heuristic


def test_patr_heuristic_counts_gold_facts_found() -> None:
    script = ["<call>Ada Lin mentor</call>", "<call>Ada Lin firm</call>", "???"]
    policy = ScriptedPolicy(lambda ctx, call, row: script[row])

    def make_env() -> LookupEnv:
        return LookupEnv(k=1)

    ctx = context(policy, make_env, SpyLearn(), max_new_tokens=40)
    branches = [Branch(start_episode(policy, make_env, THREE_HOP, f"b{i}")) for i in range(3)]
    assert heuristic(branches, policy) == [0.0, 0.0, 0.0]
    step_branches(policy, branches, RolloutBatch([], []), ctx, seed=0, max_turns=5)
    # b0 found the mentor fact (1 of 3); b1 only Ada Lin's own firm; b2 was malformed.
    assert heuristic(branches, policy) == pytest.approx([1 / 3, 0.0, -0.5])
    wrong = Branch(start_episode(policy, make_env, THREE_HOP, "w"))
    wrong.episode.env.step("<answer>Oslo</answer>")
    wrong.episode.done, wrong.episode.correct = True, False
    assert heuristic([wrong], policy) == [-1.0]


def test_a_task_built_by_hand_needs_a_payload_with_facts() -> None:
    with pytest.raises(KeyError):
        LookupTools(Task("t", {"question": "?"}))


def test_warm_start_examples_follow_the_demonstration_mix() -> None:
    from turnrl.policy import build_tiny_policy
    from turnrl.train.update.sft import demonstration_examples

    policy = build_tiny_policy(0)
    tasks = lookup_tasks(30, 1)
    examples = demonstration_examples(
        policy, "lookup", tasks, seed=4, tool_fraction=0.5, easy_tool_fraction=0.0
    )
    rng = random.Random(4)  # the same draws demonstration_examples makes
    turns = [
        sum(m["role"] == "assistant" for m in demonstration(t, **demo_options(t, rng, 0.5, 0.0)))
        for t in tasks
    ]
    assert len(examples) == sum(turns) < sum(len(t.payload["chain"]) + 1 for t in tasks)
    answer = policy.decode(examples[turns[0] - 1].response)  # first task's last turn
    assert answer.startswith("<answer>") and answer.endswith("</answer>")
