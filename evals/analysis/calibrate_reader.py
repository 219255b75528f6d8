"""A simulated reader calibrated to a real model: fit it to real traces, predict C − A, compare.

The synthetic benchmark's reader (:mod:`evals.harness.reader`) rests on assumptions: a distraction per
irrelevant memory, which memory it believes when several disagree (position or recency), how often a
guess is right, how it cites. This script measures them on a real model instead.

``fit``: every answered or failed ask of the given trace files is rebuilt as the reader's input. The
task id names the world (``contradiction-0-t0001``); the world is rebuilt (``make_world`` with the
``--tasks`` candidates, the first whose task has the trace's question and whose facts hold every served
text), each served memory is mapped to the world fact with its exact text and its ``valid from`` date
(the hidden key, value and time), and the task's needed keys give a :class:`~evals.harness.reader.KeyContext`
per key. The parameters of :class:`~evals.harness.reader.CalibratedParams` maximise the likelihood of the
observed per-task successes under :func:`~evals.harness.reader.calibrated_success_p` (the very function
the simulator draws from) on a training split (task ids hashed, so the same task in several runs is on
one side); the held-out split reports per-task log-likelihood and Brier score against a constant
baseline (the training success rate) and the two hand-set readers (``first`` / ``latest``, distraction
0.05, chance-level guesses), plus a calibration table. The reported parameters are then refitted on
all asks, with 95% intervals from the observed information (Laplace). Citation rates are the observed
rates: ``cite_p`` of memories holding the answered value for the key, ``false_cite_p`` of the others.

``predict``: the synthetic protocol (:func:`evals.harness.runner.run`, the same worlds and systems as
the benchmark) with the calibrated reader, per family and seed; predicted C − A per family and pooled
with 95% t-intervals over seeds (the coin flips of the reader are part of that spread; parameter
uncertainty is added with ``--param-draws``: refits drawn from the Laplace approximation).

``compare``: predicted vs measured C − A per family (and pooled over cells) from a real study's
``summary.json`` (``evals.bench.run_llm_agent --summarize-only`` writes it).

    python -m evals.analysis.calibrate_reader fit traces/llm traces/llm_after_fixes traces/llm_aliases \\
        traces/llm_sorted_keys --out results/calibrated_reader/fit.json
    python -m evals.analysis.calibrate_reader predict --fit results/calibrated_reader/fit.json \\
        --out results/calibrated_reader/predicted.json
    python -m evals.analysis.calibrate_reader compare --predicted results/calibrated_reader/predicted.json \\
        --summary results/llm_study/summary.json --out results/calibrated_reader/comparison.json
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize

from evals.harness.families import make_world
from evals.harness.jsonio import write_json
from evals.harness.reader import (
    CalibratedParams,
    KeyContext,
    ReaderParams,
    calibrated_success_p,
    key_context,
)
from evals.harness.runner import run
from evals.harness.stats import estimate
from evals.harness.systems import load_systems
from evals.harness.world import Fact, Task, World, WorldParams, key_name
from remem_agent.agent.trace import load_traces, trace_stem
from remem_agent.errors import UserInputError
from remem_agent.trace_io import files_of

log = logging.getLogger("remem_agent.evals.calibrate_reader")

DEFAULT_TRACES = ("traces/llm", "traces/llm_after_fixes", "traces/llm_aliases", "traces/llm_sorted_keys")
STUDY_FAMILIES = ("contradiction", "state_change", "distractor")
PROB_FIELDS = ("lapse", "distraction", "entity_distraction", "guess")
REAL_FIELDS = ("position", "recency")
BLIND = "blind_guess"
MIN_BLIND = 20  # asks with a key and no relevant memory served needed to fit blind_guess (else chance level)
EPS = 1e-6
_TID = re.compile(r"(.+)-(\d+)-t\d+")
_LINE = re.compile(r"^\[(?:m:)?([^\]]+)\] \(valid from (\d{4}-\d{2}-\d{2})\)")


# ------------------------------------------------------------------------------------------ observations


@dataclass(frozen=True, kw_only=True)
class Observation:
    """One real ask rebuilt as the reader's input: the per-key contexts and whether the model succeeded."""

    source: str  # trace file
    task_id: str
    family: str
    system: str
    success: bool
    contexts: tuple[KeyContext, ...]
    n_irrelevant: int  # served memories about no needed key (the hand-set reader's distraction count)
    cited_used: int  # citations of memories holding the answered value for its key
    used: int
    cited_other: int
    other: int
    heldout: bool


@dataclass(frozen=True, kw_only=True)
class LoadReport:
    observations: tuple[Observation, ...]
    skipped: Mapping[str, int]  # reason -> count


@cache
def _world(family: str, seed: int, n_tasks: int) -> World:
    return make_world(family, seed, WorldParams(n_tasks=n_tasks))


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def _served_dates(rec: Mapping[str, Any]) -> dict[str, str]:
    """Memory id -> the ``valid from`` date the model was shown (from the rendered user message)."""
    aliases = rec.get("aliases") or {}
    out: dict[str, str] = {}
    for m in rec.get("messages") or []:
        if m.get("role") != "user":
            continue
        for line in str(m.get("content") or "").splitlines():
            hit = _LINE.match(line)
            if hit:
                out[str(aliases.get(hit.group(1), hit.group(1)))] = hit.group(2)
    return out


def _match(rec: Mapping[str, Any], world: World, at: float) -> list[Fact] | None:
    """The world facts behind the served memories, in served order (None when one does not map)."""
    by_text: dict[str, list[Fact]] = defaultdict(list)
    for f in world.facts():
        by_text[f.text].append(f)
    dates = _served_dates(rec)
    facts: list[Fact] = []
    for s in rec.get("served") or []:
        cands = [f for f in by_text.get(str(s.get("text") or ""), []) if f.t <= at]
        dated = [f for f in cands if _day(f.t) == dates.get(str(s.get("id")))]
        pool = dated or cands
        if not pool:
            return None
        facts.append(max(pool, key=lambda f: f.t))
    return facts


def _find_task(rec: Mapping[str, Any], n_tasks: Sequence[int]) -> tuple[World, Task, list[Fact]] | str:
    m = _TID.fullmatch(str(rec.get("task_id") or ""))
    if not m:
        return "no world task id"
    for n in n_tasks:
        try:
            world = _world(m.group(1), int(m.group(2)), n)
        except KeyError:
            return "unknown family"
        task = next((t for t in world.tasks() if t.tid == rec["task_id"]), None)
        if task is None or task.query != rec.get("question"):
            continue
        facts = _match(rec, world, task.t)
        if facts is not None:
            return world, task, facts
    return "world mismatch"


def _heldout(task_id: str, fraction: float) -> bool:
    h = hashlib.blake2b(task_id.encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2**64 < fraction


def _norm(v: object) -> str:
    return str(v or "").strip().lower()


def observe(
    rec: Mapping[str, Any], source: str, world: World, task: Task, facts: Sequence[Fact], *, holdout: float
) -> Observation:
    """The :class:`Observation` of one trace line whose world, task and served facts are known."""
    asked_at = task.as_of if task.as_of is not None else task.t
    contexts = tuple(
        key_context(
            k,
            task.truth.get(key_name(k)),
            facts,
            asked_at,
            n_values=len(world.domains.get(k[1], ())),
            needed=task.needs,
        )
        for k in task.needs
    )
    needed = set(task.needs)
    answer = rec.get("answer") if isinstance(rec.get("answer"), Mapping) else {}
    assert isinstance(answer, Mapping)
    ids = [str(s.get("id")) for s in rec.get("served") or []]
    used = {
        i
        for i, f in zip(ids, facts, strict=True)
        if f.key in needed and f.value is not None and _norm(answer.get(key_name(f.key))) == _norm(f.value)
    }
    cited = set(rec.get("citations") or []) & set(ids)
    outcome = rec.get("outcome") or {}
    return Observation(
        source=source,
        task_id=str(rec["task_id"]),
        family=world.family,
        system=str(rec.get("system") or trace_stem(source).rsplit("_", 1)[-1]),
        success=bool(outcome.get("success")) and not rec.get("error"),
        contexts=contexts,
        n_irrelevant=sum(f.key not in needed for f in facts),
        cited_used=len(cited & used),
        used=len(used),
        cited_other=len(cited - used),
        other=len(set(ids) - used),
        heldout=_heldout(str(rec["task_id"]), holdout),
    )


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """``paths`` with every folder replaced by its trace files (``*.jsonl``, ``*.jsonl.gz``; sorted)."""
    given = [Path(p) for p in paths]
    for p in given:
        if not p.exists():
            raise UserInputError(f"no trace file or folder {p}")
    out = files_of(given)
    if not out:
        raise UserInputError("no trace files given")
    return out


def load(paths: Iterable[str | Path], *, n_tasks: Sequence[int] = (40, 60), holdout: float = 0.3) -> LoadReport:
    """Every ``ask`` line of the traces as an :class:`Observation`; lines that cannot be rebuilt are counted."""
    obs: list[Observation] = []
    skipped: dict[str, int] = defaultdict(int)
    for path in trace_files(paths):
        for rec in load_traces(path, kind="ask"):
            found = _find_task(rec, n_tasks)
            if isinstance(found, str):
                skipped[found] += 1
                continue
            obs.append(observe(rec, str(path), *found, holdout=holdout))
    return LoadReport(observations=tuple(obs), skipped=dict(skipped))


# ------------------------------------------------------------------------------------------ likelihood


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def _logit(p: float) -> float:
    p = min(1 - EPS, max(EPS, p))
    return math.log(p / (1 - p))


def fitted_names(blind: bool) -> tuple[str, ...]:
    """The fitted parameters in vector order: probabilities (as logits) first, then position, recency."""
    return (*PROB_FIELDS, *((BLIND,) if blind else ()), *REAL_FIELDS)


def _is_prob(name: str) -> bool:
    return name not in REAL_FIELDS


def to_params(theta: Sequence[float], base: CalibratedParams, names: Sequence[str]) -> CalibratedParams:
    """Unconstrained vector (logits of the probabilities, then position and recency) -> parameters."""
    vals = {n: _sigmoid(float(x)) if _is_prob(n) else float(x) for n, x in zip(names, theta, strict=True)}
    return CalibratedParams(**{**asdict(base), **vals})


def to_theta(p: CalibratedParams, names: Sequence[str]) -> list[float]:
    out = []
    for n in names:
        v = getattr(p, n)
        out.append(_logit(0.1 if v is None else v) if _is_prob(n) else float(v))
    return out


def _clip(p: float) -> float:
    return min(1 - EPS, max(EPS, p))


def log_lik(p_success: float, success: bool) -> float:
    q = _clip(p_success)
    return math.log(q if success else 1 - q)


Grouped = tuple[tuple[tuple[KeyContext, ...], int, int], ...]
"""Distinct contexts with their success and failure counts (the likelihood depends on nothing else)."""


def grouped(obs: Sequence[Observation]) -> Grouped:
    """``obs`` collapsed to distinct contexts (hundreds of asks share a few dozen contexts: a fast fit)."""
    acc: dict[tuple[KeyContext, ...], list[int]] = defaultdict(lambda: [0, 0])
    for o in obs:
        acc[o.contexts][0 if o.success else 1] += 1
    return tuple((ctx, wins, losses) for ctx, (wins, losses) in acc.items())


def nll(
    theta: Sequence[float],
    obs: Grouped,
    base: CalibratedParams,
    prior_sd: float = 0.0,
    names: Sequence[str] = fitted_names(False),
) -> float:
    """Negative log-likelihood of the grouped ``obs`` at ``theta``, plus a Gaussian penalty when ``prior_sd`` > 0.

    The penalty (a N(0, prior_sd^2) prior on every unconstrained parameter: log-odds and logits) keeps
    weakly identified parameters finite. Without it, a handful of contexts (a stale memory served first)
    drive ``guess`` to ~1e-5 and ``position``/``recency`` to their bounds, and one held-out success in such a
    context then costs ~12 nats (measured on the pre-study traces; see fit.json's ``prior_sd``).
    """
    try:
        p = to_params(theta, base, names)
    except ValueError:
        return math.inf
    penalty = sum(float(x) ** 2 for x in theta) / (2 * prior_sd**2) if prior_sd > 0 else 0.0
    total = 0.0
    for ctx, wins, losses in obs:
        q = _clip(calibrated_success_p(ctx, p))
        total += wins * math.log(q) + losses * math.log(1 - q)
    return penalty - total


def handset_success_p(o: Observation, mode: str, distraction: float = 0.05) -> float:
    """Success probability of the hand-set reader (``first`` / ``latest``, chance-level guesses) on ``o``."""
    keep = max(0.0, 1 - distraction * o.n_irrelevant)
    prob = 1.0
    for ctx in o.contexts:
        chance = ctx.chance
        if not ctx.relevant_ranks:
            prob *= chance
            continue
        if mode == "first":
            right = ctx.relevant_correct[0]
        else:  # latest: the most recent relevant memory (served order breaks ties, like max())
            right = next(ok for ok, lt in zip(ctx.relevant_correct, ctx.latest, strict=True) if lt)
        prob *= keep * float(right) + (1 - keep) * chance
    return prob


def citation_rates(obs: Sequence[Observation]) -> tuple[float, float]:
    """Observed (cite_p, false_cite_p): citation rate of the memories used, and of all others."""
    used = sum(o.used for o in obs)
    other = sum(o.other for o in obs)
    cite_p = sum(o.cited_used for o in obs) / used if used else CalibratedParams().cite_p
    false_p = sum(o.cited_other for o in obs) / other if other else CalibratedParams().false_cite_p
    return cite_p, false_p


@dataclass(frozen=True, kw_only=True)
class Fit:
    params: CalibratedParams
    theta: tuple[float, ...]
    names: tuple[str, ...]
    nll: float  # at the optimum, penalty included
    n: int
    converged: bool
    prior_sd: float


STARTS = (
    CalibratedParams(lapse=0.1, distraction=0.05, entity_distraction=0.05, position=0.0, recency=0.0, guess=0.05),
    CalibratedParams(lapse=0.3, distraction=0.01, entity_distraction=0.2, position=1.0, recency=1.0, guess=0.2),
    CalibratedParams(lapse=0.05, distraction=0.1, entity_distraction=0.01, position=-0.5, recency=2.0, guess=0.01),
)


def fit(obs: Sequence[Observation], *, prior_sd: float = 2.0) -> Fit:
    """Penalised maximum-likelihood :class:`CalibratedParams` over ``obs`` (best of a few starts; L-BFGS-B).

    ``prior_sd=0`` is the plain maximum-likelihood fit (see :func:`nll` for why the default is not).
    """
    if not obs:
        raise UserInputError("no observations to fit")
    cite_p, false_p = citation_rates(obs)
    base = CalibratedParams(cite_p=cite_p, false_cite_p=false_p)
    names = fitted_names(blind_contexts(obs) >= MIN_BLIND)
    groups = grouped(obs)
    best: Any = None

    def objective(theta: np.ndarray) -> float:
        return nll([float(x) for x in theta], groups, base, prior_sd, names)

    for start in STARTS:
        res = minimize(
            objective,
            np.array(to_theta(start, names)),
            method="L-BFGS-B",
            bounds=[(-14.0, 14.0) if _is_prob(n) else (-10.0, 10.0) for n in names],
        )
        if best is None or res.fun < best.fun:
            best = res
    theta = tuple(float(x) for x in best.x)
    return Fit(
        params=to_params(theta, base, names),
        theta=theta,
        names=names,
        nll=float(best.fun),
        n=len(obs),
        converged=bool(best.success),
        prior_sd=prior_sd,
    )


def blind_contexts(obs: Sequence[Observation]) -> int:
    """Asks with a needed key for which no relevant memory was served (what ``blind_guess`` is fitted on)."""
    return sum(any(not c.relevant_ranks for c in o.contexts) for o in obs)


def hessian(f: Any, x: Sequence[float], h: float = 1e-3) -> np.ndarray:
    """Central-difference Hessian of ``f`` at ``x`` (the observed information of a negative log-likelihood)."""
    x0 = np.array(x, dtype=float)
    n = len(x0)
    hess = np.zeros((n, n))
    for i in range(n):
        for j in range(i, n):
            ei, ej = np.eye(n)[i] * h, np.eye(n)[j] * h
            v = (f(x0 + ei + ej) - f(x0 + ei - ej) - f(x0 - ei + ej) + f(x0 - ei - ej)) / (4 * h * h)
            hess[i, j] = hess[j, i] = v
    return hess


def laplace_cov(obs: Sequence[Observation], fitted: Fit) -> np.ndarray | None:
    """Covariance of the unconstrained parameters (inverse observed information), None if singular."""
    groups = grouped(obs)
    hess = hessian(lambda t: nll(t, groups, fitted.params, fitted.prior_sd, fitted.names), fitted.theta)
    try:
        cov = np.linalg.inv(hess)
    except np.linalg.LinAlgError:
        return None
    return cov if np.all(np.isfinite(cov)) and np.all(np.diag(cov) > 0) else None


def param_intervals(fitted: Fit, cov: np.ndarray | None) -> dict[str, dict[str, float | None]]:
    """Each fitted parameter with a 95% Wald interval on the unconstrained scale, mapped back."""
    out: dict[str, dict[str, float | None]] = {}
    for i, name in enumerate(fitted.names):
        est = float(getattr(fitted.params, name))
        lo = hi = None
        if cov is not None:
            se = math.sqrt(float(cov[i, i]))
            a, b = fitted.theta[i] - 1.96 * se, fitted.theta[i] + 1.96 * se
            lo, hi = (_sigmoid(a), _sigmoid(b)) if _is_prob(name) else (a, b)
        out[name] = {"estimate": est, "ci95_low": lo, "ci95_high": hi}
    return out


# ------------------------------------------------------------------------------------------- reporting


def scores(ps: Sequence[float], ys: Sequence[bool]) -> dict[str, float]:
    n = len(ps)
    if not n:
        return {"n": 0}
    ll = sum(log_lik(p, y) for p, y in zip(ps, ys, strict=True))
    brier = sum((p - y) ** 2 for p, y in zip(ps, ys, strict=True)) / n
    return {"n": n, "log_lik_per_task": ll / n, "brier": brier}


def calibration_table(ps: Sequence[float], ys: Sequence[bool], bins: int = 5) -> list[dict[str, float]]:
    """Predicted-probability bins of equal width: count, mean predicted, observed success rate."""
    rows = []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        sel = [(p, y) for p, y in zip(ps, ys, strict=True) if lo <= p < hi or (b == bins - 1 and p == 1.0)]
        if sel:
            rows.append(
                {
                    "bin_low": lo,
                    "bin_high": hi,
                    "n": len(sel),
                    "mean_predicted": sum(p for p, _ in sel) / len(sel),
                    "observed": sum(y for _, y in sel) / len(sel),
                }
            )
    return rows


def _groups(obs: Sequence[Observation], p: CalibratedParams) -> dict[str, dict[str, float]]:
    """Observed success vs mean predicted probability per trace folder x family x system (in sample)."""
    acc: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for o in obs:
        acc[f"{Path(o.source).parent.name}/{o.family}/{o.system}"].append(
            (calibrated_success_p(o.contexts, p), o.success)
        )
    return {
        k: {"n": len(v), "observed": sum(y for _, y in v) / len(v), "mean_predicted": sum(q for q, _ in v) / len(v)}
        for k, v in sorted(acc.items())
    }


def fit_report(report: LoadReport, *, holdout: float, sources: Sequence[str], prior_sd: float = 2.0) -> dict[str, Any]:
    """Train/held-out fit with its scores, then the all-asks refit with intervals: ``fit.json``'s content."""
    obs = report.observations
    train = [o for o in obs if not o.heldout]
    test = [o for o in obs if o.heldout]
    if not train or not test:
        raise UserInputError(f"the split left {len(train)} training and {len(test)} held-out asks; give more traces")
    train_fit = fit(train, prior_sd=prior_sd)
    mle = fit(train, prior_sd=0.0)
    base_rate = sum(o.success for o in train) / len(train)
    ys = [o.success for o in test]
    pred = [calibrated_success_p(o.contexts, train_fit.params) for o in test]
    heldout = {
        "calibrated": scores(pred, ys),
        "calibrated_unpenalised": scores([calibrated_success_p(o.contexts, mle.params) for o in test], ys)
        | {"params": asdict(mle.params)},
        "constant": scores([base_rate] * len(test), ys) | {"p": base_rate},
        "handset_first": scores([handset_success_p(o, "first") for o in test], ys),
        "handset_latest": scores([handset_success_p(o, "latest") for o in test], ys),
        "calibration_table": calibration_table(pred, ys),
        "observed_success": sum(ys) / len(ys),
        "mean_predicted": sum(pred) / len(pred),
    }
    full = fit(obs, prior_sd=prior_sd)
    cov = laplace_cov(obs, full)
    return {
        "traces": list(sources),
        "asks": len(obs),
        "skipped": dict(report.skipped),
        "prior_sd": prior_sd,
        "split": {"heldout_fraction": holdout, "by": "hash of task_id", "train": len(train), "heldout": len(test)},
        "train_fit": {"params": asdict(train_fit.params), "nll": train_fit.nll, "converged": train_fit.converged},
        "heldout": heldout,
        "params": asdict(full.params),
        "theta": list(full.theta),
        "theta_names": list(full.names),
        "blind_contexts": blind_contexts(obs),
        "cov": None if cov is None else cov.tolist(),
        "intervals": param_intervals(full, cov),
        "nll": full.nll,
        "converged": full.converged,
        "in_sample_by_group": _groups(obs, full.params),
        "model": "see evals.harness.reader.CalibratedParams",
    }


def params_of(fit_json: Mapping[str, Any]) -> CalibratedParams:
    names = {f.name for f in fields(CalibratedParams)}
    raw = fit_json.get("params")
    if not isinstance(raw, Mapping) or set(raw) != names:
        raise UserInputError(f"fit file has no complete 'params' ({sorted(names)})")
    vals = {k: float(v) for k, v in raw.items() if k != BLIND}
    blind = raw[BLIND]
    return replace(CalibratedParams(**vals), blind_guess=None if blind is None else float(blind))


# ------------------------------------------------------------------------------------------- predict


def code_state(root: Path | None = None) -> dict[str, Any]:
    """The commit the simulation ran on and whether ``remem_agent``/``evals`` had uncommitted changes.

    The predicted C − A depends on the ranking code; a prediction made from a dirty tree is not
    reproducible from its commit, so the output says which it was (None outside a git checkout).
    """
    import subprocess

    cwd = root or Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "remem_agent", "evals"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def _cell(family: str, seed: int, n_tasks: int, systems: Sequence[str], p: CalibratedParams) -> dict[str, float]:
    specs = load_systems()
    world = make_world(family, seed, WorldParams(n_tasks=n_tasks))
    reader = ReaderParams(mode="calibrated", calibrated=p)
    return {s: run(world, specs[s], reader).success for s in systems}


def _summarise(
    cells: Mapping[tuple[str, int], Mapping[str, float]], families: Sequence[str], systems: Sequence[str] = ("A", "C")
) -> dict[str, Any]:
    """Per family: each system's success and each other system's paired difference to ``systems[0]``."""
    base, others = systems[0], systems[1:]
    out: dict[str, Any] = {}
    for fam in families:
        cs = [c for (f, _), c in sorted(cells.items()) if f == fam]
        out[fam] = {f"success_{s}": estimate([c[s] for c in cs]).to_dict() for s in systems} | {
            f"{s}_minus_{base}": estimate([c[s] - c[base] for c in cs]).to_dict() for s in others
        }
    out["pooled"] = {f"{s}_minus_{base}": estimate([c[s] - c[base] for c in cells.values()]).to_dict() for s in others}
    return out


def predict(
    p: CalibratedParams,
    *,
    families: Sequence[str] = STUDY_FAMILIES,
    seeds: Sequence[int] = tuple(range(10)),
    n_tasks: int = 60,
    draws: Sequence[CalibratedParams] = (),
    systems: Sequence[str] = ("A", "C"),
) -> dict[str, Any]:
    """Synthetic protocol with the calibrated reader per (family, seed); X − A per family and pooled.

    ``systems[0]`` is the baseline (A); the comparison with a real study reads ``C_minus_A``.
    """
    if len(systems) < 2:
        raise UserInputError("predict needs a baseline and at least one other system")
    cells = {(f, s): _cell(f, s, n_tasks, systems, p) for f in families for s in seeds}
    res: dict[str, Any] = {
        "families": list(families),
        "seeds": list(seeds),
        "n_tasks": n_tasks,
        "systems": list(systems),
        "params": asdict(p),
        "cells": {f"{f}/{s}": c for (f, s), c in sorted(cells.items())},
        "by_family": _summarise(cells, families, systems),
    }
    if draws:
        per_draw = []
        for q in draws:
            dc = {(f, s): _cell(f, s, n_tasks, systems, q) for f in families for s in seeds}
            per_draw.append(_summarise(dc, families, systems))
        diffs = [f"{s}_minus_{systems[0]}" for s in systems[1:]]
        res["param_draws"] = {"n": len(draws)} | {
            k: _draw_summary([d[k]["C_minus_A"]["mean"] for d in per_draw], res["by_family"][k]["C_minus_A"])
            for k in (*families, "pooled")
            if "C_minus_A" in diffs
        }
    return res


def _draw_summary(means: Sequence[float], seed_est: Mapping[str, Any]) -> dict[str, Any]:
    """Spread of the predicted C − A over parameter draws, and an interval combining it with the seeds'.

    ``combined_ci95``: sqrt(seed half width^2 + (1.96 x draw sd)^2), a normal approximation that treats the
    reader's coin flips and world seeds (the t-interval) and the parameter uncertainty as independent.
    """
    sd = statistics.stdev(means) if len(means) > 1 else math.nan
    hw = float(seed_est.get("ci95") or math.nan)
    return {
        "means": list(means),
        "sd": sd,
        "percentile_2_5": float(np.percentile(means, 2.5)),
        "percentile_97_5": float(np.percentile(means, 97.5)),
        "combined_ci95": math.sqrt(hw**2 + (1.96 * sd) ** 2),
    }


def draw_params(fit_json: Mapping[str, Any], n: int, seed: int = 0) -> list[CalibratedParams]:
    """``n`` parameter vectors from the Laplace approximation of the fit (empty when it has no covariance)."""
    cov = fit_json.get("cov")
    if not n or cov is None:
        return []
    base = params_of(fit_json)
    rng = np.random.default_rng(seed)
    thetas = rng.multivariate_normal(np.array(fit_json["theta"], dtype=float), np.array(cov, dtype=float), size=n)
    names = [str(n) for n in fit_json.get("theta_names") or fitted_names(base.blind_guess is not None)]
    return [to_params(list(t), base, names) for t in thetas]


# ------------------------------------------------------------------------------------------- compare


def _measured(summary: Mapping[str, Any], families: Sequence[str]) -> dict[str, Any]:
    pairs = summary.get("paired_C_minus_A")
    if not isinstance(pairs, Mapping):
        raise UserInputError("summary has no 'paired_C_minus_A' (is it evals.bench.run_llm_agent's summary.json?)")
    out: dict[str, Any] = {}
    cells: list[float] = []
    for fam in families:
        entry = pairs.get(fam)
        if not isinstance(entry, Mapping):
            continue
        ds = [float(v["success_C"]) - float(v["success_A"]) for v in (entry.get("per_seed") or {}).values()]
        cells += ds
        out[fam] = {"C_minus_A": dict(entry["success"]), "cells": len(ds)}
    out["pooled"] = {"C_minus_A": estimate(cells).to_dict(), "cells": len(cells)}
    return out


def _inside(x: float, est: Mapping[str, Any]) -> bool | None:
    hw = est.get("ci95")
    if hw is None or (isinstance(hw, float) and math.isnan(hw)):
        return None
    return bool(abs(x - float(est["mean"])) <= float(hw))


def compare(predicted: Mapping[str, Any], summary: Mapping[str, Any]) -> dict[str, Any]:
    """Predicted vs measured C − A per family and pooled: means, intervals, and whether each covers the other."""
    families = list(predicted.get("families") or [])
    measured = _measured(summary, families)
    rows: dict[str, Any] = {}
    for key in (*families, "pooled"):
        if key not in measured or key not in predicted.get("by_family", {}):
            continue
        pe = predicted["by_family"][key]["C_minus_A"]
        me = measured[key]["C_minus_A"]
        combined = (predicted.get("param_draws") or {}).get(key, {}).get("combined_ci95")
        rows[key] = {
            "predicted": pe,
            "predicted_combined_ci95": combined,
            "measured_mean_in_predicted_combined_ci": None
            if combined is None
            else _inside(float(me["mean"]), {"mean": pe["mean"], "ci95": combined}),
            "measured": me,
            "measured_cells": measured[key]["cells"],
            "difference_measured_minus_predicted": float(me["mean"]) - float(pe["mean"]),
            "measured_mean_in_predicted_ci": _inside(float(me["mean"]), pe),
            "predicted_mean_in_measured_ci": _inside(float(pe["mean"]), me),
        }
    return {"families": families, "rows": rows}


# ------------------------------------------------------------------------------------------- CLI


def _ints(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, (x.strip() for x in text.split(","))):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return out


def _read_json(path: str) -> Any:
    import json

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserInputError(f"cannot read {path}: {exc}") from exc


def _fmt(e: Mapping[str, Any]) -> str:
    hw = e.get("ci95")
    s = f"{100 * float(e['mean']):+.1f}"
    return s if hw is None or (isinstance(hw, float) and math.isnan(hw)) else f"{s} ± {100 * float(hw):.1f}"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m evals.analysis.calibrate_reader", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="fit the calibrated reader to trace files or folders")
    f.add_argument("traces", nargs="*", default=list(DEFAULT_TRACES))
    f.add_argument("--out", default="results/calibrated_reader/fit.json")
    f.add_argument("--tasks", default="40,60", help="n_tasks of the worlds the traces may come from (tried in order)")
    f.add_argument("--holdout", type=float, default=0.3, help="held-out fraction (by task id)")
    f.add_argument("--prior-sd", type=float, default=2.0, help="N(0, sd^2) penalty on the logits; 0: plain MLE")
    p = sub.add_parser("predict", help="run the synthetic protocol with the fitted reader")
    p.add_argument("--fit", default="results/calibrated_reader/fit.json")
    p.add_argument("--out", default="results/calibrated_reader/predicted.json")
    p.add_argument("--families", default=",".join(STUDY_FAMILIES))
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--tasks", type=int, default=60)
    p.add_argument("--systems", default="A,C", help="baseline first (evals/harness/systems.yaml names)")
    p.add_argument("--param-draws", type=int, default=0, help="also rerun with N parameter draws (Laplace)")
    p.add_argument("--commit", default=None, help="record this commit (a clean export of it, not a checkout)")
    c = sub.add_parser("compare", help="predicted vs measured C − A from a real study's summary.json")
    c.add_argument("--predicted", default="results/calibrated_reader/predicted.json")
    c.add_argument("--summary", default="results/llm_study/summary.json")
    c.add_argument("--out", default="results/calibrated_reader/comparison.json")
    a = ap.parse_args(argv)
    if a.cmd == "fit":
        if not 0 < a.holdout < 1:
            raise UserInputError("--holdout must be in (0, 1)")
        rep = load(a.traces, n_tasks=_ints(a.tasks), holdout=a.holdout)
        res = fit_report(rep, holdout=a.holdout, sources=a.traces, prior_sd=a.prior_sd)
        write_json(a.out, res)
        h = res["heldout"]
        split = res["split"]
        print(f"{res['asks']} asks ({split['train']} train, {split['heldout']} held out); skipped {res['skipped']}")
        for k in ("calibrated", "calibrated_unpenalised", "constant", "handset_first", "handset_latest"):
            print(f"  held-out {k:<23} log-lik/task {h[k]['log_lik_per_task']:.4f}  Brier {h[k]['brier']:.4f}")
        for name, iv in res["intervals"].items():
            lo, hi = iv["ci95_low"], iv["ci95_high"]
            ci = "" if lo is None else f"  [{lo:.3f}, {hi:.3f}]"
            print(f"  {name:<19}{iv['estimate']:.3f}{ci}")
        print(f"wrote {a.out}")
    elif a.cmd == "predict":
        fj = _read_json(a.fit)
        res = predict(
            params_of(fj),
            families=[x for x in a.families.split(",") if x],
            seeds=_ints(a.seeds),
            n_tasks=a.tasks,
            draws=draw_params(fj, a.param_draws),
            systems=[x for x in a.systems.split(",") if x],
        )
        res["fit"] = a.fit
        res["code"] = code_state() if a.commit is None else {"commit": a.commit, "dirty": False}
        write_json(a.out, res)
        for k, v in res["by_family"].items():
            for name, est in v.items():
                if "_minus_" in name:
                    print(f"  predicted {name.replace('_minus_', ' − ')} {k:<14}{_fmt(est)} pp")
        print(f"wrote {a.out}")
    else:
        res = compare(_read_json(a.predicted), _read_json(a.summary))
        res |= {"predicted_file": a.predicted, "summary_file": a.summary}
        write_json(a.out, res)
        for k, v in res["rows"].items():
            print(f"  {k:<14} predicted {_fmt(v['predicted'])}  measured {_fmt(v['measured'])} pp")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
