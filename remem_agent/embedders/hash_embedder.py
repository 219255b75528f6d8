"""A deterministic, offline hash embedder that knows a little about synonyms.

It exists for tests and the synthetic benchmark, where a trained model would make results depend on
a download. Each text becomes a bag of normalised terms (lower-cased, lightly stemmed, mapped through
a concept lexicon so "host" and "server" land on one feature) plus adjacent-term bigrams; each
feature is hashed with BLAKE2b (stable across processes, unlike ``hash()``) to a signed bucket.
Use a real model (``SentenceTransformerEmbedder``) in practice.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from remem_agent.embedders.base import Vectors, check_texts, check_vectors

_WORD_RE = re.compile(r"[a-z0-9]+(?:[-_.][a-z0-9]+)*")

STOPWORDS = frozenset(
    """a an the is are was were be been being of to in on at for from by with and or our we you your
    it its this that these those as into do does did has have had what which who whom where when
    how i me my us they them their there here than then so if not no but about over under up down
    out off again just also very can will would should could may might must shall""".split()
)

# ``_embed_exact``: at most this many weights (terms and bigrams) per text, so sums stay below 2**14; and at
# most this many texts per call (a batch is faster with np.add.at: 1000 texts, 16 vs 19 ms).
_EXACT_TERMS = 2**14 - 2
_EXACT_BATCH = 8
_MEMO = 200_000  # features (and raw tokens) whose hashing (and normalisation) an embedder remembers


def _numeric(feature: str | tuple[str, str]) -> bool:
    """A feature holding a number: not remembered. Numbers (ids, amounts, request counters) keep coming, so a
    server's queries would fill the memo with features never seen again (a soak of 100k requests, each naming
    its own number, grew the gateway by ~0.5 KB per request until the memo was full)."""
    if isinstance(feature, str):
        return feature.isdigit()
    return feature[0].isdigit() or feature[1].isdigit()


# Default concept lexicon: each group maps to its first word. Worlds of the benchmark extend it.
DEFAULT_CONCEPT_GROUPS: tuple[tuple[str, ...], ...] = (
    ("server", "host", "machine", "box", "instance", "node"),
    ("database", "db", "datastore", "postgres", "mysql"),
    ("region", "location", "zone", "datacenter", "datacentre"),
    ("owner", "responsible", "maintainer", "maintains", "owns", "lead"),
    ("deploy", "deployment", "release", "rollout", "ship", "shipping"),
    ("approve", "approval", "approver", "sign-off", "signoff"),
    ("cache", "caching", "memcached", "redis"),
    ("cost", "price", "pricing", "fee", "budget"),
    ("plan", "tier", "subscription"),
    ("move", "moved", "migrate", "migrated", "migration", "relocate", "relocated"),
    ("use", "uses", "using", "used", "depend", "depends", "dependency"),
    ("meeting", "meet", "sync", "standup"),
    ("customer", "client", "user", "account"),
    ("error", "bug", "failure", "incident", "outage"),
    ("password", "credential", "secret", "token"),
)


def _concept_map(groups: Sequence[Sequence[str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for group in groups:
        head = _stem(group[0])
        for word in group:
            out[_stem(word)] = head
    return out


def _stem(word: str) -> str:
    """A tiny suffix stripper: enough that 'deploys' and 'deploying' share a feature."""
    if len(word) <= 4 or not word.isalpha():
        return word
    for suffix, repl in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: len(word) - len(suffix)] + repl
    return word


class ConceptHashEmbedder:
    """Deterministic signed feature hashing over stemmed, concept-mapped terms and bigrams."""

    def __init__(
        self,
        dim: int = 256,
        *,
        concepts: Sequence[Sequence[str]] | Mapping[str, str] | None = None,
        bigram_weight: float = 0.5,
    ) -> None:
        if dim < 8:
            raise ValueError("dim must be >= 8")
        self._dim = int(dim)
        if concepts is None:
            self._concepts = _concept_map(DEFAULT_CONCEPT_GROUPS)
        elif isinstance(concepts, Mapping):
            self._concepts = {_stem(k.lower()): _stem(v.lower()) for k, v in concepts.items()}
        else:
            self._concepts = _concept_map([[w.lower() for w in g] for g in concepts])
        self._bigram_weight = float(bigram_weight)
        # a weight the exact per-cell sums allow (see ``_embed_exact``): a multiple of 2**-10, at most 1
        self._exact_sums = abs(self._bigram_weight) <= 1.0 and (self._bigram_weight * 1024.0).is_integer()
        lexicon = "|".join(f"{k}>{v}" for k, v in sorted(self._concepts.items()))
        fp = hashlib.blake2b(lexicon.encode(), digest_size=4).hexdigest()
        self._name = f"hash-concept-v1-d{self._dim}-b{self._bigram_weight:g}-{fp}"
        self._buckets: dict[str | tuple[str, str], tuple[int, float]] = {}  # memo: feature -> (bucket, weight)
        self._token_terms: dict[str, tuple[str, ...]] = {}  # memo: raw token -> its normalised terms

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    def terms(self, text: str) -> list[str]:
        """The normalised terms of ``text`` (exposed for tests and explanations)."""
        memo = self._token_terms
        out: list[str] = []
        for tok in _WORD_RE.findall(text.lower()):
            t = memo.get(tok)
            if t is None:
                t = self._terms_of_token(tok)
                if len(memo) < _MEMO and not tok.isdigit():  # numbers are an open vocabulary: not remembered
                    memo[tok] = t
            out.extend(t)
        return out

    def _terms_of_token(self, tok: str) -> tuple[str, ...]:
        parts = [tok]
        if any(c in tok for c in "-_.") and not tok.replace(".", "").isdigit():
            parts += [p for p in re.split(r"[-_.]", tok) if p]
        out = []
        for p in parts:
            if p in STOPWORDS:
                continue
            s = _stem(p)
            out.append(self._concepts.get(s, s))
        return tuple(out)

    def _bucket(self, feature: str | tuple[str, str]) -> tuple[int, float]:
        """A feature's (bucket, weight), remembered for the first ``_MEMO`` features: a term (a string) weighs its
        hash's sign, a bigram (a pair of terms, hashed as "a b") that sign times ``bigram_weight``. Keyed by the
        pair, a remembered bigram is found without building its string, and never taken for a term (the raw text
        that stands for a text of only stopwords may contain a space). A plain dict, not an ``lru_cache``: a hit
        costs a dict lookup (``_row_weights`` inlines it) instead of a bounded cache's bookkeeping, ~4x cheaper;
        a batch of 1000 texts looks up ~22k features, most of them remembered."""
        known = self._buckets.get(feature)
        if known is None:
            if isinstance(feature, tuple):
                i, s = self._bucket_uncached(" ".join(feature))
                known = (i, s * self._bigram_weight)
            else:
                known = self._bucket_uncached(feature)
            if len(self._buckets) < _MEMO and not _numeric(feature):
                self._buckets[feature] = known
        return known

    def _bucket_uncached(self, feature: str) -> tuple[int, float]:
        # surrogatepass: a lone surrogate (not storable, refused by ingest) must not crash a bare embed() call;
        # every valid string encodes to the same bytes as with the default, so vectors are unchanged.
        h = int.from_bytes(hashlib.blake2b(feature.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
        return h % self._dim, (1.0 if (h >> 63) & 1 else -1.0)

    def embed(self, texts: Sequence[str]) -> Vectors:
        texts = check_texts(texts)
        n = len(texts)
        # A few texts (a query): per-cell sums (``_embed_exact``), then the normalisation ``check_vectors`` does,
        # without its checks, true by construction there (shape (n, dim) float32; finite, as every sum is below
        # 2**14; no zero row, as a row whose features cancel gets its text's feature). In a search that is a
        # handful of numpy calls fewer, each several microseconds with the caches cold after the ledger's reads
        # (the query embedding measured 83 -> 45 us there). A batch (an add): np.add.at, faster there.
        if self._exact_sums and n <= _EXACT_BATCH:
            out = self._embed_exact(texts)
            if out is not None:
                unit: Vectors = out / np.linalg.norm(out, axis=1)[:, None]  # check_vectors' arithmetic
                return unit
        return check_vectors(self._embed_add_at(texts), n, self._dim, source=self._name)

    def _row_weights(self, text: str) -> list[tuple[int, float]]:
        """(bucket, weight) of every feature of ``text`` in order: its terms (+-1), then its bigrams
        (+-``bigram_weight``); a text of only stopwords/punctuation is its raw text as one term."""
        terms = self.terms(text) or [text.strip().lower() or "<empty>"]
        known, bucket = self._buckets.get, self._bucket  # ``_bucket``, its dict lookup inlined
        out = [known(t) or bucket(t) for t in terms]
        if self._bigram_weight:
            out += [known(pair) or bucket(pair) for pair in itertools.pairwise(terms)]
        return out

    def _keep_usable(self, out: NDArray[np.float32], texts: list[str], empty: Iterable[int]) -> None:
        """Rows whose features cancelled out exactly get their text's own feature (a zero vector is unusable)."""
        for r in empty:
            i, s = self._bucket(texts[r])
            out[r, i] += s

    def _embed_add_at(self, texts: list[str]) -> NDArray[np.float32]:
        """The raw (unnormalised) vectors: (row, bucket, weight) triples collected in Python and scatter-added
        once with np.add.at (the per-element loop's order of float32 additions, so bit-identical to it);
        per-element numpy scalar updates were ~40% of embedding time."""
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        for row, text in enumerate(texts):
            for i, s in self._row_weights(text):
                rows.append(row)
                cols.append(i)
                vals.append(s)
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        np.add.at(out, (np.array(rows, dtype=np.intp), np.array(cols, dtype=np.intp)), np.array(vals, np.float32))
        self._keep_usable(out, texts, np.flatnonzero(~out.any(axis=1)).tolist())
        return out

    def _embed_exact(self, texts: list[str]) -> NDArray[np.float32] | None:
        """``_embed_add_at``'s vectors, bit for bit, summed per cell in a dict and written with one assignment,
        or None for a text too long for the argument below.

        Why the same bits: every weight is +-1 or +-``bigram_weight``, a multiple of 2**-10 of magnitude at most
        1 (``_exact_sums``), so every partial sum of a row's at most ``_EXACT_TERMS`` weights is a multiple of
        2**-10 below 2**14 in magnitude, exactly representable in float32 (24-bit significand) as in float64.
        Both ways of adding are then exact, so the float64 sums equal np.add.at's float32 ones and so do their
        casts (a zero is +0.0 both ways: each cell starts at +0.0 and only exact sums follow)."""
        dim = self._dim
        acc: dict[int, float] = {}  # row * dim + bucket -> sum
        get = acc.get
        for row, text in enumerate(texts):
            weights = self._row_weights(text)
            if len(weights) > _EXACT_TERMS:
                return None
            base = row * dim
            for i, s in weights:
                cell = base + i
                acc[cell] = get(cell, 0.0) + s
        out = np.zeros((len(texts), dim), dtype=np.float32)
        out.reshape(-1)[list(acc)] = list(acc.values())
        live = {cell // dim for cell, v in acc.items() if v != 0.0}
        self._keep_usable(out, texts, [r for r in range(len(texts)) if r not in live])
        return out
