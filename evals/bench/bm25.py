"""Plain Okapi BM25 in pure Python: the lexical baseline of the retrieval benchmarks.

score(q, d) = sum over query terms t of idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
with idf(t) = ln(1 + (N - n(t) + 0.5) / (n(t) + 0.5)) (the non-negative form, so a term in more than half of
the documents never lowers a score). Tokenizer: lowercase alphanumeric runs, no stemming, no stopword list.
Ties are broken by document order (the earlier document first), so rankings are deterministic.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

_TOKEN_RE = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    return _TOKEN_RE.findall(text.lower())


class BM25:
    """An index over a fixed list of documents; ``top_k`` returns document positions, best first."""

    def __init__(self, docs: Sequence[str], *, k1: float = 1.5, b: float = 0.75) -> None:
        self.k1 = k1
        self.b = b
        self.tfs: list[Counter[str]] = [Counter(tokenize(d)) for d in docs]
        self.lengths = [sum(tf.values()) for tf in self.tfs]
        self.n = len(self.tfs)
        self.avgdl = (sum(self.lengths) / self.n) if self.n else 0.0
        df: Counter[str] = Counter()
        for tf in self.tfs:
            df.update(tf.keys())
        self.idf = {t: math.log(1.0 + (self.n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
        self.postings: dict[str, list[int]] = {}
        for i, tf in enumerate(self.tfs):
            for t in tf:
                self.postings.setdefault(t, []).append(i)

    def scores(self, query: str) -> list[float]:
        out = [0.0] * self.n
        if not self.n or self.avgdl == 0:
            return out
        # each term once, in query order: a set's order follows PYTHONHASHSEED, and summing the same terms in
        # another order can change a score's last bit and so the order of two documents that tie exactly
        for t in dict.fromkeys(tokenize(query)):
            idf = self.idf.get(t)
            if idf is None:
                continue
            for i in self.postings[t]:
                f = self.tfs[i][t]
                norm = self.k1 * (1.0 - self.b + self.b * self.lengths[i] / self.avgdl)
                out[i] += idf * f * (self.k1 + 1.0) / (f + norm)
        return out

    def top_k(self, query: str, k: int, *, allowed: Sequence[bool] | None = None) -> list[int]:
        """Positions of the ``k`` best documents (only those with ``allowed[i]`` true, when given)."""
        s = self.scores(query)
        idx = [i for i in range(self.n) if allowed is None or allowed[i]]
        idx.sort(key=lambda i: (-s[i], i))
        return idx[:k]
