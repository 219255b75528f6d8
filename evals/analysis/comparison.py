"""The "how our numbers compare with the reference" section of ``RESULTS.md``, computed from the run.

Why computed: this section used to be a hand-written file appended to every report. Its numbers were
true for the run it was written after and false for every later one (a report at C − A = +17.9 went on
saying "+14.9, inside the reference's interval"). Here every number, and every word that depends on one
("inside", "above", "fewer"), comes from the aggregated ``benchmark.json`` the report is rendered from;
only the explanations of mechanisms are fixed text, and each is printed only when the number it explains
says what it explains.

Pure functions of the aggregate (no I/O), so a report can be re-rendered from a committed JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from evals.harness.families import BUDGET_TIGHT_TOKENS, CORE_FAMILIES

Position = Literal["inside", "above", "below"]

# The reference's protocol (reference design §9-10); a run that departs from it is labelled as such.
REFERENCE_PROTOCOL: dict[str, Any] = {
    "embedder": "hash",
    "distraction": 0.05,
    "drop_keys": 0.0,
    "wording": True,
    "tasks_per_world": 300,
}
REFERENCE_SEEDS = list(range(15))
# The reference repeated its headline with all-MiniLM-L6-v2 (reader first, reference design §10).
REFERENCE_MINILM_HEADLINE: dict[str, Any] = {"first": {"C-A": (10.2, 1.4)}}
CONTROL_FAMILY = "distractor_norecur"
UPDATE_FAMILIES = ("contradiction", "state_change", "long_horizon")


def position(ours: float, reference: tuple[float, float]) -> Position:
    """Where ``ours`` lies against the reference's ``(mean, half width)`` interval (ends included)."""
    mean, half = reference
    if ours > mean + half:
        return "above"
    if ours < mean - half:
        return "below"
    return "inside"


def departures(bench: Mapping[str, Any]) -> list[str]:
    """How this run's protocol differs from the reference's (empty when it does not).

    Old aggregates did not record every parameter; a missing one is read as the default it then had,
    which was the reference's value.
    """
    params = bench.get("params") or {}
    out = [
        f"{name} {params[name]!r} (reference {ref!r})"
        for name, ref in REFERENCE_PROTOCOL.items()
        if name in params and params[name] != ref and not (name == "embedder" and _minilm(bench))
    ]
    if list(bench.get("seeds", [])) != REFERENCE_SEEDS:
        out.append("seeds " + ",".join(str(s) for s in bench.get("seeds", [])) + " (reference 0-14)")
    if list(bench.get("core_families", [])) != list(CORE_FAMILIES):
        out.append("core families " + ", ".join(bench.get("core_families", [])) + " (reference: all seven)")
    return out


def _minilm(bench: Mapping[str, Any]) -> bool:
    """Whether the run used all-MiniLM-L6-v2, the one real embedder the reference also reports."""
    return bool((bench.get("params") or {}).get("embedder") == "minilm")


def _mean(pf: Mapping[str, Any], family: str, system: str, metric: str) -> float | None:
    cell = pf.get(family, {}).get(system, {}).get(metric)
    if not cell or cell.get("mean") is None or math.isnan(cell["mean"]):
        return None
    return float(cell["mean"])


def _gap(pf: Mapping[str, Any], family: str) -> float | None:
    """C's success minus A's in one family (mean over seeds), or None when either is missing."""
    a, c = _mean(pf, family, "A", "success"), _mean(pf, family, "C", "success")
    return None if a is None or c is None else c - a


def _pp(x: float) -> str:
    return _signed(x * 100)


def _pm(half_width: float) -> str:
    """`` ± 1.0``, or nothing for a single seed (no interval)."""
    return "" if math.isnan(half_width) else f" ± {half_width:.1f}"


def _signed(x: float) -> str:
    """``+1.2`` / ``−1.2`` with a true minus sign, as the tables print differences."""
    return f"{x:+.1f}".replace("-", "−")


def _reference_headline(bench: Mapping[str, Any]) -> Mapping[str, Any]:
    """The reference's headline for this run's embedder (it measured the hash embedder and MiniLM)."""
    if _minilm(bench):
        return REFERENCE_MINILM_HEADLINE
    return dict(bench["reference"]["headline"])


def _reference_budget_tight(bench: Mapping[str, Any]) -> str:
    if _minilm(bench):
        return "with MiniLM the reference's gain was smallest there (60.6 → 61.9)"
    return "the reference reports budget_tight as low for every system"


def _headline_bullet(bench: Mapping[str, Any]) -> list[str]:
    ref = _reference_headline(bench)
    parts: list[str] = []
    for reader, h in bench["headline"].items():
        ca, rca = h.get("C-A"), ref.get(reader, {}).get("C-A")
        if not ca or not rca:
            continue
        ours, half = ca["mean"] * 100, ca["ci95"] * 100
        where = position(ours, (rca[0], rca[1]))
        lo, hi = rca[0] - rca[1], rca[0] + rca[1]
        tail = ""
        if where != "inside" and not math.isnan(half):  # one seed has no interval to overlap with
            tail = f"; the two intervals {'overlap' if ours - half <= hi and ours + half >= lo else 'do not overlap'}"
        parts.append(
            f"reader `{reader}`: C − A = {_pp(ca['mean'])}{_pm(half)} pp against the "
            f"reference's +{rca[0]} ± {rca[1]}, **{where}** its interval ({lo:.1f} to {hi:.1f}{tail})"
        )
    if not parts:
        return []
    lines = ["* **Headline**, " + "; ".join(parts) + "."]
    first, latest = bench["headline"].get("first", {}), bench["headline"].get("latest", {})
    if "C-A" in first and "C-A" in latest and "latest" in ref:
        lines.append(
            f"  The gain goes from {_pp(first['C-A']['mean'])} (first) to {_pp(latest['C-A']['mean'])} pp "
            f"(latest) for a timestamp-aware reader (reference: +{ref['first']['C-A'][0]} to "
            f"+{ref['latest']['C-A'][0]}): such a reader already copes with most stale facts."
        )
    return lines


def _families_bullet(bench: Mapping[str, Any]) -> list[str]:
    core = bench.get("core_families", [])
    reader = "first" if "first" in bench["per_family"] else next(iter(bench["per_family"]), None)
    if reader is None or not core:
        return []
    pf = bench["per_family"][reader]
    gaps = [(gap, fam) for fam in core if (gap := _gap(pf, fam)) is not None]
    if not gaps:
        return []
    gaps.sort(key=lambda g: (-g[0], g[1]))
    listed = ", ".join(f"{fam} {_pp(gap)}" for gap, fam in gaps)
    # The reference's shape: the gain is largest where facts change. Only a claim when other families ran too.
    top = {fam for _, fam in gaps[:3]}
    shape = ""
    if len(gaps) > len(UPDATE_FAMILIES):
        shape = (
            " It is concentrated where facts change, as in the reference."
            if len(top & set(UPDATE_FAMILIES)) >= 2
            else " It is not concentrated where facts change, unlike the reference's."
        )
    lines = [
        f"* **Where the gain comes from** (reader `{reader}`, C − A per core family, largest first): {listed}."
        f"{shape} Each family weighs 1/{len(core)} in the headline. Our worlds are our own generator "
        "(`evals/harness/families.py`), written from the reference's description, not its code, so per-family "
        "levels differ from the reference's."
    ]
    if worlds_version(bench) == 1:
        lines += _budget_v1_line(bench, reader, pf)
    else:
        lines += _budget_lines(bench, pf)
    return lines


def worlds_version(bench: Mapping[str, Any]) -> int:
    """The generation of the worlds a run used (:data:`WORLDS_VERSION`); runs before it was recorded are 1."""
    return int((bench.get("params") or {}).get("worlds", 1))


def _budget_lines(bench: Mapping[str, Any], pf: Mapping[str, Any]) -> list[str]:
    """budget_tight against the reference's description, and budget_lookalike (outside the headline) beside it."""
    lines = []
    a, c, gap = _mean(pf, "budget_tight", "A", "success"), _mean(pf, "budget_tight", "C", "success"), None
    if a is not None and c is not None:
        gap = c - a
        verdict, tail = "", ""
        if _minilm(bench):  # the reference gave MiniLM's budget_tight levels, not a verdict
            ref = _reference_budget_tight(bench)
            tail = f" {ref[:1].upper()}{ref[1:]}."
        elif max(a, c) < 0.5:
            verdict = "low for every system, as the reference reports. "
        else:
            verdict = "not low for every system, unlike the reference's. "
        lines.append(
            f"  budget_tight (A {a * 100:.1f}%, C {c * 100:.1f}%, C − A {_pp(gap)}): {verdict}Each key has two short "
            f"look-alikes that share the question's words, and its long gold fact does not fit in the "
            f"{BUDGET_TIGHT_TOKENS}-token budget beside them.{tail}"
        )
    la, lc = _mean(pf, "budget_lookalike", "A", "success"), _mean(pf, "budget_lookalike", "C", "success")
    if la is not None and lc is not None:
        text = (
            f"  budget_lookalike (outside the headline; the facts and questions of budget_tight before worlds "
            f"version 2, with one look-alike for half of the keys): A {la * 100:.1f}%, C {lc * 100:.1f}%, "
            f"C − A {_pp(lc - la)}."
        )
        if lc - la > 0.05:
            text += (
                f" Here C's cost-aware selection (utility floor, knapsack) keeps the long gold fact in the "
                f"{BUDGET_TIGHT_TOKENS}-token budget that a similarity ranking fills with a short look-alike first."
            )
        if gap is not None:
            text += (
                f" Counted in the headline instead of budget_tight, it would move C − A by "
                f"{_pp((lc - la - gap) / len(bench.get('core_families') or CORE_FAMILIES))} pp."
            )
        lines.append(text)
    return lines


def _budget_v1_line(bench: Mapping[str, Any], reader: str, pf: Mapping[str, Any]) -> list[str]:
    """Worlds version 1: budget_tight had one look-alike for half of the keys (now budget_lookalike)."""
    bt_a, bt_c = _mean(pf, "budget_tight", "A", "success"), _mean(pf, "budget_tight", "C", "success")
    bt_gap = _gap(pf, "budget_tight")
    if bt_a is None or bt_c is None or bt_gap is None or bt_gap <= 0.05:
        return []
    other = {
        r: gap for r, p in bench["per_family"].items() if r != reader and (gap := _gap(p, "budget_tight")) is not None
    }
    same = "".join(
        f"; with reader `{r}` it is {_pp(gap)}"
        + (", so the reader mode does not matter" if abs(gap - bt_gap) < 0.005 else "")
        for r, gap in other.items()
    )
    return [
        f"  budget_tight (A {bt_a * 100:.1f}%, C {bt_c * 100:.1f}%{same}): C's cost-aware selection "
        f"(utility floor, knapsack) keeps the long gold fact in a {BUDGET_TIGHT_TOKENS}-token budget that a "
        "similarity ranking "
        f"fills with short look-alikes; {_reference_budget_tight(bench)}."
    ]


BUDGET_WORLDS_DISCLOSURE = {
    1: (
        "After a first full test run showed that no system ever served the gold fact in the budget families (two "
        "look-alikes per key of ~18 tokens crowded out the ~36-token gold fact), those worlds were changed to one "
        "look-alike for half of the keys, checked on dev seeds, and the test seeds were run again; the numbers "
        "reported since come from that protocol only."
    ),
    2: (
        "The budget worlds changed twice, each time after full test runs. After a first test run in which no "
        "system ever served the gold fact (two look-alikes per key of ~18 tokens crowded out the ~36-token gold "
        "fact), they got one look-alike for half of the keys (worlds version 1). With hybrid retrieval that world "
        "had C at twice A's success in budget_tight, where the reference reports the family as low for every "
        "system; the first design, checked again on dev seeds 200–201 "
        "(`results/benchmark/budget_worlds_dev/`), now was "
        "low for every system. So budget_tight and budget_medium went back to it (worlds version 2) and the test "
        "seeds were run once more. The change was made knowing that it lowers the headline: counting "
        "budget_tight's version-1 gap as zero would have put C − A inside the reference's intervals. The version-1 "
        "world is kept as budget_lookalike (the same facts and questions; the simulated reader's coins differ, "
        "as they depend on task ids that name the family) and reported above, outside the headline."
    ),
}


def budget_worlds_disclosure(bench: Mapping[str, Any]) -> str:
    """How the budget worlds of this run's version came about (fixed text per version, no measured number)."""
    return BUDGET_WORLDS_DISCLOSURE[worlds_version(bench)]


def _control_bullet(bench: Mapping[str, Any]) -> list[str]:
    pf = bench["per_family"].get("first", {})
    a, c = _mean(pf, CONTROL_FAMILY, "A", "success"), _mean(pf, CONTROL_FAMILY, "C", "success")
    if a is None or c is None:
        return []
    ref = bench["reference"]["control_first"]
    gain = c - a
    line = (
        f"* **Control ({CONTROL_FAMILY}, reader first)**: A {a * 100:.1f}%, C {c * 100:.1f}%, C − A {_pp(gain)} pp "
        f"(reference: A {ref['A']}, C {ref['C']}, no gain)."
    )
    if gain > 0.01:
        line += (
            " No key recurs, so per-key history cannot help; what helps is the utility floor dropping "
            "low-utility, low-similarity candidates (less irrelevant context for the reader) and look-alike "
            "notes of *other* keys being served repeatedly and learned as useless. The reference has both "
            "mechanisms; in our worlds the look-alikes are reused across questions."
        )
    return [line]


def _stale_bullet(bench: Mapping[str, Any]) -> list[str]:
    pf = bench["per_family"].get("first", {})
    core = bench.get("core_families", [])
    rows = []
    for fam in core:
        vals = {s: _mean(pf, fam, s, "stale_in_context") for s in bench["systems"]}
        if any(v for v in vals.values()):
            rows.append(f"{fam} " + ", ".join(f"{s} {v * 100:.1f}%" for s, v in vals.items() if v is not None))
    c_max = max((_mean(pf, f, "C", "stale_in_context") or 0.0 for f in core), default=0.0)
    if not rows:
        return []
    ref = bench["reference"]["stale_in_context_first"]
    ref_text = ", ".join(f"{fam} {a}% → {c}%" for fam, (a, c) in ref.items())
    verdict = (
        "C serves no stale fact in any core family"
        if c_max == 0
        else f"C serves stale facts (up to {c_max * 100:.1f}%)"
    )
    return [
        f"* **Stale-in-context** (reader first): {verdict}; per family: {'; '.join(rows)}. "
        f"Reference (A → C): {ref_text}."
    ]


def _historical_bullet(bench: Mapping[str, Any]) -> list[str]:
    pf = bench["per_family"].get("first", {})
    a, c = _mean(pf, "state_change", "A", "historical_success"), _mean(pf, "state_change", "C", "historical_success")
    if a is None or c is None:
        return []
    ref = bench["reference"]["historical_as_of_first"]
    return [
        f"* **Historical `as_of` questions** (state_change, reader first): A {a * 100:.1f}%, C {c * 100:.1f}% "
        f"(reference: A {ref['A']}%, C {ref['C']}%)."
    ]


def _invalidations_bullet(bench: Mapping[str, Any]) -> list[str]:
    pf: Mapping[str, Any] = bench["per_family"].get("first") or next(iter(bench["per_family"].values()), {})
    false = [_mean(pf, f, "C", "false_invalidations") for f in bench.get("families", [])]
    missed = [_mean(pf, f, "C", "missed_invalidations") for f in bench.get("families", [])]
    fs, ms = [x for x in false if x is not None], [x for x in missed if x is not None]
    if not fs and not ms:
        return []
    line = (
        f"* **Invalidations** (C, per world, mean over seeds; the largest family): false {max(fs, default=0.0):.2f}, "
        f"missed {max(ms, default=0.0):.2f}."
    )
    if max(fs, default=0.0) == 0:
        line += " No false ones: multi-valued `depends_on` facts are stored with role `preference` and never supersede."
    if max(ms, default=0.0) == 0 and (bench.get("params") or {}).get("drop_keys", 0.0) == 0:
        line += " No missed ones, because these worlds pass every fact's key (`--drop-keys` is 0)."
    return [line]


def _tokens_bullet(bench: Mapping[str, Any]) -> list[str]:
    ref = _reference_headline(bench).get("tokens_C-A")
    ref_text = f"reference: {_signed(ref[0])} ± {ref[1]}" if ref else "the reference gave no figure for this embedder"
    for reader, h in bench["headline"].items():
        t = h.get("tokens_C-A")
        if not t:
            continue
        d = t["mean"]
        direction = "fewer" if d < 0 else "more"
        why = (
            " The utility floor and the knapsack drop candidates a similarity ranking keeps."
            if d < 0
            else " C serves more of its pool than A here."
        )
        return [
            f"* **Tokens** (reader `{reader}`): C serves {abs(d):.1f}{_pm(t['ci95'])} {direction} tokens per task "
            f"than A ({ref_text}).{why}"
        ]
    return []


def comparison_section(bench: Mapping[str, Any]) -> list[str]:
    """Markdown lines of the section; empty without both A and C (e.g. a study of C variants)."""
    if not {"A", "C"} <= set(bench.get("systems", [])):
        return []
    body = [
        *_headline_bullet(bench),
        *_families_bullet(bench),
        *_control_bullet(bench),
        *_stale_bullet(bench),
        *_historical_bullet(bench),
        *_invalidations_bullet(bench),
        *_tokens_bullet(bench),
    ]
    if not body:
        return []
    lines = ["## How our numbers compare with the reference", ""]
    if dep := departures(bench):
        lines += [
            "This run departs from the reference's protocol: " + "; ".join(dep) + ". Its reference numbers are "
            "context, not a target.",
            "",
        ]
    return [*lines, *body, ""]
