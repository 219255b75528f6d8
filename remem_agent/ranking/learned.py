"""A utility model fitted to the ledger's outcomes: L2-regularised logistic regression.

Model. On standardised features ``s_j = (x_j - mean_j) / std_j`` (mean/std of the training rows; a
constant feature gets std 1, so it standardises to 0 and carries no weight)::

    p = sigmoid(b + sum_j w_j s_j)

Fit. Newton/IRLS on the penalised mean log-loss::

    J(w, b) = -(1/n) sum_i [y_i log p_i + (1 - y_i) log(1 - p_i)] + (lam/2) ||w||^2 + (eps/2) b^2

The intercept is effectively unpenalised (``eps = 1e-8``, only there so a training fold with a
single class has a finite optimum instead of ``b -> inf``). With ``lam > 0`` the objective is
strictly convex, so separable data still has a unique finite solution. Newton steps are damped by
a backtracking line search; the result is deterministic (no randomness in the fit; the k-fold
fallback uses a fixed seed).

Choosing lambda. Leave-one-group-out CV (groups are worlds/seeds, see ``traces.py``): for each
lambda, fit without one group and predict it; the CV log-loss is the mean over *all* held-out rows
(pooled, so big groups weigh more). The lowest CV log-loss wins; ties go to the larger lambda. With
a single group the fallback is stratified k-fold by rows (rows of one search can then land on both
sides of a split, which flatters the CV numbers a little; prefer several worlds/seeds).

Scoring. ``score`` returns ``p`` plus per-feature components ``w_j * s_j`` (and ``intercept``) so
``search(..., explain=True)`` shows why a memory ranked where it did, and an exploration term:

* ``explore="ucb"`` (default): ``+ explore_c * post_std`` as in ``HeuristicUtility`` (c = 0.1);
* ``explore="thompson"``: ``+ N(0, post_std^2)`` noise from a seeded numpy Generator, a Gaussian
  stand-in for sampling each candidate's Beta posterior (reproducible for a given seed and call order);
* ``explore="none"``: the fitted probability as is.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import UserInputError
from remem_agent.ranking.features import FEATURE_NAMES, LEGACY_FEATURE_NAMES
from remem_agent.ranking.training import TrainingSet

Features = Mapping[str, NDArray[np.float64]]
Explore = Literal["ucb", "thompson", "none"]

FORMAT = "remem-agent/learned-utility"
FORMAT_VERSION = 1
DEFAULT_LAMBDAS: tuple[float, ...] = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0)
INTERCEPT_EPS = 1e-8
ECE_BINS = 10
_LOSS_CLIP = 1e-15


# -- metrics ------------------------------------------------------------------------------------------
def _auc(y: NDArray[np.int8], p: NDArray[np.float64]) -> float | None:
    """Rank-based AUC (Mann-Whitney U with average ranks for ties); None without both classes."""
    pos = int(y.sum())
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return None
    order = np.argsort(p, kind="mergesort")
    sp = p[order]
    ranks = np.empty(len(p), dtype=np.float64)
    i = 0
    while i < len(sp):
        j = i
        while j + 1 < len(sp) and sp[j + 1] == sp[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0  # average 1-based rank of the tie block
        i = j + 1
    u = float(ranks[y == 1].sum()) - pos * (pos + 1) / 2.0
    return u / (pos * neg)


def _log_loss(y: NDArray[Any], p: NDArray[np.float64]) -> float:
    q = np.clip(p, _LOSS_CLIP, 1.0 - _LOSS_CLIP)
    return float(-np.mean(y * np.log(q) + (1 - y) * np.log1p(-q)))


def metrics(y: Sequence[int] | NDArray[Any], p: Sequence[float] | NDArray[np.float64]) -> dict[str, float | None]:
    """AUC (rank-based, ties averaged; None with one class), Brier score, ECE (10 equal-width bins), log-loss."""
    yy = np.asarray(y, dtype=np.int8).reshape(-1)
    pp = np.asarray(p, dtype=np.float64).reshape(-1)
    if yy.shape != pp.shape:
        raise UserInputError(f"y and p differ in length: {yy.shape[0]} vs {pp.shape[0]}")
    if len(yy) == 0:
        return {"auc": None, "brier": None, "ece": None, "log_loss": None, "n": 0}
    bins = np.minimum((pp * ECE_BINS).astype(np.int64), ECE_BINS - 1)  # p = 1.0 goes in the last bin
    ece = 0.0
    for b in range(ECE_BINS):
        m = bins == b
        if m.any():
            ece += float(m.mean()) * abs(float(pp[m].mean()) - float(yy[m].mean()))
    return {
        "auc": _auc(yy, pp),
        "brier": float(np.mean((pp - yy) ** 2)),
        "ece": ece,
        "log_loss": _log_loss(yy, pp),
        "n": len(yy),
    }


# -- the fit ----------------------------------------------------------------------------------------
def _sigmoid(z: NDArray[np.float64]) -> NDArray[np.float64]:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -500.0, 500.0)))


def _standardise(X: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    mean = X.mean(axis=0)
    std = X.std(axis=0)
    std = np.where(std > 1e-12 * np.maximum(1.0, np.abs(mean)), std, 1.0)  # constant feature: weight stays 0
    return mean, std


def objective(
    w: NDArray[np.float64], b: float, S: NDArray[np.float64], y: NDArray[Any], lam: float
) -> tuple[float, NDArray[np.float64], float]:
    """Penalised mean log-loss J on standardised rows S, with its gradient (dJ/dw, dJ/db)."""
    z = S @ w + b
    # log(1 + e^z) - y z, computed stably
    loss = float(np.mean(np.logaddexp(0.0, z) - y * z))
    j = loss + 0.5 * lam * float(w @ w) + 0.5 * INTERCEPT_EPS * b * b
    r = (_sigmoid(z) - y) / len(y)
    return j, S.T @ r + lam * w, float(r.sum()) + INTERCEPT_EPS * b


def irls(
    S: NDArray[np.float64], y: NDArray[Any], lam: float, *, max_iter: int = 100, tol: float = 1e-10
) -> tuple[NDArray[np.float64], float, int]:
    """Minimise ``objective`` by damped Newton steps; returns (w, b, iterations)."""
    n, d = S.shape
    A = np.hstack([S, np.ones((n, 1))])
    pen = np.full(d + 1, lam)
    pen[d] = INTERCEPT_EPS
    theta = np.zeros(d + 1)
    yf = y.astype(np.float64)
    j, gw, gb = objective(theta[:d], 0.0, S, yf, lam)
    it = 0
    while it < max_iter:
        it += 1
        g = np.append(gw, gb)
        if float(np.max(np.abs(g))) < tol:
            break
        p = _sigmoid(A @ theta)
        wts = p * (1.0 - p) / n
        H = (A * wts[:, None]).T @ A + np.diag(pen)
        try:
            step = np.linalg.solve(H, g)
        except np.linalg.LinAlgError:
            step = np.linalg.lstsq(H, g, rcond=None)[0]
        t = 1.0
        while True:  # backtracking (Armijo) line search: never accept an increase of J
            cand = theta - t * step
            jc, gwc, gbc = objective(cand[:d], float(cand[d]), S, yf, lam)
            if jc <= j - 1e-4 * t * float(g @ step) or t < 1e-10:
                break
            t *= 0.5
        if jc > j:  # no descent left at machine precision: this is the optimum
            break
        theta, j, gw, gb = cand, jc, gwc, gbc
        if float(np.max(np.abs(t * step))) < tol:
            break
    return theta[:d].copy(), float(theta[d]), it


def fit_logistic(
    X: NDArray[np.float64], y: NDArray[Any], lam: float
) -> tuple[NDArray[np.float64], float, NDArray[np.float64], NDArray[np.float64]]:
    """An L2 logistic regression on ``X`` standardised by its own columns: (weights, intercept, mean, std); the
    logit of a row ``x`` is ``((x - mean) / std) @ weights + intercept``."""
    mean, std = _standardise(X)
    w, b, _ = irls((X - mean) / std, y, lam)
    return w, b, mean, std


def _logits(
    X: NDArray[np.float64], w: NDArray[np.float64], b: float, mean: NDArray[np.float64], std: NDArray[np.float64]
) -> NDArray[np.float64]:
    return np.asarray(((X - mean) / std) @ w + b, dtype=np.float64)


def _predict(
    X: NDArray[np.float64], w: NDArray[np.float64], b: float, mean: NDArray[np.float64], std: NDArray[np.float64]
) -> NDArray[np.float64]:
    return _sigmoid(_logits(X, w, b, mean, std))


def _folds(ts: TrainingSet, cv: str, k: int, seed: int) -> tuple[str, list[NDArray[np.bool_]]]:
    """Held-out masks: one per group, or stratified k-fold by rows when there is one group."""
    groups = ts.group_names
    if cv == "leave-one-group-out" and len(groups) >= 2:
        return "leave-one-group-out", [ts.groups == g for g in groups]
    if cv not in ("leave-one-group-out", "kfold"):
        raise UserInputError(f"cv must be 'leave-one-group-out' or 'kfold', got {cv!r}")
    n = len(ts)
    k = max(2, min(k, n))
    rng = np.random.default_rng(seed)
    fold = np.empty(n, dtype=np.int64)
    offset = 0
    for label in (1, 0):  # stratified: deal each class's shuffled rows round-robin
        idx = np.flatnonzero(ts.y == label)
        idx = idx[rng.permutation(len(idx))]
        fold[idx] = (np.arange(len(idx)) + offset) % k
        offset += len(idx)
    return f"kfold-{k}", [fold == f for f in range(k)]


def _check_lambdas(lambdas: Sequence[float]) -> tuple[float, ...]:
    out = tuple(float(x) for x in lambdas)
    if not out or any(not math.isfinite(x) or x <= 0 for x in out):
        raise UserInputError(f"lambdas must be a non-empty list of positive finite numbers, got {list(lambdas)}")
    return tuple(sorted(set(out)))


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x


class LearnedUtility:
    """P(memory contributes to a successful outcome | snapshot features), fitted from the ledger."""

    def __init__(
        self,
        weights: Sequence[float] | NDArray[np.float64],
        intercept: float,
        mean: Sequence[float] | NDArray[np.float64],
        std: Sequence[float] | NDArray[np.float64],
        *,
        feature_names: Sequence[str] = FEATURE_NAMES,
        lam: float = 1.0,
        report: Mapping[str, Any] | None = None,
        explore: Explore = "ucb",
        explore_c: float = 0.1,
        seed: int = 0,
        name: str = "learned",
    ) -> None:
        names = tuple(feature_names)
        arrays = [np.array(a, dtype=np.float64).reshape(-1) for a in (weights, mean, std)]
        if any(len(a) != len(names) for a in arrays):
            raise UserInputError(f"weights, mean and std must each have {len(names)} values (one per feature)")
        if not all(np.isfinite(a).all() for a in arrays) or not math.isfinite(intercept) or (arrays[2] <= 0).any():
            raise UserInputError("weights, intercept and mean must be finite and std positive")
        if explore not in ("ucb", "thompson", "none"):
            raise UserInputError(f"explore must be 'ucb', 'thompson' or 'none', got {explore!r}")
        for a in arrays:
            a.flags.writeable = False
        self.weights, self.mean, self.std = arrays
        self.intercept = float(intercept)
        self.feature_names = names
        self.lam = float(lam)
        self.report: dict[str, Any] = dict(report or {})
        self.explore: Explore = explore
        self.explore_c = float(explore_c)
        self.seed = int(seed)
        self.name = name
        self._rng = np.random.default_rng(self.seed)
        self._rng_lock = threading.Lock()

    # -- fitting ------------------------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        ts: TrainingSet,
        lambdas: Sequence[float] = DEFAULT_LAMBDAS,
        cv: str = "leave-one-group-out",
        *,
        k: int = 5,
        seed: int = 0,
        explore: Explore = "ucb",
        explore_c: float = 0.1,
    ) -> LearnedUtility:
        """Fit on ``ts``, choosing lambda by CV log-loss; ``report`` holds the training diagnostics."""
        grid = _check_lambdas(lambdas)
        n = len(ts)
        pos = ts.positives
        if n == 0 or pos == 0 or pos == n:
            raise UserInputError(
                f"need rows with both labels to fit (got {n} rows, {pos} positive); run more searches with feedback"
            )
        if not np.isfinite(ts.X).all():
            raise UserInputError("training features must be finite")
        X, y = ts.X, ts.y.astype(np.float64)
        scheme, masks = _folds(ts, cv, k, seed)
        oof = {lam: np.empty(n) for lam in grid}
        for held in masks:
            train = ~held
            for lam in grid:
                w, b, mean, std = fit_logistic(X[train], y[train], lam)
                oof[lam][held] = _predict(X[held], w, b, mean, std)
        cv_loss = {lam: _log_loss(y, oof[lam]) for lam in grid}
        best = min(grid, key=lambda lam: (round(cv_loss[lam], 12), -lam))  # ties: the larger lambda
        w, b, mean, std = fit_logistic(X, y, best)
        in_sample = _predict(X, w, b, mean, std)
        report = {
            "n": n,
            "positives": pos,
            "groups": list(ts.group_names),
            "cv": scheme,
            "folds": len(masks),
            "lambda": best,
            "cv_log_loss": [{"lambda": lam, "log_loss": cv_loss[lam]} for lam in grid],
            "in_sample": metrics(ts.y, in_sample),
            "cv_metrics": metrics(ts.y, oof[best]),
            "weights": {nm: float(v) for nm, v in zip(ts.feature_names, w, strict=True)},
        }
        return cls(
            w,
            b,
            mean,
            std,
            feature_names=ts.feature_names,
            lam=best,
            report=_jsonable(report),
            explore=explore,
            explore_c=explore_c,
            seed=seed,
        )

    # -- scoring ------------------------------------------------------------------------------------
    def logits(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """The model's ``z`` for rows of ``X`` (columns in ``feature_names`` order): the log-odds :meth:`predict`
        squashes."""
        return _logits(np.asarray(X, dtype=np.float64), self.weights, self.intercept, self.mean, self.std)

    def predict(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """The fitted probability for rows of ``X`` (columns in ``feature_names`` order), no exploration."""
        return _predict(np.asarray(X, dtype=np.float64), self.weights, self.intercept, self.mean, self.std)

    def score(self, features: Features) -> tuple[NDArray[np.float64], dict[str, NDArray[np.float64]]]:
        missing = [nm for nm in self.feature_names if nm not in features]
        if missing:
            raise UserInputError(f"features missing for the learned utility: {missing}")
        cols = [np.asarray(features[nm], dtype=np.float64) for nm in self.feature_names]
        n = len(cols[0]) if cols else 0
        comps: dict[str, NDArray[np.float64]] = {}
        z = np.full(n, self.intercept)
        for j, (nm, col) in enumerate(zip(self.feature_names, cols, strict=True)):
            c = self.weights[j] * (col - self.mean[j]) / self.std[j]
            comps[nm] = c
            z = z + c
        comps["intercept"] = np.full(n, self.intercept)
        p = _sigmoid(z)
        post_std = np.asarray(features["post_std"], dtype=np.float64) if "post_std" in features else np.zeros(n)
        if self.explore == "ucb":
            bonus = self.explore_c * post_std
        elif self.explore == "thompson":
            with self._rng_lock:
                bonus = self._rng.normal(0.0, 1.0, size=n) * post_std
        else:
            bonus = np.zeros(n)
        comps["explore"] = bonus
        return np.clip(p + bonus, 0.0, 1.0), comps

    # -- persistence --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "feature_names": list(self.feature_names),
            "weights": [float(v) for v in self.weights],
            "intercept": self.intercept,
            "mean": [float(v) for v in self.mean],
            "std": [float(v) for v in self.std],
            "lambda": self.lam,
            "explore": self.explore,
            "explore_c": self.explore_c,
            "seed": self.seed,
            "report": _jsonable(self.report),
        }

    def save(self, path: str | Path) -> Path:
        """Write the model as JSON (atomically: a crash leaves the old file or the new one)."""
        target = Path(path).expanduser()
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self.to_dict(), fh, indent=1, allow_nan=False)
                fh.write("\n")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    @classmethod
    def load(cls, path: str | Path, *, feature_names: Sequence[str] = FEATURE_NAMES) -> LearnedUtility:
        """Read a saved model; refuses other feature sets and newer format versions (UserInputError)."""
        p = Path(path).expanduser()
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UserInputError(f"cannot read learned utility {p}: {exc}") from exc
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise UserInputError(f"{p} is not a saved remem-agent learned utility")
        version = d.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
            raise UserInputError(
                f"{p} has format version {version!r}; this remem-agent reads up to {FORMAT_VERSION} (upgrade it)"
            )
        names = tuple(d.get("feature_names") or ())
        # A model fitted before the lexical channel scores by name on the features it knows (all still
        # computed): it ranks a hybrid pool by cosine and the rest, ignoring the fused score.
        if names != tuple(feature_names) and not (
            tuple(feature_names) == FEATURE_NAMES and names == LEGACY_FEATURE_NAMES
        ):
            raise UserInputError(
                f"{p} was trained on features {list(names)}, but this remem-agent computes {list(feature_names)}; "
                "retrain it on the current features"
            )
        try:
            return cls(
                d["weights"],
                float(d["intercept"]),
                d["mean"],
                d["std"],
                feature_names=names,
                lam=float(d["lambda"]),
                report=d.get("report") or {},
                explore=d.get("explore", "ucb"),
                explore_c=float(d.get("explore_c", 0.1)),
                seed=int(d.get("seed", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, UserInputError):
                raise
            raise UserInputError(f"{p} is malformed: {exc!r}") from exc

    def __repr__(self) -> str:
        return f"LearnedUtility(lambda={self.lam:g}, features={len(self.feature_names)}, explore={self.explore!r})"


__all__ = ["DEFAULT_LAMBDAS", "FORMAT_VERSION", "LearnedUtility", "metrics", "objective"]
