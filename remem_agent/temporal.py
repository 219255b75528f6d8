"""Time expressions in text, resolved against the moment the text was written.

A turn said on Monday 8 May 2023 that reads "I went to the support group yesterday" is about Sunday 7 May;
"last month" there is April 2023. :func:`resolve` finds such expressions and returns each as a
:class:`TimeMention`: the words, and the range of time they name (``start`` inclusive, ``end`` exclusive,
epoch seconds, whole UTC days) with its grain. At ``add`` the library resolves every memory's text
against its own time (``valid_from``, when it was said or became true) and keeps the mentions beside the
memory; a query is resolved against the search's ``now``, and the ranges of both are compared.

What is resolved (case-insensitive; the rules for ambiguous words are part of the contract and tested):

- days: ``today``, ``tonight``, ``this morning/afternoon/evening``, ``yesterday``, ``last night``,
  ``tomorrow``, ``the day before yesterday``, ``the day after tomorrow``, ``N days ago``, ``in N days``;
- weekdays: ``last Friday`` is the latest Friday strictly before the anchor's day (on a Friday, a week
  earlier); ``next Friday`` and ``coming Friday`` the first strictly after it (on a Friday, a week later);
  ``this Friday`` the Friday of the anchor's Monday-to-Sunday week. A bare ``Friday`` or ``on Friday`` is
  **not** resolved: only the tense of the sentence tells past from future;
- weeks (Monday to Sunday) and weekends (Saturday and Sunday): ``last/this/next week``, ``N weeks ago``,
  ``last/this/next weekend``, ``N weekends ago``. ``last weekend`` is the latest weekend that ended before
  the anchor's day (on a Saturday or Sunday, the one before); ``this weekend`` is the anchor week's;
- months: ``last/this/next month``, ``N months ago``, ``June 2020``, and a month name after a preposition
  or modifier (``in June``, ``since June``, ``early June``, ``last June``). Without a year a month is the
  anchor year's; ``last June`` is the latest June before the anchor's month, ``next June`` the first after;
- years: ``last/this/next year``, ``N years ago``, and a year from 1800 to 2199 after a preposition (``in
  2016``, ``since 2019``, ``back in 2016``): a bare number such as "2000 people", or "a team of 2000", is not a
  year;
- dates: ``8 May 2023``, ``8th of May, 2023``, ``May 8, 2023``, ``May 8th``, ``2023-05-08`` (a date without
  a year is in the anchor's year; a date that does not exist, such as 30 February, is skipped).

Counts are digits or the words one to twelve, ``a``/``an`` (one) and ``a couple of`` (two). Vague words
("recently", "a few weeks ago", "the other day", seasons) are not resolved. A month name needs a date
context, so "May I ask", "I'll march on" and "Sat down" name no time. Expressions never overlap: where
two could match the same words, the longer, more specific one wins.

Everything is computed in UTC days, as the ledger keeps times: a mention whose range would fall outside
years 1-9999 is dropped, and a text without an anchor time resolves nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal

from remem_agent._time import MAX_EPOCH, MIN_EPOCH

# The resolver's version: a store records which one filled its ``memory_times`` (remem_agent/store/times.py)
# and re-resolves every memory when it is opened by another one. Bump it with any change of what resolves.
RESOLVER_VERSION = 1

Grain = Literal["day", "week", "weekend", "month", "year"]
GRAINS: tuple[Grain, ...] = ("day", "week", "weekend", "month", "year")

_MONTHS = {
    "january": 1, "february": 2, "march": 3, "april": 4, "may": 5, "june": 6, "july": 7, "august": 8,
    "september": 9, "october": 10, "november": 11, "december": 12, "jan": 1, "feb": 2, "mar": 3, "apr": 4,
    "jun": 6, "jul": 7, "aug": 8, "sep": 9, "sept": 9, "oct": 10, "nov": 11, "dec": 12,
}  # fmt: skip
_WEEKDAYS = {"monday": 0, "tuesday": 1, "wednesday": 2, "thursday": 3, "friday": 4, "saturday": 5, "sunday": 6}
_COUNTS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "couple of": 2,
}  # fmt: skip

_MONTH = r"(?:" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")"
_FULL_MONTH = r"(?:january|february|march|april|may|june|july|august|september|october|november|december)"
_WEEKDAY = r"(?:" + "|".join(_WEEKDAYS) + r")"
_COUNT = r"(?:\d{1,3}|a couple of|couple of|" + "|".join(w for w in _COUNTS if " " not in w) + r")"
_UNIT = r"(?:day|week|weekend|month|year)s?"
_ORD = r"(?:st|nd|rd|th)?"
_YEAR = r"(?:1\d{3}|2\d{3})"
# A year named by itself ("in 2016"): 1800-2199 only, so "in 1473 units" is no year
_BARE_YEAR = r"(?:1[89]\d\d|2[01]\d\d)"
_PREP = (
    r"(?:in|on|during|since|until|till|by|of|from|through|throughout|before|after|around|early|late|mid-?|"
    r"last|next|this|coming|the end of|the start of|the beginning of|the middle of)"
)

# Alternatives in priority order: at one position the first that matches wins, so the more specific
# forms (full dates) come before the shorter ones they contain (a month name, a year).
_GRAMMAR = (
    r"\b(?:"
    rf"(?P<iso>(?P<iy>\d{{4}})-(?P<im>\d{{1,2}})-(?P<id>\d{{1,2}}))"
    rf"|(?P<dmy>(?P<dd>\d{{1,2}}){_ORD}(?:\s+of)?\s+(?P<dm>{_MONTH})\.?(?:,?\s+(?P<dy>{_YEAR}))?)"
    rf"|(?P<mdy>(?P<mm>{_MONTH})\.?\s+(?P<md>\d{{1,2}}){_ORD}\b(?:,?\s+(?P<my>{_YEAR}))?)"
    rf"|(?P<monthyear>(?P<mym>{_MONTH})\.?,?\s+(?P<myy>{_YEAR}))"
    r"|(?P<daybefore>the day before yesterday)|(?P<dayafter>the day after tomorrow)"
    r"|(?P<today>today|tonight|this (?:morning|afternoon|evening))"
    r"|(?P<yesterday>yesterday|last night)|(?P<tomorrow>tomorrow)"
    rf"|(?P<ago>(?P<an>{_COUNT})\s+(?P<au>{_UNIT})\s+ago)"
    rf"|(?P<ahead>in\s+(?P<hn>{_COUNT})\s+(?P<hu>{_UNIT}))"
    rf"|(?P<rel>(?P<rw>last|this|next|coming|past)\s+(?P<ru>week|weekend|month|year|(?P<rd>{_WEEKDAY})))"
    rf"|(?P<rmonth>(?P<rmw>last|next|this)\s+(?P<rmm>{_FULL_MONTH}))"
    rf"|(?P<pmonth>(?P<pp>{_PREP})\s+(?P<pm>{_FULL_MONTH})(?!\.?\s+\d{{1,2}}{_ORD}\b)(?:,?\s+(?P<py>{_YEAR}))?)"
    rf"|(?P<pyear>(?:back\s+in|in|since|from|until|till|by|during|around|before|after|the year)\s+(?P<yy>{_BARE_YEAR}))"
    r")\b"
)
# The cheap test in front of the grammar: a text where no word starts with one of these names no time. Numbers
# count only as a year (1800-2199) or the start of an ISO date: every other number the grammar reads ("3 days
# ago", "8 May") comes with one of the words.
_KEYWORDS = (
    r"(?:1[89]|2[01])\d\d\b|\d{4}-|day|yesterday|today|tonight|tomorrow|morning|afternoon|evening|night|ago|week|month|year|"
    + "|".join(_WEEKDAYS)
    + "|"
    + "|".join(m for m in _MONTHS if len(m) > 3 or m == "may")
)
# Both run case-sensitively over the lower-cased text (several times faster than IGNORECASE); a text whose
# lower-case form has another length (a few non-ASCII letters) is matched with the IGNORECASE twins instead.
_PATTERN, _PATTERN_CI = re.compile(_GRAMMAR), re.compile(_GRAMMAR, re.IGNORECASE)
_PREFILTER, _PREFILTER_CI = re.compile(rf"\b(?:{_KEYWORDS})"), re.compile(rf"\b(?:{_KEYWORDS})", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeMention:
    """One time expression of a text and the range it names (UTC days, ``end`` exclusive)."""

    expr: str
    start: float
    end: float
    grain: Grain

    def contains(self, t: float) -> bool:
        return self.start <= t < self.end

    def overlaps(self, start: float, end: float) -> bool:
        return self.start < end and start < self.end

    def spoken(self) -> str:
        """The range as a reader would say it: ``Sunday 7 May 2023``, ``April 2023``, ``2021`` ..."""
        first = datetime.fromtimestamp(self.start, tz=UTC).date()
        if self.grain == "day":
            return f"{first:%A} {first.day} {first:%B %Y}"
        if self.grain == "week":
            return f"the week of Monday {first.day} {first:%B %Y}"
        if self.grain == "weekend":
            last = first + timedelta(days=1)
            if last.month == first.month:
                return f"the weekend of {first.day}-{last.day} {first:%B %Y}"
            return f"the weekend of {first.day} {first:%B} - {last.day} {last:%B %Y}"
        if self.grain == "month":
            return f"{first:%B %Y}"
        return f"{first.year}"

    def to_dict(self) -> dict[str, str | float]:
        return {"expr": self.expr, "start": self.start, "end": self.end, "grain": self.grain}


def resolve(text: str, anchor: float | datetime | None, *, past: bool = False) -> tuple[TimeMention, ...]:
    """The time expressions of ``text`` resolved against ``anchor`` (epoch seconds or a datetime; naive is UTC).

    ``past`` is for questions asked after the fact (a search's query against its ``now``): a month or a date
    without a year is then the latest one not after the anchor ("in June" asked in January 2024 is June
    2023), where a memory's own text takes the anchor's year.
    """
    if anchor is None or not text:
        return ()
    low = text.lower()
    plain = len(low) == len(text)
    if not (_PREFILTER.search(low) if plain else _PREFILTER_CI.search(text)):
        return ()
    if isinstance(anchor, datetime):
        anchor = (anchor if anchor.tzinfo else anchor.replace(tzinfo=UTC)).timestamp()
    if not MIN_EPOCH <= anchor <= MAX_EPOCH:
        return ()
    day = datetime.fromtimestamp(anchor, tz=UTC).date()
    out: list[TimeMention] = []
    for m in _PATTERN.finditer(low) if plain else _PATTERN_CI.finditer(text):
        try:
            found = _range_of(m, day, past)
        except (ValueError, OverflowError):  # 30 February, year 0, past year 9999: not a time we can name
            continue
        if found is not None:
            first, last, grain = found
            expr = text[m.start() : m.end()]
            out.append(TimeMention(expr=expr, start=_epoch(first), end=_epoch(last), grain=grain))
    return tuple(out)


def names_time(text: str) -> bool:
    """True when ``text`` holds an expression :func:`resolve` reads (whatever the anchor): "in May 2023", "last
    week" ..."""
    if not text:
        return False
    low = text.lower()
    if len(low) != len(text):
        return bool(_PREFILTER_CI.search(text) and _PATTERN_CI.search(text))
    return bool(_PREFILTER.search(low) and _PATTERN.search(low))


def _epoch(d: date) -> float:
    return datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp()


def _count(word: str) -> int:
    word = " ".join(word.lower().split())
    return int(word) if word.isdigit() else _COUNTS[word]


def _month_start(year: int, month: int) -> date:
    year += (month - 1) // 12
    return date(year, (month - 1) % 12 + 1, 1)


def _month(year: int, month: int) -> tuple[date, date, Grain]:
    return _month_start(year, month), _month_start(year, month + 1), "month"


def _year(year: int) -> tuple[date, date, Grain]:
    return date(year, 1, 1), date(year + 1, 1, 1), "year"


def _day(d: date) -> tuple[date, date, Grain]:
    return d, d + timedelta(days=1), "day"


def _week(d: date) -> tuple[date, date, Grain]:
    monday = d - timedelta(days=d.weekday())
    return monday, monday + timedelta(days=7), "week"


def _weekend(saturday: date) -> tuple[date, date, Grain]:
    return saturday, saturday + timedelta(days=2), "weekend"


def _last_weekend(d: date) -> date:
    """The Saturday of the latest weekend that ended before ``d`` (on a weekend day: the one before)."""
    wd = d.weekday()
    return d - timedelta(days=wd - 5 + 7) if wd >= 5 else d - timedelta(days=wd + 2)


def _shift(d: date, unit: str, n: int) -> tuple[date, date, Grain]:
    """The ``unit`` (day, week, weekend, month, year) ``n`` units from the one holding ``d`` (n < 0: earlier)."""
    if unit == "day":
        return _day(d + timedelta(days=n))
    if unit == "week":
        return _week(d + timedelta(weeks=n))
    if unit == "weekend":  # n = -1 is last weekend
        this_saturday = d - timedelta(days=d.weekday()) + timedelta(days=5)
        if n < 0:
            return _weekend(_last_weekend(d) + timedelta(weeks=n + 1))
        return _weekend(this_saturday + timedelta(weeks=n))
    if unit == "month":
        return _month(d.year, d.month + n)
    return _year(d.year + n)


def _undated_year(day: date, month: int, dom: int, past: bool) -> int:
    """The year of a month (``dom`` 1) or date named without one: the anchor's, or with ``past`` the latest
    not after the anchor's day."""
    if past and (month, dom) > (day.month, day.day):
        return day.year - 1
    return day.year


def _range_of(m: re.Match[str], day: date, past: bool) -> tuple[date, date, Grain] | None:
    g = m.groupdict()
    if g["iso"]:
        return _day(date(int(g["iy"]), int(g["im"]), int(g["id"])))
    if g["dmy"]:
        month, dom = _MONTHS[g["dm"].lower()], int(g["dd"])
        return _day(date(int(g["dy"]) if g["dy"] else _undated_year(day, month, dom, past), month, dom))
    if g["mdy"]:
        month, dom = _MONTHS[g["mm"].lower()], int(g["md"])
        return _day(date(int(g["my"]) if g["my"] else _undated_year(day, month, dom, past), month, dom))
    if g["monthyear"]:
        return _month(int(g["myy"]), _MONTHS[g["mym"].lower()])
    if g["daybefore"]:
        return _day(day - timedelta(days=2))
    if g["dayafter"]:
        return _day(day + timedelta(days=2))
    if g["today"]:
        return _day(day)
    if g["yesterday"]:
        return _day(day - timedelta(days=1))
    if g["tomorrow"]:
        return _day(day + timedelta(days=1))
    if g["ago"]:
        return _shift(day, g["au"].lower().rstrip("s"), -_count(g["an"]))
    if g["ahead"]:
        return _shift(day, g["hu"].lower().rstrip("s"), _count(g["hn"]))
    if g["rel"]:
        return _relative(g["rw"].lower(), g["ru"].lower(), day)
    if g["rmonth"]:
        month = _MONTHS[g["rmm"].lower()]
        word = g["rmw"].lower()
        if word == "last":
            return _month(day.year if month < day.month else day.year - 1, month)
        if word == "next":
            return _month(day.year if month > day.month else day.year + 1, month)
        return _month(day.year, month)
    if g["pmonth"]:
        month = _MONTHS[g["pm"].lower()]
        return _month(int(g["py"]) if g["py"] else _undated_year(day, month, 1, past), month)
    if g["pyear"]:
        return _year(int(g["yy"]))
    return None  # pragma: no cover - every alternative is named above


def _relative(word: str, unit: str, day: date) -> tuple[date, date, Grain]:
    if unit in _WEEKDAYS:
        target = _WEEKDAYS[unit]
        if word in ("last", "past"):
            back = (day.weekday() - target) % 7 or 7
            return _day(day - timedelta(days=back))
        if word in ("next", "coming"):
            ahead = (target - day.weekday()) % 7 or 7
            return _day(day + timedelta(days=ahead))
        return _day(day - timedelta(days=day.weekday() - target))
    n = {"last": -1, "past": -1, "this": 0, "next": 1, "coming": 1}[word]
    return _shift(day, unit, n)


def matching(
    ranges: Sequence[TimeMention],
    said: Iterable[tuple[str, float]],
    mentions: Mapping[str, Sequence[tuple[float, float]]],
) -> frozenset[str]:
    """The ids among ``said`` (id, time the memory was said or became valid) that match one of ``ranges``: said
    within it, or whose text mentions a time overlapping it (``mentions``: id -> its ranges)."""
    out = set()
    for mid, t in said:
        if any(r.contains(t) for r in ranges) or any(
            r.overlaps(lo, hi) for lo, hi in mentions.get(mid, ()) for r in ranges
        ):
            out.add(mid)
    return frozenset(out)
