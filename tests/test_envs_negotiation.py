"""The six negotiation settings: action parser, counterparts, episodes, snapshots, demos."""

from __future__ import annotations

import importlib.util
import statistics
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import turnrl.envs as envs
from turnrl.envs.negotiation import SETTINGS, NegotiationEnv
from turnrl.envs.negotiation.actions import (
    Accept,
    End,
    Issue,
    Offer,
    OfferFormat,
    Reject,
    Say,
    format_offer,
    parse_action,
    single_issue,
)
from turnrl.envs.negotiation.concession import Stance, Temper, Verdict, deadline_schedule, react
from turnrl.envs.negotiation.multi_issue import GRID, agent_value, client_utility
from turnrl.envs.tools import Malformed
from turnrl.types import Task

NAMES = sorted(SETTINGS)
PRICE = single_issue("price", 0, 500)
CONTRACT = OfferFormat((Issue("price", 50, 100), Issue("term", 1, 12)), require_all=True)


def make(name: str, **kwargs) -> NegotiationEnv:
    env = envs.make_env(name, **kwargs)
    assert isinstance(env, NegotiationEnv)
    return env


def task(setting: str, **payload) -> Task:
    return Task(task_id=f"{setting}-test", payload=payload, tags=(setting,))


def replies(env: NegotiationEnv, t: Task, actions: list[str]) -> list[str]:
    """The counterpart's reply to each action (stops at the end of the episode)."""
    env.reset(t)
    out = []
    for action in actions:
        result = env.step(action)
        out.append(result.info["reply"])
        if result.done:
            out.append(f"reward={result.reward:.4g}")
            break
    return out


# ----------------------------------------------------------------------------- parser


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<offer>120</offer>", Offer((("price", 120.0),))),
        ("  <offer> 99 </offer>\n", Offer((("price", 99.0),))),
        ("<offer>price=7</offer>", Offer((("price", 7.0),))),
        ("I ask <offer>120</offer>", Offer((("price", 120.0),))),
        ("<say>fair?</say><offer>120</offer>", Offer((("price", 120.0),))),
        ("<offer>120</offer> <say>fair?</say>", Offer((("price", 120.0),))),
        ("<accept/>", Accept()),
        ("<accept />", Accept()),
        ("<reject/>", Reject()),
        ("<end/>", End()),
        ("<say> hello </say>", Say("hello")),
    ],
)
def test_parse_valid(text: str, expected: object) -> None:
    assert parse_action(text, PRICE) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty reply"),
        ("hello", "no action; use <offer>, <accept/>, <reject/> or <end/>"),
        ("<offer></offer>", "empty <offer>"),
        ("<offer>abc</offer>", "price needs a number, got 'abc'"),
        ("<offer>-5</offer>", "price needs a number, got '-5'"),
        ("<offer>1.5</offer>", "price must be a whole number"),
        ("<offer>600</offer>", "price must be 0-500"),
        ("<offer>5", "unclosed <offer>"),
        ("</offer>", "</offer> without <offer>"),
        ("<offer>5</offer><accept/>", "one action per reply"),
        ("<accept/> thanks", "text after the action: 'thanks'"),
        ("<say>a</say><say>b</say>", "use at most one <say>...</say>"),
        ("<say><accept/></say>", "no tags inside <say>"),
        ("<offer>cost=5</offer>", "unknown 'cost'; use price"),
        ("<offer>price=5;price=6</offer>", "price given twice"),
    ],
)
def test_parse_malformed(text: str, reason: str) -> None:
    assert parse_action(text, PRICE) == Malformed(reason)


def test_parse_multi_issue() -> None:
    offer = parse_action("<offer>term=12; price=100</offer>", CONTRACT)
    assert offer == Offer((("price", 100.0), ("term", 12.0)))
    assert isinstance(offer, Offer) and offer.as_dict() == {"price": 100.0, "term": 12.0}
    assert parse_action("<offer>price=100</offer>", CONTRACT) == Malformed("missing term")
    assert parse_action("<offer>100</offer>", CONTRACT) == Malformed(
        "write <offer>price=N;term=N</offer>"
    )
    assert parse_action("<offer>price=100;term=13</offer>", CONTRACT) == Malformed(
        "term must be 1-12"
    )


def test_format_offer_round_trips() -> None:
    assert format_offer(120.0, PRICE) == "<offer>120</offer>"
    decimal = single_issue("price", 0, 500, integer=False)
    assert format_offer({"price": 99.5}, decimal) == "<offer>99.5</offer>"
    assert parse_action("<offer>99.5</offer>", decimal) == Offer((("price", 99.5),))
    text = format_offer({"term": 6, "price": 80}, CONTRACT)
    assert text == "<offer>price=80;term=6</offer>"
    assert parse_action(text, CONTRACT) == Offer((("price", 80.0), ("term", 6.0)))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_parser_never_raises(text: str) -> None:
    assert parse_action(text, CONTRACT) is not None
    assert parse_action(text, PRICE) is not None


# ----------------------------------------------------------------------------- concession model


def test_concession_model_exact() -> None:
    temper = Temper(reservation=-80.0, rate=0.5, tolerance=2.0, insult=20.0, must_improve=True)
    stance = Stance(aspiration=-50.0, patience=2)
    stance, verdict = react(stance, temper, -90.0)  # buyer's utility of a price is -price
    assert (stance, verdict) == (Stance(-70.0, 2, -90.0), Verdict.COUNTER)
    stance, verdict = react(stance, temper, -95.0)  # asked more than before: a stall
    assert (stance, verdict) == (Stance(-80.0, 1, -95.0), Verdict.COUNTER)
    assert react(stance, temper, -81.0)[1] is Verdict.COUNTER  # never above the reservation
    assert react(stance, temper, -80.0)[1] is Verdict.ACCEPT
    assert react(stance, temper, -101.0) == (Stance(-80.0, 0, -101.0), Verdict.WALKOUT)
    assert deadline_schedule(80.0, 40.0, 3, 6, 1.0) == 60.0
    assert deadline_schedule(80.0, 40.0, 6, 6, 3.0) == 40.0


# ----------------------------------------------------------------------------- registry, tasks


@pytest.mark.parametrize("name", NAMES)
def test_tasks_deterministic_and_registered(name: str) -> None:
    tasks = envs.make_tasks(name, 6, seed=3)
    assert tasks == envs.make_tasks(name, 6, seed=3)
    assert tasks[:4] == envs.make_tasks(name, 4, seed=3)  # task i does not depend on n
    assert tasks != envs.make_tasks(name, 6, seed=4)
    assert len({t.task_id for t in tasks}) == 6
    assert all(t.task_id.startswith(f"{name}-") and "persona" in t.payload for t in tasks)
    messages = make(name).reset(tasks[0])
    assert [m["role"] for m in messages] == ["system", "user"]
    assert len(messages[0]["content"]) < 130  # short: a tiny model reads it every episode
    assert "persona" not in messages[0]["content"]


@pytest.mark.parametrize("name", NAMES)
def test_bad_arguments(name: str) -> None:
    with pytest.raises(ValueError, match="max_turns"):
        make(name, max_turns=0)
    with pytest.raises(ValueError, match="unknown style"):
        envs.demonstration(name, envs.make_tasks(name, 1, 0)[0], style="genius")
    env = make(name)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("<end/>")
    with pytest.raises(TypeError):
        env.restore("not a snapshot")


# ----------------------------------------------------------------------------- episodes


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("max_turns", [1, 4])
def test_malformed_turns_until_max_turns(name: str, max_turns: int) -> None:
    env = make(name, max_turns=max_turns)
    env.reset(envs.make_tasks(name, 1, 0)[0])
    counterpart = env.snapshot().counterpart
    for turn in range(max_turns):
        result = env.step("what about <offer>")
        assert result.info["malformed"] and result.info["error"] == "unclosed <offer>"
        assert result.info["turn"] == turn and result.reward == 0.0
        assert env.snapshot().counterpart == counterpart if not result.done else True
        if turn < max_turns - 1:
            assert not result.done
            assert result.observation == {"role": "user", "content": "Invalid: unclosed <offer>."}
    assert result.done and result.observation is None
    expected = "complete" if name == "ultimatum" else "timeout"
    assert result.info["outcome"] == expected and result.info["deal"] is False
    assert result.info["truncated"] is (expected == "timeout")
    with pytest.raises(RuntimeError, match="over"):
        env.step("<end/>")


@pytest.mark.parametrize("name", NAMES)
def test_reward_only_at_the_end(name: str) -> None:
    for t in envs.make_tasks(name, 8, seed=1):
        messages = envs.demonstration(name, t, style="strong")
        env = make(name)
        env.reset(t)
        responses = [m["content"] for m in messages if m["role"] == "assistant"]
        for i, response in enumerate(responses):
            result = env.step(response)
            assert result.done == (i == len(responses) - 1)
            if not result.done:
                assert result.reward == 0.0 and result.observation is not None
                assert result.info["outcome"] is None and result.info["value"] is None
        assert result.observation is None and result.reward == result.info["value"]
        assert result.info["correct"] == result.info["deal"]


@pytest.mark.parametrize("name", NAMES)
def test_end_gives_no_deal_at_the_start(name: str) -> None:
    env = make(name)
    env.reset(envs.make_tasks(name, 1, 0)[0])
    result = env.step("<end/>")
    assert result.done and result.reward == 0.0
    assert result.info["outcome"] == "ended" and result.info["deal"] is False


# ----------------------------------------------------------------------------- snapshots


@pytest.mark.parametrize("name", NAMES)
def test_snapshot_restore_round_trip(name: str) -> None:
    t = envs.make_tasks(name, 3, seed=2)[1]
    responses = [
        m["content"]
        for m in envs.demonstration(name, t, style="strong")
        if m["role"] == "assistant"
    ]
    env = make(name)
    env.reset(t)
    for response in responses:
        saved, key = env.snapshot(), env.state_key()
        first = env.step(response)
        after = env.state_key()
        for probe in ("<offer>1</offer>", "<reject/>", "<say>hm</say>", "<end/>"):
            env.restore(saved)  # a snapshot stays reusable after restores and steps
            env.step(probe)
        env.restore(saved)
        assert env.state_key() == key
        again = env.step(response)
        assert again == first and env.state_key() == after


@pytest.mark.parametrize("name", NAMES)
def test_state_key_ignores_wording(name: str) -> None:
    t = envs.make_tasks(name, 1, seed=5)[0]
    response = next(
        m["content"]
        for m in envs.demonstration(name, t, style="medium")
        if m["role"] == "assistant"
    )
    env = make(name)
    env.reset(t)
    start = env.state_key()
    saved = env.snapshot()
    env.step(response)
    plain = env.state_key()
    env.restore(saved)
    env.step(f"<say>let me think</say> {response}")
    assert env.state_key() == plain != start


# ----------------------------------------------------------------------------- demonstrations


@pytest.mark.parametrize("name", NAMES)
def test_demonstrations_reach_deals(name: str) -> None:
    tasks = envs.make_tasks(name, 30, seed=0)
    means = {}
    for style in ("weak", "medium", "strong"):
        rewards = []
        for t in tasks:
            messages = envs.demonstration(name, t, style=style)
            assert messages[0]["role"] == "system"
            roles = [m["role"] for m in messages[1:]]
            assert roles[::2] == ["user"] * len(roles[::2])
            assert roles[1::2] == ["assistant"] * len(roles[1::2])
            fmt = make(name).offer_format(t)
            for m in messages[2::2]:
                assert not isinstance(parse_action(m["content"], fmt), Malformed), m
            env = make(name)
            env.reset(t)
            for m in messages[2::2]:
                result = env.step(m["content"])
            rewards.append(result.reward)
        means[style] = statistics.mean(rewards)
        if style != "weak":
            assert sum(r > 0 for r in rewards) >= 0.7 * len(tasks), (style, rewards)
    assert means["weak"] <= means["strong"], means


# ----------------------------------------------------------------------------- responsiveness


def _rank(result) -> int:
    """How well an offer went for a deal: walk-out 0, refusal or counter 1, accepted 2."""
    info = result.info
    if info["outcome"] == "walkout":
        return 0
    accepted = info["outcome"] == "deal" or info.get("accepted") or info["reply"] == "Added."
    return 2 if accepted else 1


GENEROSITY = {  # offers from worst to best for the counterpart
    "haggle": [f"<offer>{p}</offer>" for p in range(200, 0, -7)],
    "retention": [f"<offer>{d}</offer>" for d in range(0, 101, 4)],
    "split_money": [f"<offer>{s}</offer>" for s in range(0, 101, 4)],
    "ultimatum": [f"<offer>{s}</offer>" for s in range(0, 101, 4)],
    "multi_issue": [f"<offer>price={p};term={t}</offer>" for p, t in GRID],
}


def _generosity(name: str, t: Task) -> list[str]:
    """Offers from worst to best for this task's counterpart."""
    if name == "multi_issue":  # order by this client's own utility
        weight = t.payload["persona"]["price_weight"]
        return sorted(GENEROSITY[name], key=lambda o: client_utility(weight, _deal(o)))
    if name == "upsell":  # pitches of one wanted add-on, dearest first
        item = max(t.payload["persona"]["values"].items(), key=lambda kv: kv[1])[0]
        return [f"<offer>{item}={p}</offer>" for p in range(200, -1, -3)]
    return GENEROSITY[name]


@pytest.mark.parametrize("name", NAMES)
def test_better_offers_get_better_or_equal_responses(name: str) -> None:
    for t in envs.make_tasks(name, 10, seed=7):
        env = make(name)
        env.reset(t)
        offers = _generosity(name, t)
        for warmup in (None, offers[len(offers) // 3]):
            if warmup is not None and env.step(warmup).done:
                break
            saved = env.snapshot()
            ranks = []
            for offer in offers:
                env.restore(saved)
                ranks.append(_rank(env.step(offer)))
            assert ranks == sorted(ranks), (t.payload, ranks)
            assert ranks[-1] == 2  # the most generous offer is always taken
            env.restore(saved)


def _deal(offer: str) -> tuple[float, float]:
    parsed = parse_action(offer, CONTRACT)
    assert isinstance(parsed, Offer)
    return parsed["price"], parsed["term"]


def test_counter_offers_move_toward_the_agent() -> None:
    """Higher asks get higher counters (anchoring), and every counter concedes."""
    t = envs.make_tasks("haggle", 1, seed=0)[0]
    env = make("haggle")
    opening = float(env.reset(t)[1]["content"].split()[-1].rstrip("."))
    saved = env.snapshot()
    counters = []
    for price in (t.payload["list_price"], t.payload["cost"] * 2, t.payload["cost"] * 1.5):
        env.restore(saved)
        result = env.step(f"<offer>{round(price)}</offer>")
        if result.info["outcome"] is None:
            counters.append(result.info["counter"])
    assert counters == sorted(counters, reverse=True) and len(counters) >= 2
    assert all(c > opening for c in counters)


# ----------------------------------------------------------------------------- hand-built cases

HAGGLE = task(
    "haggle",
    item="lamp",
    list_price=100,
    cost=40,
    persona={
        "reservation": 80,
        "opening": 50,
        "rate": 0.5,
        "patience": 2,
        "greed_tolerance": 0.25,
        "warns": True,
    },
)


def test_haggle_exact() -> None:
    env = make("haggle")
    assert env.reset(HAGGLE)[1] == {"role": "user", "content": "I'd pay 50."}
    # the bid moves halfway to each ask: 70, 77.5, then 80 is within reach
    offers = ["<offer>90</offer>", "<offer>85</offer>", "<offer>80</offer>"]
    assert replies(env, HAGGLE, offers) == ["No. 70?", "No. 78?", "Deal.", "reward=0.6667"]
    # <accept/> takes the standing bid of 70
    assert replies(env, HAGGLE, ["<offer>90</offer>", "<accept/>"]) == [
        "No. 70?",
        "Deal.",
        "reward=0.5",
    ]
    # stalling (the same ask again, or <reject/>) costs patience; a warning comes first
    assert replies(env, HAGGLE, ["<offer>90</offer>", "<offer>90</offer>", "<reject/>"]) == [
        "No. 70?",
        "Last chance. 80?",
        "I'll leave.",
        "reward=0",
    ]
    # so does an insult (more than 1.25 x the reservation)
    assert replies(env, HAGGLE, ["<offer>101</offer>", "<offer>150</offer>"]) == [
        "Last chance. 76?",
        "I'll leave.",
        "reward=0",
    ]


def test_haggle_never_sells_above_reservation() -> None:
    env = make("haggle", max_turns=20)
    env.reset(HAGGLE)
    for price in (99, 95, 90, 86, 84, 83, 82, 81):
        result = env.step(f"<offer>{price}</offer>")
        assert result.info["outcome"] is None
    assert result.info["counter"] == 80
    result = env.step("<offer>80</offer>")
    assert result.info["outcome"] == "deal" and result.reward == pytest.approx(40 / 60)


RETENTION = task(
    "retention",
    plan="music",
    monthly=20,
    persona={
        "threshold": 20,
        "ask": 50,
        "rate": 0.5,
        "patience": 3,
        "terse": False,
        "warns": True,
    },
)


def test_retention_exact() -> None:
    env = make("retention")
    assert env.reset(RETENTION)[1]["content"] == "I want to cancel."
    # the ask moves halfway to each offer: 30, then 22.5 (said as 22); <accept/> grants it
    offers = ["<offer>10</offer>", "<offer>15</offer>", "<accept/>"]
    assert replies(env, RETENTION, offers) == [
        "No. 30?",
        "Last chance. 22?",
        "Deal.",
        "reward=0.78",
    ]
    # every turn without a deal costs patience: after three they cancel
    offers = ["<offer>0</offer>", "<say>please</say>", "<offer>5</offer>"]
    assert replies(env, RETENTION, offers) == [
        "No. 25?",
        "Last chance. 25?",
        "Cancel it. Bye.",
        "reward=0",
    ]
    persona = {**RETENTION.payload["persona"], "terse": True}
    terse = task("retention", **{**RETENTION.payload, "persona": persona})
    offers = ["<offer>10</offer>", "<offer>25</offer>", "<offer>26</offer>"]
    assert replies(env, terse, offers) == ["No.", "Last chance.", "Deal.", "reward=0.74"]


SPLIT = task(
    "split_money",
    pot=100,
    persona={"minimum": 40, "demand": 80, "shape": 1.0, "rate": 0.0, "patience": 2, "warns": False},
)


def test_split_money_deadline() -> None:
    env = make("split_money", max_turns=4)
    # rate 0: only the deadline schedule moves the demand: 80 -> 70 -> 60 -> 50 -> 40
    assert replies(env, SPLIT, ["<offer>30</offer>"] * 3) == ["No. 70?", "No. 60?", "No. 50?"]
    saved = env.snapshot()
    result = env.step("<offer>39</offer>")  # on the last turn it takes its minimum, not less
    assert result.info["outcome"] == "timeout" and result.reward == 0.0
    env.restore(saved)
    result = env.step("<offer>40</offer>")
    assert result.info["outcome"] == "deal" and result.reward == pytest.approx(0.6)
    # offers below half its minimum are insults: two and it walks away
    assert replies(env, SPLIT, ["<offer>19</offer>", "<offer>19</offer>"]) == [
        "No. 70?",
        "Forget it.",
        "reward=0",
    ]


MULTI = task(
    "multi_issue",
    weights=[0.2, 0.8],
    persona={
        "price_weight": 0.8,
        "reservation": 0.5,
        "aspiration": 0.8,
        "rate": 0.5,
        "patience": 3,
        "warns": False,
    },
)


def test_multi_issue_logrolling_pays() -> None:
    env = make("multi_issue")
    assert env.reset(MULTI)[1]["content"] == "I propose price=50;term=12."
    # splitting both issues down the middle is worth 0.49 to the client: refused
    assert client_utility(0.8, (75, 7)) == pytest.approx(0.8 * 0.5 + 0.2 * 5 / 11)
    assert replies(env, MULTI, ["<offer>price=75;term=7</offer>"]) == ["No. price=65;term=7?"]
    # conceding the price it cares about and keeping the long term: accepted, worth 0.8
    assert replies(env, MULTI, ["<offer>price=50;term=12</offer>"]) == ["Deal.", "reward=0.8"]
    assert agent_value((0.2, 0.8), (75, 7)) == pytest.approx(0.2 * 0.5 + 0.8 * 6 / 11)


ULTIMATUM = task(
    "ultimatum",
    pot=100,
    persona={"threshold": 30, "grudge": 5, "anchoring": 0.5, "quit_after": 2, "warns": True},
)


def test_ultimatum_exact() -> None:
    env = make("ultimatum")
    assert env.reset(ULTIMATUM)[1]["content"] == "Your offer?"
    # rejected (grudge: threshold 35), accepted (anchoring: 37.5), rejected: it quits
    offers = ["<offer>20</offer>", "<offer>40</offer>", "<offer>37</offer>"]
    assert replies(env, ULTIMATUM, offers) == [
        "Last chance.",
        "Yes.",
        "No. I quit.",
        "reward=0.1",
    ]
    # proposing is the only move: <accept/> wastes the round
    env.reset(ULTIMATUM)
    result = env.step("<accept/>")
    assert result.info["malformed"] and result.info["error"] == "you propose: <offer>N</offer>"
    for _ in range(5):
        result = env.step("<offer>30</offer>")
    assert result.info["outcome"] == "complete" and result.reward == pytest.approx(5 * 70 / 600)


UPSELL = task(
    "upsell",
    items={"case": 20, "cable": 10},
    persona={
        "values": {"case": 25, "cable": 0},
        "band": 0.2,
        "factor": 0.8,
        "patience": 2,
        "warns": False,
    },
)


def test_upsell_exact() -> None:
    env = make("upsell")
    assert env.reset(UPSELL)[0]["content"].startswith("Sell add-ons: case 20, cable 10.")
    # within 1.2 x its value: a counter at 0.8 x value; accepting leaves 5 on the table
    assert replies(env, UPSELL, ["<offer>case=28</offer>", "<accept/>", "<end/>"]) == [
        "No. 20?",
        "Added.",
        "Thanks. Bye.",
        "reward=0.8",
    ]
    assert replies(env, UPSELL, ["<offer>case=25</offer>", "<end/>"]) == [
        "Added.",
        "Thanks. Bye.",
        "reward=1",
    ]
    # refusals annoy; at patience 2 the customer cancels everything
    offers = ["<offer>case=24</offer>", "<offer>cable=1</offer>", "<offer>case=1</offer>"]
    assert replies(env, UPSELL, offers) == ["Added.", "No.", "Enough. Cancel all.", "reward=0"]
    env.reset(UPSELL)
    result = env.step("<accept/>")
    assert result.info["malformed"] and result.info["error"] == "no counter-offer to answer"


# ----------------------------------------------------------------------------- properties


def _best_possible(name: str, t: Task, max_turns: int) -> float:
    """The most the agent can get without the counterpart going below its reservation."""
    p, persona = t.payload, t.payload["persona"]
    if name == "haggle":
        return (persona["reservation"] - p["cost"]) / (p["list_price"] - p["cost"])
    if name == "retention":
        return 1 - persona["threshold"] / 100
    if name == "split_money":
        return 1 - persona["minimum"] / 100
    if name == "ultimatum":
        return 1 - persona["threshold"] / 100
    if name == "multi_issue":
        deals = [(price, term) for price in range(50, 101) for term in range(1, 13)]
        ok = [
            d for d in deals if client_utility(persona["price_weight"], d) >= persona["reservation"]
        ]
        return max(agent_value(tuple(p["weights"]), d) for d in ok)
    return 1.0


FRAGMENTS = st.sampled_from(
    [
        "<offer>",
        "</offer>",
        "<accept/>",
        "<reject/>",
        "<end/>",
        "<say>",
        "</say>",
        "=",
        ";",
        "price",
        "term",
        "case",
        "care",
        "0",
        "7",
        "50",
        "99.5",
        "1e9",
        " ",
        "\n",
        "é",
    ]
)
RESPONSE = st.one_of(
    st.text(max_size=40),
    st.lists(FRAGMENTS, max_size=8).map("".join),
    st.integers(0, 120).map(lambda n: f"<offer>{n}</offer>"),
    st.tuples(st.integers(40, 110), st.integers(0, 14)).map(
        lambda d: f"<offer>price={d[0]};term={d[1]}</offer>"
    ),
    st.sampled_from(["<accept/>", "<reject/>", "<say>ok</say>", "<end/>"]),
)


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    index=st.integers(0, 20),
    responses=st.lists(RESPONSE, min_size=1, max_size=8),
)
def test_arbitrary_replies_never_crash_or_beat_the_reservation(
    name: str, index: int, responses: list[str]
) -> None:
    t = envs.make_tasks(name, index + 1, seed=11)[index]
    env = make(name, max_turns=6)
    env.reset(t)
    for i, response in enumerate(responses):
        result = env.step(response)
        assert isinstance(result.info["malformed"], bool)
        assert result.info["turn"] == i
        if result.done:
            assert -1.0 <= result.reward <= _best_possible(name, t, 6) + 1e-9
            assert result.info["outcome"] in {"deal", "walkout", "ended", "timeout", "complete"}
            break
        assert result.reward == 0.0 and result.observation is not None


# ----------------------------------------------------------------------------- textarena (optional)

HAS_TEXTARENA = importlib.util.find_spec("textarena") is not None
needs_textarena = pytest.mark.skipif(
    not HAS_TEXTARENA,
    reason="textarena not installed (optional extra: pip install textarena==0.7.4)",
)


def test_textarena_adapter_imports_without_textarena(monkeypatch: pytest.MonkeyPatch) -> None:
    from turnrl.envs.negotiation import textarena_adapter

    monkeypatch.setitem(sys.modules, "textarena", None)  # simulate a missing install
    monkeypatch.delitem(sys.modules, "textarena.envs.IteratedUltimatumGame.env", raising=False)
    env = textarena_adapter.TextArenaUltimatumEnv()
    with pytest.raises(ImportError, match=r"pip install 'textarena==0\.7\.4'"):
        env.reset(ULTIMATUM)


@needs_textarena
def test_textarena_ultimatum_episode() -> None:
    from turnrl.envs.negotiation.textarena_adapter import TextArenaUltimatumEnv

    env = TextArenaUltimatumEnv(rounds=3)
    messages = env.reset(ULTIMATUM)
    assert "Iterated Ultimatum Game" in messages[0]["content"]
    # threshold 30: rejected (grudge -> 35), accepted in both formats (anchoring -> 37.5, 38.75)
    first = env.step("<offer>20</offer>")
    assert first.info["accepted"] is False and not first.info["malformed"]
    assert "rejected" in first.observation["content"]
    assert env.step("[Offer: $40]").info["accepted"] is True
    last = env.step("<offer>40</offer>")
    assert last.done and last.info["outcome"] == "complete"
    assert last.reward == pytest.approx(120 / 300) and last.info["deal"] is True


@needs_textarena
def test_textarena_invalid_moves_and_snapshots() -> None:
    from turnrl.envs.negotiation.textarena_adapter import TextArenaUltimatumEnv, demonstration

    env = TextArenaUltimatumEnv(rounds=3)
    env.reset(ULTIMATUM)
    saved, key = env.snapshot(), env.state_key()
    once = env.step("no idea")
    assert once.info["malformed"] and "invalid move" in once.info["error"] and not once.done
    twice = env.step("still no idea")
    assert twice.done and twice.info["outcome"] == "forfeit" and twice.reward == 0.0
    env.restore(saved)
    assert env.state_key() == key
    compact = env.step("<offer>35</offer>")
    env.restore(saved)
    native = env.step("[Offer: $35]")
    assert compact == native
    env.restore(saved)  # the snapshot is still reusable after two restores
    assert env.step("<offer>35</offer>") == compact
    messages = demonstration(ULTIMATUM, style="medium", rounds=3)
    assert [m["role"] for m in messages[:4]] == ["system", "user", "assistant", "user"]


@needs_textarena
@pytest.mark.parametrize(
    ("response", "problem"),
    [
        ("[Offer: $40]", None),
        ("I think this is fair. [Offer: $5]", None),
        ("<offer>35</offer>", None),
        ("[Offer: $150]", "Offer must be between $0 and $100."),
        ("<accept/>", "Proposer must make an offer using the format [Offer: $X]."),
        ("no idea", "Proposer must make an offer using the format [Offer: $X]."),
    ],
)
def test_textarena_check_response_agrees_with_the_game(response: str, problem) -> None:
    from turnrl.envs.negotiation.textarena_adapter import TextArenaUltimatumEnv

    env = TextArenaUltimatumEnv(rounds=3)
    assert env.check_response(ULTIMATUM, response) == problem  # no episode needed
    env.reset(ULTIMATUM)
    assert env.step(response).info["malformed"] is (problem is not None)
