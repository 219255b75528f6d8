"""Answer scores of LoCoMo's question answering: token F1 (as the benchmark defines it) and containment.

LoCoMo's own evaluation normalises an answer by lower-casing it, deleting commas and ASCII punctuation,
deleting the words "a", "an", "the" and "and", and collapsing whitespace; it then stems every word with
NLTK's Porter stemmer and scores a prediction against the gold answer by token F1 over the stems (bag of
words, counted). Two categories differ:

- category 1 (multi-hop): the gold answer may list several items separated by commas. Prediction and gold
  are both split on commas; each gold item takes its best F1 against any predicted item, and the question
  scores the mean over the gold items;
- category 3 (open-domain): only the part of the gold answer before the first ";" counts.

These functions follow that definition so that figures compare with published LoCoMo F1. ``containment``
is a stricter yes/no companion: every gold item appears, as a run of consecutive stems, in the prediction.
"""

from __future__ import annotations

import functools
import re
import string
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


@functools.cache
def _stemmer() -> object:
    from nltk.stem import PorterStemmer  # the stemmer LoCoMo's evaluation uses

    return PorterStemmer()


def normalize_answer(text: str) -> str:
    """Lower-case, no commas or ASCII punctuation, no "a/an/the/and", single spaces."""
    text = text.replace(",", "").lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def stems(text: str) -> list[str]:
    stem = _stemmer().stem  # type: ignore[attr-defined]
    return [str(stem(w)) for w in normalize_answer(text).split()]


def token_f1(prediction: str, gold: str) -> float:
    """F1 of the prediction's stems against the gold answer's stems (0 when either is empty)."""
    pred, ref = stems(prediction), stems(gold)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def gold_items(gold: str, category: int) -> list[str]:
    """The gold answer as the category scores it: comma-split for multi-hop, the part before ";" for open-domain."""
    if category == 3:
        gold = gold.split(";")[0].strip()
    if category == 1:
        return [g.strip() for g in gold.split(",")]
    return [gold]


def locomo_f1(prediction: str, gold: str, category: int) -> float:
    """LoCoMo's F1 for one question (see the module docstring)."""
    items = gold_items(gold, category)
    if category == 1:
        preds = [p.strip() for p in prediction.split(",")]
        return sum(max(token_f1(p, g) for p in preds) for g in items) / len(items)
    return token_f1(prediction, items[0])


def _contains(hay: Sequence[str], needle: Sequence[str]) -> bool:
    n = len(needle)
    return n > 0 and any(list(hay[i : i + n]) == list(needle) for i in range(len(hay) - n + 1))


def containment(prediction: str, gold: str, category: int) -> float:
    """1.0 when every gold item's stems occur as a consecutive run in the prediction's stems, else 0.0.

    A gold item that normalises to nothing (only punctuation or articles) is ignored; a gold answer with
    no scorable item scores 0.
    """
    pred = stems(prediction)
    items = [s for s in (stems(g) for g in gold_items(gold, category)) if s]
    return float(bool(items) and all(_contains(pred, item) for item in items))
