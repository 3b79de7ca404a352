"""The negotiation action language: what the agent writes, parsed without ever raising.

Kept tiny on purpose (a ~0.1M-parameter character model learns it):

* ``<offer>120</offer>``: an offer on the setting's default issue;
  ``<offer>price=100;term=12</offer>``: named issues (``;``-separated ``key=number``);
* ``<accept/>``: take the counterpart's standing counter-offer;
* ``<reject/>``: turn the counter-offer down without making a new one;
* ``<end/>``: end the conversation now;
* ``<say>...</say>``: optional free text, at most one block, anywhere. A reply that is
  only a ``<say>`` block is a :class:`Say` action (talking without offering).

Free text before the action tag is allowed (reasoning); text after it is not,
except a ``<say>`` block. Exactly one action tag. Numbers are plain decimals
(``120``, ``99.5``); each issue has a range and may require whole numbers.
Anything else parses to a :class:`~turnrl.envs.tools.Malformed` with a short reason
the environment shows back to the agent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from turnrl.envs.safe_math import format_number
from turnrl.envs.tools import Malformed

ACCEPT, REJECT, END = "<accept/>", "<reject/>", "<end/>"
OFFER_OPEN, OFFER_CLOSE = "<offer>", "</offer>"
SAY_OPEN, SAY_CLOSE = "<say>", "</say>"
LAST_CHANCE = "Last chance."
"""How a counterpart that warns starts its reply when one bad move from leaving."""
MAX_SAY = 200
"""Longest ``<say>`` text kept, in characters (longer text is truncated, not refused)."""

# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Offer:
    """An offer: ``terms`` is a sorted tuple of ``(issue, value)`` pairs (hashable)."""

    terms: tuple[tuple[str, float], ...]

    def as_dict(self) -> dict[str, float]:
        """The terms as a plain dict."""
        return dict(self.terms)

    def __getitem__(self, issue: str) -> float:
        return self.as_dict()[issue]


@dataclass(frozen=True)
class Accept:
    """Accept the counterpart's standing counter-offer."""


@dataclass(frozen=True)
class Reject:
    """Reject the counterpart's counter-offer without making a new offer."""


@dataclass(frozen=True)
class End:
    """End the conversation now (walk away, or close the sale)."""


@dataclass(frozen=True)
class Say:
    """Only talk: no offer, no decision (the scripted counterpart treats it as a stall)."""

    text: str


Action = Offer | Accept | Reject | End | Say | Malformed

# ----------------------------------------------------------------------------- issues


@dataclass(frozen=True)
class Issue:
    """One negotiable quantity: its name, inclusive range, and whether it is a whole number."""

    name: str
    low: float
    high: float
    integer: bool = True

    def describe(self) -> str:
        return f"{self.name} {format_number(self.low)}-{format_number(self.high)}"


@dataclass(frozen=True)
class OfferFormat:
    """What offers may contain in one setting.

    ``default``: the issue a bare number means (``None``: names are required).
    ``require_all``: every issue must be named (multi-issue deals); otherwise any
    non-empty subset (add-on bundles).
    """

    issues: tuple[Issue, ...]
    default: str | None = None
    require_all: bool = False

    def issue(self, name: str) -> Issue | None:
        return next((i for i in self.issues if i.name == name), None)

    def example(self) -> str:
        """An example offer body, for error messages."""
        if self.default is not None:
            return "N"
        shown = self.issues if self.require_all else self.issues[:1]
        return ";".join(f"{i.name}=N" for i in shown)


def single_issue(name: str, low: float, high: float, *, integer: bool = True) -> OfferFormat:
    """The format of a one-issue setting: bare numbers mean ``name``."""
    return OfferFormat((Issue(name, low, high, integer),), default=name)


# ----------------------------------------------------------------------------- parser

_TAG = re.compile(r"<say>|</say>|<offer>|</offer>|<(?:accept|reject|end)\s*/>")
_NUMBER = re.compile(r"\d{1,9}(?:\.\d{1,6})?")
_TERM = re.compile(r"([a-z_][a-z0-9_]{0,19})\s*=\s*(\S*)")
_SIMPLE = {"accept": Accept(), "reject": Reject(), "end": End()}


def _short(text: str, limit: int = 20) -> str:
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _split_say(text: str) -> tuple[str, str | None] | Malformed:
    """Remove the single ``<say>`` block: ``(rest with a marker, said text)``."""
    opens, closes = text.count(SAY_OPEN), text.count(SAY_CLOSE)
    if opens == 0 and closes == 0:
        return text, None
    if opens != 1 or closes != 1:
        return Malformed("use at most one <say>...</say>")
    start, end = text.index(SAY_OPEN), text.index(SAY_CLOSE)
    if end < start:
        return Malformed("</say> before <say>")
    said = text[start + len(SAY_OPEN) : end]
    if _TAG.search(said):
        return Malformed("no tags inside <say>")
    return text[:start] + "\x00" + text[end + len(SAY_CLOSE) :], said.strip()[:MAX_SAY]


def _parse_value(raw: str, issue: Issue) -> float | Malformed:
    if not _NUMBER.fullmatch(raw):
        return Malformed(f"{issue.name} needs a number, got {_short(raw)}")
    value = float(raw)
    if issue.integer and not value.is_integer():
        return Malformed(f"{issue.name} must be a whole number")
    if not issue.low <= value <= issue.high:
        return Malformed(
            f"{issue.name} must be {format_number(issue.low)}-{format_number(issue.high)}"
        )
    return value


def parse_offer_body(body: str, fmt: OfferFormat) -> Offer | Malformed:
    """Parse what is between ``<offer>`` and ``</offer>`` against ``fmt``."""
    body = body.strip()
    if not body:
        return Malformed("empty <offer>")
    if fmt.default is not None and "=" not in body:
        issue = fmt.issue(fmt.default)
        assert issue is not None, f"default issue {fmt.default!r} not in the format"
        value = _parse_value(body, issue)
        return value if isinstance(value, Malformed) else Offer(((issue.name, value),))
    terms: dict[str, float] = {}
    for part in body.split(";"):
        match = _TERM.fullmatch(part.strip())
        if match is None:
            return Malformed(f"write <offer>{fmt.example()}</offer>")
        name, raw = match.groups()
        issue = fmt.issue(name)
        if issue is None:
            known = ", ".join(i.name for i in fmt.issues)
            return Malformed(f"unknown {_short(name)}; use {known}")
        if name in terms:
            return Malformed(f"{name} given twice")
        value = _parse_value(raw, issue)
        if isinstance(value, Malformed):
            return value
        terms[name] = value
    missing = [i.name for i in fmt.issues if i.name not in terms]
    if fmt.require_all and missing:
        return Malformed(f"missing {', '.join(missing)}")
    return Offer(tuple(sorted(terms.items())))


def parse_action(text: str, fmt: OfferFormat) -> Action:
    """Parse one agent reply into an action (see the module docstring). Never raises."""
    if not isinstance(text, str) or not text.strip():
        return Malformed("empty reply")
    split = _split_say(text)
    if isinstance(split, Malformed):
        return split
    rest, said = split
    tags = list(_TAG.finditer(rest))
    if not tags:
        if said is not None and not rest.replace("\x00", "").strip():
            return Say(said)
        return Malformed("no action; use <offer>, <accept/>, <reject/> or <end/>")
    first = tags[0]
    if first.group() == OFFER_CLOSE:
        return Malformed("</offer> without <offer>")
    if first.group() == OFFER_OPEN:
        if len(tags) < 2 or tags[1].group() != OFFER_CLOSE:
            return Malformed("unclosed <offer>")
        action: Action = parse_offer_body(rest[first.end() : tags[1].start()], fmt)
        last = tags[1]
        extra = tags[2:]
    else:
        action = _SIMPLE[first.group()[1:-2].strip()]
        last, extra = first, tags[1:]
    if extra:
        return Malformed("one action per reply")
    trailing = rest[last.end() :].replace("\x00", "").strip()
    if trailing:
        return Malformed(f"text after the action: {_short(trailing)}")
    return action


# ----------------------------------------------------------------------------- formatting


def format_terms(terms: Mapping[str, float] | float, fmt: OfferFormat) -> str:
    """The body of an offer: a bare number on the default issue, else ``k=v;k=v``."""
    if not isinstance(terms, Mapping):
        return format_number(terms)
    if fmt.default is not None and set(terms) == {fmt.default}:
        return format_number(terms[fmt.default])
    order = [i.name for i in fmt.issues if i.name in terms]
    order += [name for name in terms if name not in order]
    return ";".join(f"{name}={format_number(terms[name])}" for name in order)


def format_offer(terms: Mapping[str, float] | float, fmt: OfferFormat) -> str:
    """Render an offer as the agent writes it (``<offer>120</offer>``)."""
    return f"{OFFER_OPEN}{format_terms(terms, fmt)}{OFFER_CLOSE}"
