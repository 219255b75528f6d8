"""The calibrated reader: its draws follow its own likelihood, the fit recovers known parameters,
real traces rebuild into the reader's input, and fit -> predict -> compare runs end to end."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from evals.analysis import calibrate_reader as cr
from evals.harness.reader import (
    READER_MODES,
    CalibratedParams,
    KeyContext,
    ReaderParams,
    calibrated_success_p,
    key_context,
    read,
)
from evals.harness.world import DAY, T0, Fact, Task
from remem_agent.agent.trace import load_traces
from remem_agent.errors import UserInputError

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "traces" / "llm_aliases" / "contradiction_0_A.jsonl.gz"  # committed traces are compressed
KEY = ("svc", "owner")


def _fact(fid: str, key: tuple[str, str] | None, value: str | None, t: float) -> Fact:
    return Fact(fid, f"{fid} {value}", key[0] if key else None, key[1] if key else None, "state", t, key, value)


def test_hand_set_modes_are_unchanged_and_calibrated_needs_params() -> None:
    assert READER_MODES == ("first", "latest")
    assert ReaderParams() == ReaderParams(mode="first", distraction=0.05, cite_p=0.9, false_cite_p=0.05)
    with pytest.raises(ValueError, match="fitted CalibratedParams"):
        ReaderParams(mode="calibrated")
    with pytest.raises(ValueError, match="probability"):
        CalibratedParams(lapse=1.5)


def test_key_context_counts_what_the_reader_sees() -> None:
    served = [
        _fact("stale", KEY, "bob", T0),
        _fact("other", ("svc", "version"), "v2", T0),
        _fact("gold", KEY, "erin", T0 + DAY),
        _fact("noise", None, None, T0),
        _fact("future", KEY, "zed", T0 + 9 * DAY),
    ]
    ctx = key_context(KEY, "erin", served, T0 + 2 * DAY, n_values=4)
    assert ctx.relevant_ranks == (0, 2)  # the future fact is not relevant yet
    assert ctx.relevant_correct == (False, True) and ctx.latest == (False, True)
    assert (ctx.n_entity, ctx.n_other, ctx.chance) == (2, 1, 0.25)  # "future": irrelevant, same entity
    both = key_context(KEY, "erin", served, T0 + 2 * DAY, n_values=4, needed=(KEY, ("svc", "version")))
    assert (both.n_entity, both.n_other) == (1, 1)  # the task's other key is not a distractor


def test_calibrated_draws_follow_calibrated_success_p() -> None:
    p = CalibratedParams(lapse=0.1, distraction=0.05, entity_distraction=0.2, position=0.7, recency=0.4, guess=0.3)
    served = [
        _fact("stale", KEY, "bob", T0),
        _fact("gold", KEY, "erin", T0 + DAY),
        _fact("other", ("svc", "version"), "v2", T0),
        _fact("n1", None, None, T0),
    ]
    domains = {"owner": ("bob", "erin", "kim")}
    n, wins = 4000, 0
    for i in range(n):
        task = Task(f"t{i}", T0 + 2 * DAY, "c", "who?", None, (KEY,), {"svc.owner": "erin"})
        wins += read(
            task, served, seed=3, params=ReaderParams(mode="calibrated", calibrated=p), domains=domains
        ).success
    expected = calibrated_success_p([key_context(KEY, "erin", served, T0 + 2 * DAY, n_values=3)], p)
    assert 0.3 < expected < 0.8
    assert abs(wins / n - expected) < 0.03  # 4000 draws: sd ~0.008
    # chance-level blind guess when nothing relevant is served (blind_guess=None)
    empty = [key_context(KEY, "erin", served[2:], T0 + 2 * DAY, n_values=3)]
    assert calibrated_success_p(empty, p) == pytest.approx(1 / 3)


def _synthetic_obs(p: CalibratedParams, n: int, seed: int = 0) -> list[cr.Observation]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        n_rel = rng.choice((1, 1, 2))
        ranks = tuple(sorted(rng.sample(range(5), n_rel)))
        correct = (True,) if n_rel == 1 else tuple(rng.sample((True, False), 2))
        latest = correct  # the true value is the most recent one
        n_entity = rng.randrange(0, 5 - n_rel + 1)
        ctx = KeyContext(
            relevant_ranks=ranks,
            relevant_correct=correct,
            latest=latest,
            n_entity=n_entity,
            n_other=5 - n_rel - n_entity,
            chance=0.25,
        )
        success = rng.random() < calibrated_success_p([ctx], p)
        out.append(
            cr.Observation(
                source="synthetic/x_A.jsonl",
                task_id=f"contradiction-0-t{i:04d}",
                family="contradiction",
                system="A",
                success=success,
                contexts=(ctx,),
                n_irrelevant=5 - n_rel,
                cited_used=1,
                used=1,
                cited_other=1,
                other=4,
                heldout=cr._heldout(f"contradiction-0-t{i:04d}", 0.3),
            )
        )
    return out


def test_fit_recovers_known_parameters_and_beats_a_constant() -> None:
    true = CalibratedParams(lapse=0.05, distraction=0.01, entity_distraction=0.3, position=2.0, recency=0.0, guess=0.1)
    obs = _synthetic_obs(true, 3000)
    got = cr.fit(obs, prior_sd=0.0).params
    assert abs(got.lapse - true.lapse) < 0.05
    assert abs(got.entity_distraction - true.entity_distraction) < 0.06
    assert got.cite_p == 1.0 and got.false_cite_p == 0.25  # observed citation rates
    rep = cr.fit_report(cr.LoadReport(observations=tuple(obs), skipped={}), holdout=0.3, sources=["synthetic"])
    h = rep["heldout"]
    assert h["calibrated"]["log_lik_per_task"] > h["constant"]["log_lik_per_task"]
    assert sum(r["n"] for r in h["calibration_table"]) == h["calibrated"]["n"] == rep["split"]["heldout"]
    assert set(rep["intervals"]) == set(cr.fitted_names(False))


def test_real_traces_rebuild_into_reader_contexts(tmp_path: Path) -> None:
    recs = load_traces(TRACE)
    rep = cr.load([TRACE], n_tasks=(40,))
    assert rep.skipped == {} and len(rep.observations) == len(recs) == 40
    assert sum(o.success for o in rep.observations) == sum(bool(r["outcome"]["success"]) for r in recs)
    assert all(len(o.contexts) == 1 and o.system == "A" for o in rep.observations)
    assert sum(bool(o.contexts[0].relevant_ranks) for o in rep.observations) >= 38  # gold nearly always served
    # a served text that is in no world fact: the line is counted as skipped, not guessed
    recs[0]["served"][0]["text"] = "a memory no world ever held"
    bad = tmp_path / "contradiction_0_A.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rep2 = cr.load([tmp_path], n_tasks=(40,))
    assert rep2.skipped == {"world mismatch": 1} and len(rep2.observations) == 39
    with pytest.raises(UserInputError, match="no trace file"):
        cr.load([tmp_path / "missing"])


def _summary(per_seed: dict[str, tuple[float, float]]) -> dict[str, object]:
    ds = [c - a for a, c in per_seed.values()]
    mean = sum(ds) / len(ds)
    return {
        "paired_C_minus_A": {
            "contradiction": {
                "per_seed": {s: {"success_A": a, "success_C": c} for s, (a, c) in per_seed.items()},
                "success": {"mean": mean, "ci95": 0.05, "n": len(ds)},
            }
        }
    }


def test_fit_predict_compare_end_to_end(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    for name in ("contradiction_0_A.jsonl.gz", "contradiction_0_C.jsonl.gz"):
        shutil.copy(TRACE.with_name(name), traces / name)
    fit_path, pred_path, cmp_path = tmp_path / "fit.json", tmp_path / "pred.json", tmp_path / "cmp.json"
    cr.main(["fit", str(traces), "--out", str(fit_path), "--tasks", "40"])
    fit = json.loads(fit_path.read_text())
    assert fit["asks"] == 80 and fit["skipped"] == {}
    assert cr.params_of(fit) == CalibratedParams(**fit["params"])
    predict = ["predict", "--fit", str(fit_path), "--out", str(pred_path), "--families", "contradiction"]
    cr.main([*predict, "--seeds", "0-1", "--tasks", "20"])
    pred = json.loads(pred_path.read_text())
    assert set(pred["cells"]) == {"contradiction/0", "contradiction/1"}
    d = [pred["cells"][f"contradiction/{s}"]["C"] - pred["cells"][f"contradiction/{s}"]["A"] for s in (0, 1)]
    assert pred["by_family"]["contradiction"]["C_minus_A"]["mean"] == pytest.approx(sum(d) / 2)
    # compare against a synthetic study summary (never the real one)
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(_summary({"0": (0.5, 0.6), "1": (0.5, 0.8), "2": (0.6, 0.6)})))
    cr.main(["compare", "--predicted", str(pred_path), "--summary", str(summary), "--out", str(cmp_path)])
    rows = json.loads(cmp_path.read_text())["rows"]
    assert rows["contradiction"]["measured"]["mean"] == pytest.approx(0.4 / 3)
    assert rows["pooled"]["measured_cells"] == 3
    assert rows["contradiction"]["difference_measured_minus_predicted"] == pytest.approx(0.4 / 3 - sum(d) / 2)
    summary.write_text(json.dumps({"runs": 0}))
    with pytest.raises(UserInputError, match="paired_C_minus_A"):
        cr.main(["compare", "--predicted", str(pred_path), "--summary", str(summary), "--out", str(cmp_path)])
    with pytest.raises(UserInputError, match="complete 'params'"):
        cr.params_of({"params": {"lapse": 0.1}})


def test_predict_reports_every_system_against_the_baseline() -> None:
    p = CalibratedParams(lapse=0.1, entity_distraction=0.1, position=2.0, guess=0.3, false_cite_p=0.8)
    res = cr.predict(p, families=("contradiction",), seeds=(0,), n_tasks=20, systems=("A", "C", "C_support"))
    cell = res["cells"]["contradiction/0"]
    fam = res["by_family"]["contradiction"]
    assert set(cell) == {"A", "C", "C_support"}
    assert fam["C_support_minus_A"]["mean"] == pytest.approx(cell["C_support"] - cell["A"])
    assert fam["C_minus_A"]["mean"] == pytest.approx(cell["C"] - cell["A"])
    assert set(res["by_family"]["pooled"]) == {"C_minus_A", "C_support_minus_A"}
    with pytest.raises(UserInputError, match="baseline"):
        cr.predict(p, families=("contradiction",), seeds=(0,), n_tasks=20, systems=("A",))
