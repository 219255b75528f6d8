"""The ledger's lexical channel (schema 5): how a query becomes full-text search terms, per backend.

Why a tokenizer of our own in front of the database's: user text never reaches FTS5's ``MATCH`` or
PostgreSQL's ``to_tsquery`` syntax. A question is split into words (letters and digits only, so no
quote, operator, parenthesis or column filter survives), stopwords and one-letter words are dropped
(they match most memories and only cost time), and the rest are quoted and OR-ed: a question's words
must not all be required, since a memory that answers it rarely repeats every one of them. A query
with no such word returns no candidates.

The index itself is the database's: SQLite FTS5 with the ``porter unicode61`` tokenizer (English
stemming, case and diacritics folded) over ``memories.text``, PostgreSQL a ``tsvector`` of the
``english`` configuration (the same stemmer family and a stopword list) with a GIN index. Scores are
comparable within one backend only (FTS5 ``bm25()``; PostgreSQL idf-weighted ``ts_rank``, see
``PostgresTx._lexical_query``), and the two match different words (PostgreSQL drops its stopwords): the
default fusion (``"bonus"``) adds each backend's score scaled by the pool's best, so one ledger can rank
differently on SQLite and on PostgreSQL (``"rrf"`` uses ranks, and differs only where the matches do).
Why 'english' and not 'simple' on PostgreSQL: stemming finds "camped" for "camping"; on the LoCoMo dev
conversations 'simple' ranks 2 pp lower at evidence recall@5 (results/locomo/lexical_channel.json,
``python -m evals.bench.lexical_channel``).
"""

from __future__ import annotations

import re

# The index definitions of migration 5 (migrations.py / pg_migrations.py must say the same; a test checks).
SQLITE_TOKENIZE = "porter unicode61 remove_diacritics 2"
PG_CONFIG = "english"
PG_MAX_CHARS = 100_000  # PostgreSQL indexes this many leading characters (a tsvector holds at most 1 MB)
PG_LEXEMES = f"to_tsvector('{PG_CONFIG}'::regconfig, left(text, {PG_MAX_CHARS}))"

MAX_TERMS = 32  # a longer query keeps its first 32 distinct words: enough to find, bounded to run
MAX_TERM_CHARS = 64  # longer "words" (hashes, base64) are not words a question asks about

# The ranking work of one query is bounded: words are searched rarest first while their matches add up
# to at most this many memories; a word with more matches than what is left is not searched. Why: the
# cost of a full-text query is scoring and sorting every matching row (FTS5 bm25(), ts_rank), not
# finding them, and a word in thousands of memories ("note", "service") would make one query cost tens
# of milliseconds at 100k memories (results/perf/history/core_lexical.json, synthetic facts: 114 ms p50 with every
# word searched, 1.6 ms with this bound; 48 of 300 queries then have no lexical candidates). Such a
# word carries little evidence (a low idf); the dense channel still sees it. A store with fewer
# memories than this is never pruned.
MAX_MATCHES = 1000

_WORD = re.compile(r"[^\W_]+")

# A small English stopword list (function words that carry no topic). PostgreSQL's 'english'
# configuration drops its own list as well; FTS5 has none, so without this "what did I say" would
# match nearly every turn of a conversation.
STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before being below between
    both but by can could did do does doing down during each few for from further had has have having he her
    here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not
    now of off on once only or other our ours ourselves out over own same she should so some such than that the
    their theirs them themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    """.split()
)


def query_terms(query: str) -> list[str]:
    """The distinct search words of ``query``, in order: lower-cased letter/digit runs, no stopwords,
    no single letters (a single digit stays: "5 years"), at most ``MAX_TERMS``."""
    out: list[str] = []
    seen: set[str] = set()
    for match in _WORD.finditer(query):
        word = match.group().casefold()
        if len(word) > MAX_TERM_CHARS or word in STOPWORDS or (len(word) == 1 and not word.isdigit()):
            continue
        if not _WORD.fullmatch(word):  # casefold can yield characters that are not letters (rare)
            continue
        if word not in seen:
            seen.add(word)
            out.append(word)
            if len(out) == MAX_TERMS:
                break
    return out


def fts5_match(terms: list[str]) -> str:
    """An FTS5 MATCH expression: each term a quoted string (a phrase of its tokens), OR-ed.

    Terms hold only letters and digits, so the quotes need no escaping; doubling any '"' anyway keeps
    this safe if that ever changes.
    """
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


def pg_tsquery(terms: list[str]) -> str:
    """A ``to_tsquery`` text: each term a quoted lexeme (normalised by the configuration), OR-ed."""
    return " | ".join("'" + t.replace("'", "''").replace("\\", "\\\\") + "'" for t in terms)


def choose_terms(terms: list[str], counts: list[int], budget: int | None = None) -> list[str]:
    """The words to search: rarest first (ties in query order) while their match counts add up to at
    most ``budget`` (default ``MAX_MATCHES``); words with no match are dropped. ``counts`` may be capped
    at ``budget + 1`` (enough to know a word does not fit)."""
    cap = MAX_MATCHES if budget is None else budget
    kept: list[tuple[int, str]] = []
    total = 0
    for count, pos, term in sorted((c, i, t) for i, (t, c) in enumerate(zip(terms, counts, strict=True)) if c > 0):
        if total + count > cap:
            break
        kept.append((pos, term))
        total += count
    return [t for _, t in sorted(kept)]
