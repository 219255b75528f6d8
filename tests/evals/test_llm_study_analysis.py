"""The study's pre-registered analysis on synthetic run files (never on the real study's results)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats

from evals.analysis.llm_study import StudyDataError, analyse, holm, load_runs, main, make_cells


def write_run(
    folder: Path, family: str, seed: int, system: str, successes: list[int], *, complete: bool = True
) -> None:
    rows = [{"tid": f"t{i}", "success": bool(s)} for i, s in enumerate(successes)]
    res = {
        "family": family,
        "seed": seed,
        "system": system,
        "complete": complete,
        "success": sum(successes) / len(successes),
        "stale_served": 0.1,
        "rows": rows,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{family}_{seed}_{system}.json").write_text(json.dumps(res))


def test_cells_pair_by_task_and_the_primary_test_is_the_t_test_over_cells(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    # family f: C gains 1, 2, 3 of 10 tasks over A; family g: no change
    gains = {0: 1, 1: 2, 2: 3}
    for seed, g in gains.items():
        a = [1] * 5 + [0] * 5
        c = [1] * (5 + g) + [0] * (5 - g)
        write_run(runs, "f", seed, "A", a)
        write_run(runs, "f", seed, "C", c)
        write_run(runs, "g", seed, "A", a)
        write_run(runs, "g", seed, "C", a)
    out = tmp_path / "primary.json"
    main(["--runs", str(runs), "--out", str(out), "--families", "f,g", "--seeds", "0-2"])
    res = json.loads(out.read_text())
    assert res["complete"] and res["n_cells"] == 6
    ds = [0.1, 0.2, 0.3, 0.0, 0.0, 0.0]
    want = stats.ttest_1samp(ds, 0.0)
    assert res["primary"]["d"]["mean"] == pytest.approx(sum(ds) / 6)
    assert res["primary"]["d"]["p"] == pytest.approx(float(want.pvalue))
    assert res["per_family"]["f"]["d"]["mean"] == pytest.approx(0.2)
    assert res["per_family"]["g"]["d"]["p"] == 1.0  # no spread and mean 0: no evidence of a difference
    assert res["robustness"]["mcnemar_tasks"]["only_C"] == 6 and res["robustness"]["mcnemar_tasks"]["only_A"] == 0
    assert res["cells"][0]["A"]["stale_served"] == 0.1
    md = out.with_suffix(".md").read_text()
    assert "pooled" in md
    cells_md = md.split("## Every cell", 1)[-1]
    cell_rows = [line for line in cells_md.splitlines() if line.startswith(("| f | ", "| g | "))]
    assert len(cell_rows) == 6 and "## Every cell" in md  # every cell is reported, significant or not


def test_incomplete_runs_do_not_count_and_missing_cells_are_listed(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_run(runs, "f", 0, "A", [1, 0])
    write_run(runs, "f", 0, "C", [1, 1])
    write_run(runs, "f", 1, "A", [1, 0])
    write_run(runs, "f", 1, "C", [1, 1], complete=False)
    res = analyse(make_cells(load_runs(runs)), expected=[("f", 0), ("f", 1)])
    assert not res["complete"] and res["missing_cells"] == [{"family": "f", "seed": 1}]
    assert res["n_cells"] == 1 and math.isnan(res["primary"]["d"]["p"])


def test_runs_on_different_task_sequences_are_refused(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_run(runs, "f", 0, "A", [1, 0, 1])
    write_run(runs, "f", 0, "C", [1, 0])
    with pytest.raises(StudyDataError, match="different task sequences"):
        make_cells(load_runs(runs))


def test_holm_is_step_down_monotone_and_capped() -> None:
    adj = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": math.nan})
    assert adj["a"] == pytest.approx(0.03)  # 3 * 0.01
    assert adj["c"] == pytest.approx(0.06)  # 2 * 0.03
    assert adj["b"] == pytest.approx(0.06)  # max(1 * 0.04, previous 0.06)
    assert math.isnan(adj["d"])
    assert holm({"x": 0.9, "y": 0.8}) == {"x": 1.0, "y": 1.0}
