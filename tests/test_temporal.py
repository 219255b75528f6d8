"""Time expressions resolved against the moment a text was written (remem_agent/temporal.py)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remem_agent._time import MAX_EPOCH, MIN_EPOCH
from remem_agent.temporal import TimeMention, resolve

MON = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)  # Monday 8 May 2023 (a LoCoMo session)
FRI = datetime(2023, 5, 5, 9, 0, tzinfo=UTC)  # Friday 5 May 2023
SUN = datetime(2023, 5, 7, 22, 0, tzinfo=UTC)  # Sunday 7 May 2023
NYE = datetime(2022, 12, 31, 12, 0, tzinfo=UTC)  # Saturday 31 December 2022
JAN31 = datetime(2024, 1, 31, 8, 0, tzinfo=UTC)  # Wednesday 31 January 2024 (a leap year)


def _one(text: str, anchor: datetime) -> tuple[str, date, date, str]:
    (m,) = resolve(text, anchor)
    day = lambda t: datetime.fromtimestamp(t, tz=UTC).date()  # noqa: E731
    return m.expr, day(m.start), day(m.end), m.grain


# (text, anchor, expected words, first day, day after the last, grain)
TABLE = [
    ("I went to the support group yesterday.", MON, "yesterday", date(2023, 5, 7), date(2023, 5, 8), "day"),
    ("We partied last night", MON, "last night", date(2023, 5, 7), date(2023, 5, 8), "day"),
    ("Tonight we party", MON, "Tonight", date(2023, 5, 8), date(2023, 5, 9), "day"),
    ("see you tomorrow", NYE, "tomorrow", date(2023, 1, 1), date(2023, 1, 2), "day"),
    ("the day before yesterday", MON, "the day before yesterday", date(2023, 5, 6), date(2023, 5, 7), "day"),
    ("It happened two days ago", MON, "two days ago", date(2023, 5, 6), date(2023, 5, 7), "day"),
    ("I leave in 3 days", JAN31, "in 3 days", date(2024, 2, 3), date(2024, 2, 4), "day"),
    # weekdays: last = strictly before the anchor's day, next = strictly after, this = the anchor's week
    ("a pride parade last Friday", MON, "last Friday", date(2023, 5, 5), date(2023, 5, 6), "day"),
    ("a pride parade last Friday", FRI, "last Friday", date(2023, 4, 28), date(2023, 4, 29), "day"),
    ("dinner next Friday", FRI, "next Friday", date(2023, 5, 12), date(2023, 5, 13), "day"),
    ("dinner next Friday", MON, "next Friday", date(2023, 5, 12), date(2023, 5, 13), "day"),
    ("dinner this Friday", MON, "this Friday", date(2023, 5, 12), date(2023, 5, 13), "day"),
    ("the coming Monday", MON, "coming Monday", date(2023, 5, 15), date(2023, 5, 16), "day"),
    # weeks (Monday to Sunday) and weekends
    ("I joined a gym last week!", MON, "last week", date(2023, 5, 1), date(2023, 5, 8), "week"),
    ("a fundraiser next week", NYE, "next week", date(2023, 1, 2), date(2023, 1, 9), "week"),
    ("two weeks ago", MON, "two weeks ago", date(2023, 4, 24), date(2023, 5, 1), "week"),
    ("a couple of weeks ago", MON, "a couple of weeks ago", date(2023, 4, 24), date(2023, 5, 1), "week"),
    ("last weekend", MON, "last weekend", date(2023, 5, 6), date(2023, 5, 8), "weekend"),
    ("last weekend", SUN, "last weekend", date(2023, 4, 29), date(2023, 5, 1), "weekend"),
    ("this weekend", MON, "this weekend", date(2023, 5, 13), date(2023, 5, 15), "weekend"),
    ("this weekend", SUN, "this weekend", date(2023, 5, 6), date(2023, 5, 8), "weekend"),
    ("camping two weekends ago", MON, "two weekends ago", date(2023, 4, 29), date(2023, 5, 1), "weekend"),
    ("next weekend", MON, "next weekend", date(2023, 5, 20), date(2023, 5, 22), "weekend"),
    # months
    ("Last month I got hurt", MON, "Last month", date(2023, 4, 1), date(2023, 5, 1), "month"),
    (
        "Last month I got hurt",
        datetime(2023, 1, 15, tzinfo=UTC),
        "Last month",
        date(2022, 12, 1),
        date(2023, 1, 1),
        "month",
    ),
    ("next month we go", JAN31, "next month", date(2024, 2, 1), date(2024, 3, 1), "month"),
    ("three months ago", MON, "three months ago", date(2023, 2, 1), date(2023, 3, 1), "month"),
    ("in June 2020 I quit", MON, "in June 2020", date(2020, 6, 1), date(2020, 7, 1), "month"),
    ("June 2020 was hard", MON, "June 2020", date(2020, 6, 1), date(2020, 7, 1), "month"),
    ("in May I went", MON, "in May", date(2023, 5, 1), date(2023, 6, 1), "month"),
    ("since early June", MON, "early June", date(2023, 6, 1), date(2023, 7, 1), "month"),
    ("last June", MON, "last June", date(2022, 6, 1), date(2022, 7, 1), "month"),
    ("last June", datetime(2023, 7, 2, tzinfo=UTC), "last June", date(2023, 6, 1), date(2023, 7, 1), "month"),
    ("next May", MON, "next May", date(2024, 5, 1), date(2024, 6, 1), "month"),
    ("What did Maria donate in December 2023?", MON, "in December 2023", date(2023, 12, 1), date(2024, 1, 1), "month"),
    # years
    ("last year", MON, "last year", date(2022, 1, 1), date(2023, 1, 1), "year"),
    ("We moved here two years ago", MON, "two years ago", date(2021, 1, 1), date(2022, 1, 1), "year"),
    ("a year ago", MON, "a year ago", date(2022, 1, 1), date(2023, 1, 1), "year"),
    ("Back in 2016 I", MON, "Back in 2016", date(2016, 1, 1), date(2017, 1, 1), "year"),
    ("the year 2020", MON, "the year 2020", date(2020, 1, 1), date(2021, 1, 1), "year"),
    # dates
    ("on 13 October, 2023 I", MON, "13 October, 2023", date(2023, 10, 13), date(2023, 10, 14), "day"),
    ("on May 23, 2023", MON, "May 23, 2023", date(2023, 5, 23), date(2023, 5, 24), "day"),
    ("the 8th of May", MON, "8th of May", date(2023, 5, 8), date(2023, 5, 9), "day"),
    ("since June 3rd", MON, "June 3rd", date(2023, 6, 3), date(2023, 6, 4), "day"),
    ("2023-05-08", NYE, "2023-05-08", date(2023, 5, 8), date(2023, 5, 9), "day"),
    ("29 Feb 2024", MON, "29 Feb 2024", date(2024, 2, 29), date(2024, 3, 1), "day"),
]


@pytest.mark.parametrize(("text", "anchor", "expr", "first", "end", "grain"), TABLE)
def test_expression_table(text, anchor, expr, first, end, grain):
    assert _one(text, anchor) == (expr, first, end, grain)


@pytest.mark.parametrize(
    "text",
    [
        "May I ask you something?",  # the verb, not the month
        "We had fun",  # dateparser reads "We" as a Wednesday
        "Sat down with my mom",
        "I'll march on",
        "I have a second chance",
        "See you on Friday",  # a bare weekday: past or future depends on the tense, so it is not resolved
        "2000 people came",  # a number, not a year
        "a team of 2000",  # "of" is no year's preposition: too often a count
        "ship it in 1473 units",  # a bare year is 1800-2199
        "I did it recently, the other day, a few weeks ago",  # vague
        "30 February 2023",  # no such day
        "Nothing here at all",
        "",
    ],
)
def test_words_that_name_no_time(text):
    assert resolve(text, MON) == ()


def test_several_mentions_in_order_and_never_overlapping():
    found = resolve("I started in 2019 and in June 2020 I quit; last week I came back", MON)
    assert [(m.expr, m.grain) for m in found] == [("in 2019", "year"), ("in June 2020", "month"), ("last week", "week")]
    # the order is the text's, not time's
    assert [m.expr for m in resolve("last week, and in 2019", MON)] == ["last week", "in 2019"]


def test_spoken_forms():
    said = {m.grain: m.spoken() for m in resolve("yesterday, last week, last weekend, last month, last year", MON)}
    assert said == {
        "day": "Sunday 7 May 2023",
        "week": "the week of Monday 1 May 2023",
        "weekend": "the weekend of 6-7 May 2023",
        "month": "April 2023",
        "year": "2022",
    }
    (across,) = resolve("last weekend", datetime(2023, 10, 2, tzinfo=UTC))
    assert across.spoken() == "the weekend of 30 September - 1 October 2023"


def test_anchor_forms_and_missing_anchor():
    epoch = MON.timestamp()
    assert resolve("yesterday", epoch) == resolve("yesterday", MON) == resolve("yesterday", MON.replace(tzinfo=None))
    # an aware anchor counts in UTC: 01:00 on 8 May at UTC+3 is 22:00 on 7 May in UTC
    east = datetime(2023, 5, 8, 1, 0, tzinfo=timezone(timedelta(hours=3)))
    assert _one("yesterday", east)[1] == date(2023, 5, 6)
    assert resolve("yesterday", None) == ()
    assert resolve("yesterday", float("nan")) == ()
    assert resolve("yesterday", MAX_EPOCH + 1) == ()


def test_ranges_past_the_calendar_are_dropped():
    assert resolve("tomorrow", MAX_EPOCH) == ()  # 10000-01-01 does not exist
    assert resolve("yesterday", MIN_EPOCH) == ()
    assert resolve("next year", datetime(9999, 3, 1, tzinfo=UTC)) == ()
    assert [m.grain for m in resolve("last year", datetime(9999, 3, 1, tzinfo=UTC))] == ["year"]


def test_non_ascii_text_keeps_its_spans():
    text = "İstanbul: Last Friday we met"  # "İ".lower() is two characters: the case-insensitive path
    (m,) = resolve(text, MON)
    assert m.expr == "Last Friday" and text[text.index(m.expr) :].startswith("Last Friday")


def test_mention_helpers():
    (m,) = resolve("yesterday", MON)
    assert isinstance(m, TimeMention)
    assert m.contains(datetime(2023, 5, 7, 23, 59, tzinfo=UTC).timestamp())
    assert not m.contains(datetime(2023, 5, 8, tzinfo=UTC).timestamp())
    assert m.overlaps(m.end - 1, m.end + 10) and not m.overlaps(m.end, m.end + 10)
    assert m.to_dict() == {"expr": "yesterday", "start": m.start, "end": m.end, "grain": "day"}


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200), anchor=st.floats(min_value=MIN_EPOCH, max_value=MAX_EPOCH))
def test_any_text_and_anchor_resolve_without_error(text, anchor):
    for m in resolve(text, anchor):
        assert m.start < m.end and m.expr and m.expr in text
        assert m.grain in ("day", "week", "weekend", "month", "year")


@pytest.mark.parametrize(
    ("text", "past", "first"),
    [
        ("in June", False, date(2024, 6, 1)),  # a memory's text: the anchor's year
        ("in June", True, date(2023, 6, 1)),  # a question asked after the fact: the latest June up to now
        ("in January", True, date(2024, 1, 1)),  # the anchor's own month counts as not after it
        ("on June 3rd", True, date(2023, 6, 3)),
        ("the 31st of January", True, date(2024, 1, 31)),
        ("in June 2024", True, date(2024, 6, 1)),  # a year given is kept
    ],
)
def test_undated_months_in_questions_look_back(text, past, first):
    (m,) = resolve(text, JAN31, past=past)
    assert datetime.fromtimestamp(m.start, tz=UTC).date() == first
