"""The lookup knowledge base and its multi-hop questions, generated from a seed.

Every task carries its own small knowledge base (like the distractor setting of
HotpotQA, where each question comes with its own set of paragraphs), so nothing
can be memorised across tasks: the only way to an answer is to search.

A knowledge base holds people, companies and cities, linked by three relations:

========  ================  =====================================================
relation  from -> to        who has it
========  ================  =====================================================
mentor    person -> person  every *junior* (mentors are the *seniors*)
firm      person -> company every person
city      company -> city   every company
========  ================  =====================================================

Each fact is one short line, ``"Ada Lin mentor: Bo Kay"``. Questions follow a
chain of relations from a subject, written as possessives in the order they are
followed: ``"Ada Lin's mentor's firm's city?"`` (3 hops: mentor, then firm, then
city). Names come in *near-twin* pairs (``Ada Lin`` / ``Ada Lim``, ``Orbix`` /
``Orbex``): a twin shares a name word (so a search for one also returns the
other's facts) or differs by one letter (so a careless copy follows the wrong
entity).

A question is kept only if its answer is exactly ``hops`` facts away from its
subject in the undirected fact graph, and every entity on its chain is
distinct: no shorter path (a junior at the same firm as her mentor, two firms in
one city) lets a skipped hop land on the right answer. Generation is
deterministic per seed; names are kept short for a character-level model.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from turnrl.types import Task

FIRST_NAMES = (
    "Ada", "Abe", "Bo", "Cy", "Dot", "Eli", "Fay", "Gus",
    "Hal", "Ivy", "Jo", "Kai", "Lu", "Max", "Ned", "Oz",
)  # fmt: skip
"""First names (every name word has at least two letters: the retriever ignores shorter)."""

LAST_NAME_PAIRS = (
    ("Lin", "Lim"), ("Kay", "Kao"), ("Dee", "Dey"), ("Rey", "Roy"),
    ("Tam", "Tan"), ("Orr", "Orn"), ("Poe", "Pae"), ("Vos", "Vas"),
)  # fmt: skip
"""Last names in one-letter-apart pairs."""

COMPANY_PAIRS = (
    ("Orbix", "Orbex"), ("Zenta", "Zenda"), ("Nova", "Nuva"), ("Arca", "Arco"),
    ("Kepa", "Kepo"), ("Tela", "Tola"), ("Vanta", "Vanto"), ("Lumo", "Luma"),
)  # fmt: skip
"""Company names in one-letter-apart pairs."""

CITIES = ("Rome", "Oslo", "Lima", "Riga", "Bern", "Baku", "Doha", "Lyon", "Pisa", "Nice", "Cork")
"""City names."""

RELATIONS: dict[str, tuple[str, str]] = {
    "mentor": ("person", "person"),
    "firm": ("person", "company"),
    "city": ("company", "city"),
}
"""Relation name -> (subject kind, object kind)."""

CHAINS: dict[int, tuple[tuple[str, ...], ...]] = {
    1: (("mentor",), ("firm",), ("city",)),
    2: (("mentor", "firm"), ("firm", "city")),
    3: (("mentor", "firm", "city"),),
}
"""The relation chains a question of each hop count may follow."""

HOPS = tuple(sorted(CHAINS))


@dataclass(frozen=True)
class Fact:
    """One (subject, relation, object) triple."""

    subject: str
    relation: str
    object: str

    @property
    def text(self) -> str:
        """The line the retriever indexes and the agent reads: ``"Ada Lin mentor: Bo Kay"``."""
        return f"{self.subject} {self.relation}: {self.object}"


@dataclass(frozen=True)
class KBSize:
    """How many entities of each kind a knowledge base has."""

    juniors: int = 4
    """People with a mentor."""
    seniors: int = 2
    """Mentors (people without one)."""
    companies: int = 4
    cities: int = 3

    def __post_init__(self) -> None:
        if min(self.juniors, self.seniors, self.companies, self.cities) < 1:
            raise ValueError(f"every kind needs at least one entity: {self}")
        if self.juniors + self.seniors > 2 * len(FIRST_NAMES):
            raise ValueError(f"at most {2 * len(FIRST_NAMES)} people: {self}")
        if self.companies > 2 * len(COMPANY_PAIRS) or self.cities > len(CITIES):
            raise ValueError(f"at most {2 * len(COMPANY_PAIRS)} companies and {len(CITIES)} cities")


def _twin_people(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct person names in near-twin pairs (same first name and one-letter-apart
    last names, or different first names and the same last name)."""
    firsts = rng.sample(FIRST_NAMES, len(FIRST_NAMES))
    pairs = rng.sample(LAST_NAME_PAIRS, len(LAST_NAME_PAIRS))
    names: list[str] = []
    while len(names) < n:
        k = len(names) // 2
        if rng.random() < 0.5:  # same first name, last names one letter apart
            first, (last_a, last_b) = firsts[k], pairs[k]
            names += [f"{first} {last_a}", f"{first} {last_b}"]
        else:  # same last name, different first names
            last = pairs[k][rng.randrange(2)]
            names += [f"{firsts[k]} {last}", f"{firsts[-1 - k]} {last}"]
    return names[:n]


def _twin_companies(rng: random.Random, n: int) -> list[str]:
    pairs = rng.sample(COMPANY_PAIRS, len(COMPANY_PAIRS))
    return [name for pair in pairs for name in pair][:n]


@dataclass(frozen=True)
class KnowledgeBase:
    """The facts of one task, in retrieval order."""

    facts: tuple[Fact, ...]

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(f.text for f in self.facts)

    def find(self, subject: str, relation: str) -> int | None:
        """Index of the fact ``subject relation: ...`` (None if there is none)."""
        for i, fact in enumerate(self.facts):
            if fact.subject == subject and fact.relation == relation:
                return i
        return None

    def follow(self, subject: str, chain: Sequence[str]) -> list[int] | None:
        """Indices of the facts on ``chain`` from ``subject`` (None if a link is missing)."""
        path: list[int] = []
        entity = subject
        for relation in chain:
            index = self.find(entity, relation)
            if index is None:
                return None
            path.append(index)
            entity = self.facts[index].object
        return path

    def distance(self, source: str, target: str) -> int | None:
        """Fewest facts linking two entities, in either direction (BFS); None if unlinked."""
        neighbours: dict[str, set[str]] = {}
        for fact in self.facts:
            neighbours.setdefault(fact.subject, set()).add(fact.object)
            neighbours.setdefault(fact.object, set()).add(fact.subject)
        seen, queue = {source: 0}, deque([source])
        while queue:
            entity = queue.popleft()
            if entity == target:
                return seen[entity]
            for nxt in sorted(neighbours.get(entity, ())):
                if nxt not in seen:
                    seen[nxt] = seen[entity] + 1
                    queue.append(nxt)
        return None

    def to_payload(self) -> list[list[str]]:
        return [[f.subject, f.relation, f.object] for f in self.facts]

    @classmethod
    def from_payload(cls, facts: Sequence[Sequence[str]]) -> KnowledgeBase:
        return cls(tuple(Fact(*fact) for fact in facts))


def generate_kb(rng: random.Random, size: KBSize) -> KnowledgeBase:
    """One random knowledge base of ``size`` (facts shuffled, so positions carry no hint)."""
    people = _twin_people(rng, size.juniors + size.seniors)
    juniors, seniors = people[: size.juniors], people[size.juniors :]
    companies = _twin_companies(rng, size.companies)
    cities = rng.sample(CITIES, size.cities)
    facts = [Fact(p, "mentor", rng.choice(seniors)) for p in juniors]
    facts += [Fact(p, "firm", rng.choice(companies)) for p in people]
    if size.companies <= size.cities:
        located = rng.sample(cities, size.companies)
    else:
        located = [rng.choice(cities) for _ in companies]
    facts += [Fact(c, "city", city) for c, city in zip(companies, located, strict=True)]
    rng.shuffle(facts)
    return KnowledgeBase(tuple(facts))


@dataclass(frozen=True)
class Question:
    """A multi-hop question over one knowledge base, with its gold chain."""

    subject: str
    chain: tuple[str, ...]
    answer: str
    gold: tuple[int, ...]
    """Indices of the facts on the chain, in hop order."""

    @property
    def hops(self) -> int:
        return len(self.chain)

    @property
    def text(self) -> str:
        """``"Ada Lin's mentor's firm's city?"``."""
        return f"{self.subject}'s " + "'s ".join(self.chain) + "?"


def valid_questions(kb: KnowledgeBase, hops: int) -> list[Question]:
    """Every question of ``hops`` hops whose answer is exactly ``hops`` facts away and whose
    chain visits distinct entities, in a deterministic order."""
    out = []
    subjects = sorted({f.subject for f in kb.facts})
    for chain in CHAINS[hops]:
        for subject in subjects:
            path = kb.follow(subject, chain)
            if path is None:
                continue
            entities = [subject, *(kb.facts[i].object for i in path)]
            if len(set(entities)) != len(entities):
                continue
            answer = entities[-1]
            if kb.distance(subject, answer) == hops:
                out.append(Question(subject, chain, answer, tuple(path)))
    return out


def make_question(rng: random.Random, hops: int, size: KBSize) -> tuple[KnowledgeBase, Question]:
    """A knowledge base and one valid ``hops``-hop question over it (knowledge bases without
    one are redrawn from the same stream, so the result is deterministic)."""
    if hops not in CHAINS:
        raise ValueError(f"hops must be one of {HOPS}, got {hops}")
    for _attempt in range(1000):
        kb = generate_kb(rng, size)
        questions = valid_questions(kb, hops)
        if questions:
            return kb, rng.choice(questions)
    raise ValueError(f"no valid {hops}-hop question in 1000 knowledge bases of {size}")


def question_task(kb: KnowledgeBase, question: Question) -> Task:
    """A :class:`Task` whose JSON payload holds everything needed to rebuild the episode."""
    payload: dict[str, Any] = {
        "question": question.text,
        "answer": question.answer,
        "subject": question.subject,
        "chain": list(question.chain),
        "gold": list(question.gold),
        "facts": kb.to_payload(),
    }
    digest = hashlib.sha1(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
    return Task(f"lookup-h{question.hops}-{digest}", payload, (f"hop{question.hops}",))


def hop_counts(n: int, fractions: Sequence[float]) -> list[int]:
    """How many of ``n`` tasks have 1, 2, 3 hops: largest-remainder rounding of ``fractions``."""
    if len(fractions) != len(HOPS) or min(fractions) < 0 or sum(fractions) <= 0:
        raise ValueError(f"hop_fractions needs {len(HOPS)} non-negative shares, got {fractions}")
    total = sum(fractions)
    exact = [n * f / total for f in fractions]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


def lookup_tasks(
    n: int,
    seed: int,
    hop_fractions: Sequence[float] = (0.4, 0.4, 0.2),
    *,
    juniors: int = 4,
    seniors: int = 2,
    companies: int = 4,
    cities: int = 3,
) -> list[Task]:
    """``n`` tasks, each with its own knowledge base, deterministic from ``seed``.

    ``hop_fractions`` are the shares of 1-, 2- and 3-hop questions (rounded so
    the counts sum to ``n``); tasks are tagged ``hop1``, ``hop2``, ``hop3``.
    """
    if n < 0:
        raise ValueError(f"need n >= 0, got {n}")
    size = KBSize(juniors, seniors, companies, cities)
    rng = random.Random(seed)
    hops = [
        h for h, count in zip(HOPS, hop_counts(n, hop_fractions), strict=True) for _ in range(count)
    ]
    rng.shuffle(hops)
    return [
        question_task(*make_question(random.Random(rng.randrange(2**63)), h, size)) for h in hops
    ]
