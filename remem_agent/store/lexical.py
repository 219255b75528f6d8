"""The ledger's lexical channel: how text becomes index tokens and a query becomes search words.

One tokenizer for both backends: SQLite FTS5's ``porter unicode61`` (English Porter stemming, case and
diacritics folded), applied in Python through a private in-memory FTS5 table (``Tokenizer``), so the
tokens are SQLite's own. SQLite indexes ``memories.text`` with FTS5 itself; PostgreSQL stores the same
tokens of each text in ``memory_terms`` (schema 9), written by ``PostgresTx`` on every insert and text
update. Both rank a query's matches with the same BM25 arithmetic (``store/fts5_bm25.py``: FTS5's ``bm25()``,
operation for operation), so a ledger copied between backends ranks alike, score for score.

Why a word list of our own in front of the index: user text never reaches FTS5's ``MATCH`` syntax or a
PostgreSQL query. A question is split into words (letters and digits only, so no quote, operator,
parenthesis or column filter survives), stopwords and one-letter words are dropped (they match most
memories and only cost time), and so is a word the tokenizer splits into several tokens (a handful of
scripts' vowel signs do that; such a word would be a phrase, which postings cannot score). The rest are
OR-ed: a question's words must not all be required, since a memory that answers it rarely repeats every
one of them. A query with no such word returns no candidates.
"""

from __future__ import annotations

import re
import sqlite3
import threading

# The FTS5 index definition of migration 5 (migrations.py must say the same; a test checks).
SQLITE_TOKENIZE = "porter unicode61 remove_diacritics 2"

MAX_TERMS = 32  # a longer query keeps its first 32 distinct words: enough to find, bounded to run
MAX_TERM_CHARS = 64  # longer "words" (hashes, base64) are not words a question asks about

# The ranking work of one query is bounded: words are searched rarest first while their matches add up
# to at most this many memories; a word with more matches than what is left is not searched. Why: the
# cost of a full-text query is scoring and sorting every matching row (BM25 of each match), not
# finding them, and a word in thousands of memories ("note", "service") would make one query cost tens
# of milliseconds at 100k memories (results/perf/history/core_lexical.json, synthetic facts: 114 ms p50 with every
# word searched, 1.6 ms with this bound; 48 of 300 queries then have no lexical candidates). Such a
# word carries little evidence (a low idf); the dense channel still sees it. A store with fewer
# memories than this is never pruned.
MAX_MATCHES = 1000

_WORD = re.compile(r"[^\W_]+")

# A small English stopword list (function words that carry no topic). The index keeps every token
# (FTS5 has no stopword list), so without this "what did I say" would match nearly every turn of a
# conversation.
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
    no single letters (a single digit stays: "5 years"), each one index token (``word_token``), at most
    ``MAX_TERMS``."""
    words: list[str] = []
    for match in _WORD.finditer(query):
        word = match.group().casefold()
        if len(word) > MAX_TERM_CHARS or word in STOPWORDS or (len(word) == 1 and not word.isdigit()):
            continue
        if not _WORD.fullmatch(word):  # casefold can yield characters that are not letters (rare)
            continue
        words.append(word)
    TOKENIZER.learn(words)  # the words not met yet, tokenized in one round trip
    out: list[str] = []
    seen: set[str] = set()
    for word in words:
        if len(TOKENIZER.tokens(word)) != 1:
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


def word_token(word: str) -> str:
    """The index token of a search word (``query_terms`` keeps only words of exactly one)."""
    return TOKENIZER.tokens(word)[0]


def text_tokens(text: str) -> list[str]:
    """The tokens the index holds for ``text``, in order (their count is its BM25 length)."""
    return TOKENIZER.text_tokens(text)


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


class Tokenizer:
    """The ledger's tokenizer (FTS5 ``porter unicode61``) applied to a text, or to a query word remembered
    (a pure function of the word).

    A private in-memory FTS5 table with the index's tokenizer (``SQLITE_TOKENIZE``): the tokens a
    word becomes are read back from it, so stemming and case and diacritic folding are SQLite's own.
    """

    def __init__(self, max_words: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._known: dict[str, tuple[str, ...]] = {}
        self._max = max_words

    def tokens(self, word: str) -> tuple[str, ...]:
        """The tokens of a query word (remembered; a number is its own token and is not remembered)."""
        if _plain_number(word):
            return (word,)
        known = self._known.get(word)
        if known is not None:
            return known
        self.learn([word])
        got = self._known.get(word)
        return got if got is not None else tuple(self.text_tokens(word))  # emptied meanwhile by another thread

    def learn(self, words: list[str]) -> None:
        """Remember the tokens of each of ``words`` not known yet, all read in one transaction."""
        known = self._known
        new = list(dict.fromkeys(w for w in words if w not in known and not _plain_number(w)))
        if not new:
            return
        found = self._tokenize(new)
        with self._lock:
            if len(known) + len(new) > self._max:
                known.clear()
            known.update(zip(new, map(tuple, found), strict=True))

    def text_tokens(self, text: str) -> list[str]:
        """The tokens FTS5 indexes for ``text``, in order (their count is the row size it stores)."""
        return self._tokenize([text])[0]

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        """The tokens of each of ``texts``: one row each in the private table, read back in one statement."""
        with self._lock:
            c = self._conn
            if c is None:
                c = self._conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
                c.execute(f"CREATE VIRTUAL TABLE t USING fts5(text, tokenize = '{SQLITE_TOKENIZE}')")
                c.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, instance)")
            c.execute("BEGIN")
            try:
                c.executemany("INSERT INTO t (rowid, text) VALUES (?, ?)", enumerate(texts, start=1))
                out: list[list[str]] = [[] for _ in texts]
                for doc, term in c.execute("SELECT doc, term FROM v ORDER BY doc, offset"):
                    out[int(doc) - 1].append(str(term))
                return out
            finally:
                c.execute("ROLLBACK")


def _plain_number(word: str) -> bool:
    """An ASCII number is its own one token (unicode61 keeps ASCII digits as they are, porter stems letters only),
    so the tokenizer answers it without SQLite and does not remember it (an open vocabulary)."""
    return word.isascii() and word.isdigit()


TOKENIZER = Tokenizer()
