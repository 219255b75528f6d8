"""Credit assignment: turning one outcome into per-memory credit and blame.

Observable signals only (reference §4): whether the agent *cited* a memory (self-reported, noisy)
and whether it *used* the memory's value (the answer committed to a value the memory holds, detected
lexically by :func:`values_used`). Credit is per memory, not split equally among the served set. On
failure, memories whose value was used are blamed; shown memories with neither signal are "wasted"
exposures. Only served memories receive anything (bandit feedback).

Optional leave-one-out replay re-runs the task without one memory at a time (through a caller-given
callback); a memory whose removal flips success to failure gets full credit. ``loo="ambiguous"``
replays only memories where exactly one of cited/used holds, which costs far fewer agent calls.
Limitations: citations are self-reported, value use is lexical (a decoy that mentions the answer
counts), and LOO under-credits redundant copies. None of it establishes causality.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

CreditMode = Literal["signals", "equal", "usage_only"]
LooPolicy = Literal["off", "full", "ambiguous"]
Replay = Callable[[Sequence[str]], bool]


@dataclass(frozen=True)
class CreditPolicy:
    """``mode``: ``signals`` (default), ``equal`` (every served memory shares a success: the naive
    baseline), ``usage_only`` (credit from citation/value use, ignoring the success bit).

    ``citation_support`` (opt-in, default off): real models cite memories that did not support their
    answer. When on, a cited memory that carries none of the answer's values (an *unsupported*
    citation) earns ``unsupported_fraction`` (0.25) of a supported citation's credit
    (``cited_and_used``) instead of ``cited_only``; on failure nothing changes (no extra blame). The
    support signal is ``supported`` if the caller gives it, else ``used`` (``ReMem.feedback(answer=...)``
    adds every served memory whose text holds an answer value to ``used``, via :func:`values_used`).
    Because ``assign`` does not see whether an answer was given, the rule applies only when that
    support set is non-empty: with no value-use evidence at all (no ``answer=`` and no ``used_ids``,
    or an answer no served memory carries) citations keep the ordinary ``cited_only`` credit.
    Why 0.25, not 0: on the committed real-LLM traces (``results/llm_agent/citation_precision.json``) 73-79% of
    citations are unsupported and only 2-7% of those are the gold memory (none on successful asks),
    so an unsupported citation is weak evidence; it keeps a little credit because value use is lexical
    (a paraphrased value is missed) and because self-citation is all the caller may have.
    """

    mode: CreditMode = "signals"
    cited_and_used: float = 1.0
    used_only: float = 0.75
    cited_only: float = 0.5
    blame_used: float = 1.0
    blame_cited_only: float = 0.25
    loo: LooPolicy = "off"
    citation_support: bool = False
    unsupported_fraction: float = 0.25

    def assign(
        self,
        served: Sequence[str],
        *,
        success: bool,
        cited: Collection[str],
        used: Collection[str],
        essential: Collection[str] = (),
        supported: Collection[str] | None = None,
    ) -> dict[str, tuple[float, float]]:
        """(credit, blame) for every served id. ``essential``: ids whose removal flipped success (LOO).
        ``supported``: ids carrying an answer value (only read with ``citation_support``; default ``used``)."""
        support = set(used if supported is None else supported) if self.citation_support else set()
        out: dict[str, tuple[float, float]] = {}
        for mid in served:
            c, u = mid in cited, mid in used
            signal = self.cited_and_used if (c and u) else self.used_only if u else self.cited_only if c else 0.0
            if support and c and not u and mid not in support:  # an unsupported citation
                signal = self.unsupported_fraction * self.cited_and_used
            if self.mode == "equal":
                out[mid] = (1.0 / len(served), 0.0) if success else (0.0, 1.0 / len(served))
            elif self.mode == "usage_only":
                out[mid] = (signal, 0.0)
            elif success:
                out[mid] = (1.0 if mid in essential else signal, 0.0)
            else:
                out[mid] = (0.0, self.blame_used if u else self.blame_cited_only if c else 0.0)
        return out

    def replay_candidates(self, served: Sequence[str], cited: Collection[str], used: Collection[str]) -> list[str]:
        """Which served memories leave-one-out should replay under this policy."""
        if self.loo == "full":
            return list(served)
        if self.loo == "ambiguous":
            return [m for m in served if (m in cited) != (m in used)]
        return []


def leave_one_out(served: Sequence[str], candidates: Iterable[str], replay: Replay) -> tuple[set[str], int]:
    """Replay the task without each candidate; returns (ids whose removal caused failure, calls made)."""
    essential, calls = set(), 0
    for mid in candidates:
        calls += 1
        if not replay([s for s in served if s != mid]):
            essential.add(mid)
    return essential, calls


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()


def answer_values(answer: Any) -> list[str]:
    """The scalar values an answer committed to (strings and numbers, nested JSON flattened)."""
    out: list[str] = []
    if isinstance(answer, Mapping):
        for k, v in answer.items():
            if k in ("citations", "cited_ids", "reasoning"):
                continue
            out += answer_values(v)
    elif isinstance(answer, list | tuple):
        for v in answer:
            out += answer_values(v)
    elif isinstance(answer, bool) or answer is None:
        pass
    elif isinstance(answer, int) and answer.bit_length() > 1024:
        pass  # no memory text carries a 300-digit number (and str() of a huge int raises)
    elif isinstance(answer, int | float | str):
        s = _norm(str(answer))
        if len(s) >= 2:
            out.append(s)
    return out


def values_used(texts: Mapping[str, str], answer: Any) -> set[str]:
    """Ids of memories whose text contains a value the answer committed to (whole-word match)."""
    values = answer_values(answer)
    if not values:
        return set()
    pats = [re.compile(r"(?<![\w-])" + re.escape(v) + r"(?![\w-])") for v in values]
    return {mid for mid, text in texts.items() if any(p.search(_norm(text)) for p in pats)}


_VALUE_TOKEN = re.compile(r"[\w][\w.:/@-]*[\w]|\w")
_STOP = frozenset(
    "the a an and or of to in on at for is are was were be been it its this that with from by as our your my their "
    "we you i he she they them his her not no yes".split()
)


def carried_values(text: str) -> set[str]:
    """The value-like tokens a memory carries: words with a digit or an inner ``-._:/@`` (``west-2``,
    ``10.0.0.1``, ``v3.2``) and capitalised words after the first (names). Casefolded."""
    return set(_carried_for(text))


_CARRIED_CACHE_CHARS = 2048  # memory texts up to this long are tokenised once each (served memories recur)


@functools.lru_cache(maxsize=8192)
def _carried(text: str) -> frozenset[str]:
    return frozenset(_carried_values(text))


def _carried_values(text: str) -> set[str]:
    out: set[str] = set()
    for n, m in enumerate(_VALUE_TOKEN.finditer(unicodedata.normalize("NFKC", text))):
        tok = m.group(0)
        if len(tok) < 2:
            continue
        low = tok.casefold()
        if low in _STOP:
            continue
        if tok.isalpha():  # most tokens: letters only, so neither a digit nor one of -._:/@
            if n > 0 and tok[0].isupper():
                out.add(low)
        elif any(ch.isdigit() for ch in tok) or any(ch in tok for ch in "-._:/@") or (n > 0 and tok[0].isupper()):
            out.add(low)
    return out


def carried_values_used(texts: Mapping[str, str], reply: str, *, exclude: str = "") -> set[str]:
    """Ids of memories carrying a value that the free-text ``reply`` (or tool-call arguments) repeats.

    A value the conversation itself already contains (``exclude``: the user's turns) is not evidence that
    the memory was used, so it does not count.
    """
    said = {t.casefold() for t in _VALUE_TOKEN.findall(unicodedata.normalize("NFKC", reply))}
    known = {t.casefold() for t in _VALUE_TOKEN.findall(unicodedata.normalize("NFKC", exclude))}
    fresh = said - known  # (carried - known) & said == carried & (said - known)
    return {mid for mid, text in texts.items() if not _carried_for(text).isdisjoint(fresh)}


def _carried_for(text: str) -> frozenset[str] | set[str]:
    return _carried(text) if len(text) <= _CARRIED_CACHE_CHARS else _carried_values(text)
