"""The synthetic benchmark's RESULTS.md: its comparison with the reference is computed from the run.

A hand-written comparison used to be appended to every report, so a run at C − A = +17.9 kept saying
"+14.9, inside the reference's interval". These tests pin that every verdict follows the numbers, and
that each committed RESULTS.md is what its committed benchmark.json renders to.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from evals.analysis import report
from evals.analysis.comparison import (
    BUDGET_WORLDS_DISCLOSURE,
    budget_worlds_disclosure,
    comparison_section,
    departures,
    position,
)
from evals.harness.families import CORE_FAMILIES, WORLDS_VERSION

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted(p.parent for p in (ROOT / "results").rglob("benchmark.json") if (p.parent / "RESULTS.md").exists())


def _est(mean: float, ci: float = 0.01) -> dict[str, float | int]:
    return {"mean": mean, "ci95": ci, "n": 15}


def _bench(
    c_minus_a_first: float, c_minus_a_latest: float, *, c_stale: float = 0.0, tokens: float = -14.0
) -> dict[str, Any]:
    """A minimal aggregate: A at 0.6 in every core family, C above it by the given headline gap."""
    per_family: dict[str, Any] = {}
    headline: dict[str, Any] = {}
    for reader, gap in (("first", c_minus_a_first), ("latest", c_minus_a_latest)):
        fams: dict[str, Any] = {}
        for fam in CORE_FAMILIES:
            stale_a = 0.3 if fam in ("contradiction", "state_change") else 0.0
            fams[fam] = {
                "A": {"success": _est(0.6), "stale_in_context": _est(stale_a)},
                "C": {
                    "success": _est(0.6 + gap),
                    "stale_in_context": _est(c_stale if stale_a else 0.0),
                    "false_invalidations": _est(0.0),
                    "missed_invalidations": _est(0.0),
                },
            }
        per_family[reader] = fams
        headline[reader] = {
            "A": _est(0.6),
            "C": _est(0.6 + gap),
            "C-A": _est(gap),
            "tokens_C-A": _est(tokens, 0.5),
        }
    return {
        "families": list(CORE_FAMILIES),
        "core_families": list(CORE_FAMILIES),
        "seeds": list(range(15)),
        "systems": ["A", "C"],
        "readers": ["first", "latest"],
        "headline": headline,
        "per_family": per_family,
        "reference": report.REFERENCE,
        "params": {
            "embedder": "hash",
            "distraction": 0.05,
            "drop_keys": 0.0,
            "wording": True,
            "tasks_per_world": 300,
            "worlds": WORLDS_VERSION,
        },
        "n_runs": 0,
        "cpu_seconds_all_runs": 0.0,
    }


@pytest.mark.parametrize(
    ("ours", "expected"),
    [(13.8, "inside"), (12.0, "inside"), (15.6, "inside"), (15.7, "above"), (11.9, "below"), (17.9, "above")],
)
def test_position_against_the_reference_interval(ours: float, expected: str) -> None:
    assert position(ours, (13.8, 1.8)) == expected


@pytest.mark.parametrize(
    ("first", "latest", "verdicts"),
    [
        (0.179, 0.084, ("**above**", "**above**")),
        (0.149, 0.062, ("**inside**", "**inside**")),
        (0.10, 0.03, ("**below**", "**below**")),
    ],
)
def test_the_headline_verdict_follows_the_numbers(first: float, latest: float, verdicts: tuple[str, str]) -> None:
    text = "\n".join(comparison_section(_bench(first, latest)))
    head = next(line for line in text.splitlines() if line.startswith("* **Headline**"))
    first_part, latest_part = head.split("reader `latest`")
    assert f"+{first * 100:.1f} ±" in first_part and verdicts[0] in first_part
    assert f"+{latest * 100:.1f} ±" in latest_part and verdicts[1] in latest_part


def test_stale_facts_and_token_direction_are_read_from_the_run() -> None:
    clean = "\n".join(comparison_section(_bench(0.15, 0.06)))
    assert "C serves no stale fact in any core family" in clean
    assert "14.0 ± 0.5 fewer tokens" in clean
    dirty = "\n".join(comparison_section(_bench(0.15, 0.06, c_stale=0.12, tokens=9.0)))
    assert "C serves stale facts (up to 12.0%)" in dirty and "no stale fact" not in dirty
    assert "9.0 ± 0.5 more tokens" in dirty


def test_a_run_off_the_reference_protocol_says_so() -> None:
    bench = _bench(0.15, 0.06)
    assert departures(bench) == []
    bench["params"]["distraction"] = 0.1
    bench["seeds"] = [0, 1]
    dep = departures(bench)
    assert any("distraction 0.1" in d for d in dep) and any("seeds 0,1" in d for d in dep)
    assert "departs from the reference's protocol" in "\n".join(comparison_section(bench))


def test_a_study_without_system_a_gets_no_headline_comparison() -> None:
    bench = _bench(0.15, 0.06)
    for h in bench["headline"].values():
        del h["A"], h["C-A"], h["tokens_C-A"]
    for fams in bench["per_family"].values():
        for cells in fams.values():
            del cells["A"]
    bench["systems"] = ["C"]
    text = "\n".join(comparison_section(bench))
    assert "**Headline**" not in text and "**Tokens**" not in text and "Where the gain" not in text


def test_the_fixed_notes_carry_no_measured_number() -> None:
    """Numbers belong to the computed section; the fixed text only explains and discloses."""
    notes = (ROOT / "evals" / "analysis" / "results_notes.md").read_text()
    assert not re.search(r"\d(\.\d+)?\s?(pp|%)", notes), "a measured number in results_notes.md goes stale"
    assert "C − A" not in notes


def test_committed_reports_exist() -> None:
    assert (ROOT / "results" / "benchmark") in COMMITTED


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_committed_report_is_what_its_json_renders_to(folder: Path, tmp_path: Path) -> None:
    bench = json.loads((folder / "benchmark.json").read_text())
    report.write_report(bench, tmp_path / "RESULTS.md")
    assert (tmp_path / "RESULTS.md").read_text() == (folder / "RESULTS.md").read_text(), (
        f"re-render with: python -m evals.analysis.report {folder.relative_to(ROOT)}"
    )


def test_rerender_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = ROOT / "results" / "benchmark"
    (tmp_path / "benchmark.json").write_text((src / "benchmark.json").read_text())
    assert report.main([str(tmp_path)]) == 0
    assert (tmp_path / "RESULTS.md").read_text() == (src / "RESULTS.md").read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as exc:
        report.main([str(empty)])
    assert exc.value.code == 2 and "does not exist" in capsys.readouterr().err
    assert list(empty.iterdir()) == []


def test_a_single_seed_run_states_its_means_without_an_interval() -> None:
    bench = _bench(0.179, 0.084)
    for h in bench["headline"].values():
        for est in h.values():
            est["ci95"], est["n"] = float("nan"), 1
    text = "\n".join(comparison_section(bench))
    assert "nan" not in text.lower()
    assert "C − A = +17.9 pp against" in text and "**above**" in text and "overlap" not in text
    assert "14.0 fewer tokens" in text


def test_rendering_does_not_change_the_aggregate() -> None:
    bench = _bench(0.15, 0.06)
    before = copy.deepcopy(bench)
    comparison_section(bench)
    assert bench == before


def _with_budget(bench: dict[str, Any], tight: tuple[float, float], lookalike: tuple[float, float] | None) -> None:
    """Set budget_tight's (A, C) success for every reader and, when given, add budget_lookalike's."""
    for fams in bench["per_family"].values():
        fams["budget_tight"]["A"]["success"] = _est(tight[0])
        fams["budget_tight"]["C"]["success"] = _est(tight[1])
        if lookalike is not None:
            fams["budget_lookalike"] = {"A": {"success": _est(lookalike[0])}, "C": {"success": _est(lookalike[1])}}
    if lookalike is not None:
        bench["families"] = [*bench["families"], "budget_lookalike"]


def test_budget_tight_is_read_against_the_reference_description() -> None:
    bench = _bench(0.15, 0.06)
    _with_budget(bench, (0.18, 0.23), (0.26, 0.54))
    text = "\n".join(comparison_section(bench))
    assert "budget_tight (A 18.0%, C 23.0%, C − A +5.0): low for every system, as the reference reports" in text
    # budget_lookalike is outside the headline; what swapping it in would do is computed: (28 - 5) / 7
    assert "budget_lookalike (outside the headline" in text and "A 26.0%, C 54.0%, C − A +28.0" in text
    assert "keeps the long gold fact" in text and "would move C − A by +3.3 pp" in text
    _with_budget(bench, (0.55, 0.80), (0.50, 0.52))
    text = "\n".join(comparison_section(bench))
    assert "not low for every system, unlike the reference's" in text
    assert "C − A +2.0." in text and "keeps the long gold fact" not in text  # no mechanism claimed without a gap


def test_a_version_1_run_keeps_its_own_budget_text() -> None:
    """Runs before worlds version 2 recorded no version: their budget_tight was today's budget_lookalike."""
    bench = _bench(0.15, 0.06)
    del bench["params"]["worlds"]
    _with_budget(bench, (0.26, 0.54), None)
    text = "\n".join(comparison_section(bench))
    expected = "budget_tight (A 26.0%, C 54.0%; with reader `latest` it is +28.0, so the reader mode does not matter)"
    assert expected in text
    assert "as the reference reports" not in text and "budget_lookalike" not in text
    assert budget_worlds_disclosure(bench) == BUDGET_WORLDS_DISCLOSURE[1]
    assert "one look-alike for half of the keys" in budget_worlds_disclosure(bench)


def test_every_worlds_version_has_its_disclosure(tmp_path: Path) -> None:
    assert set(BUDGET_WORLDS_DISCLOSURE) == set(range(1, WORLDS_VERSION + 1))
    report.write_report(_bench(0.15, 0.06), tmp_path / "RESULTS.md")
    text = (tmp_path / "RESULTS.md").read_text()
    assert "{budget_worlds}" not in text and BUDGET_WORLDS_DISCLOSURE[WORLDS_VERSION] in text
