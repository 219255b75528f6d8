"""Training rows for the learned utility, read from the ledger's answered searches.

Every search records, per served memory, the feature snapshot ``f`` taken at retrieval time (in
``FEATURE_NAMES`` order); every feedback appends one ``credits`` row per served memory. One row
here is one (answered search, served memory) pair:

* ``X``: the snapshot ``f`` (what the ranker saw when it decided, not today's features);
* ``y``: 1 when the search's task succeeded *and* the memory's attributed credit is >= 0.5
  (reference design: "attributed credit >= 0.5 on a successful task"), else 0. Labels are
  *observed* attributions (cited/used signals), never ground truth, and only served memories
  get one (bandit feedback: what was never shown has no label).

Rows are grouped by a label (a "world"/seed: by default the store folder's name) so the fit can
cross-validate by leaving whole groups out; ``concat`` merges several stores.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import UserInputError
from remem_agent.ranking.features import FEATURE_NAMES, LEGACY_FEATURE_NAMES, upgrade_snapshot
from remem_agent.store.base import Store, is_postgres_url
from remem_agent.store.factory import open_store


class HasStore(Protocol):
    """Anything that carries a ledger, e.g. a ``ReMem`` (named structurally so this module needs no import of it)."""

    @property
    def store(self) -> Store: ...


# Attributed credit at or above this, on a successful task, is a positive label.
CREDIT_THRESHOLD = 0.5


def label(success: bool, credit: float) -> int:
    """A served memory's training label: 1 when its search's task succeeded and its credit reached
    ``CREDIT_THRESHOLD``, else 0 (the learned utility's rows and the store re-ranker's alike)."""
    return int(success and credit >= CREDIT_THRESHOLD)


@dataclass(frozen=True, eq=False)
class TrainingSet:
    """Rows for fitting a utility model. Arrays are read-only; row ``i`` is aligned across fields."""

    X: NDArray[np.float64]  # (n, d) feature snapshots
    y: NDArray[np.int8]  # (n,) observed labels in {0, 1}
    groups: NDArray[np.str_]  # (n,) world/seed label per row (for leave-one-group-out CV)
    feature_names: tuple[str, ...]
    search_ids: NDArray[np.str_]  # (n,) the search each row came from
    memory_ids: NDArray[np.str_]  # (n,) the served memory each row describes

    def __post_init__(self) -> None:
        # Own read-only copies in canonical dtypes, so neither side can mutate the other's arrays.
        d = len(self.feature_names)
        fields: dict[str, NDArray[Any]] = {
            "X": np.array(self.X, dtype=np.float64).reshape(-1, d),
            "y": np.array(self.y, dtype=np.int8).reshape(-1),
            "groups": np.array(self.groups, dtype=np.str_).reshape(-1),
            "search_ids": np.array(self.search_ids, dtype=np.str_).reshape(-1),
            "memory_ids": np.array(self.memory_ids, dtype=np.str_).reshape(-1),
        }
        n = fields["X"].shape[0]
        for name, arr in fields.items():
            if arr.shape[0] != n:
                raise UserInputError(f"{name} has {arr.shape[0]} rows, expected {n}")
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "feature_names", tuple(self.feature_names))
        if not set(np.unique(fields["y"]).tolist()) <= {0, 1}:
            raise UserInputError("labels y must be 0 or 1")

    def __len__(self) -> int:
        return int(self.X.shape[0])

    @property
    def positives(self) -> int:
        return int(self.y.sum())

    @property
    def group_names(self) -> tuple[str, ...]:
        """Distinct group labels in first-seen order."""
        return tuple(dict.fromkeys(self.groups.tolist()))


def _make(
    rows: list[list[float]],
    labels: list[int],
    groups: list[str],
    search_ids: list[str],
    memory_ids: list[str],
    names: tuple[str, ...],
) -> TrainingSet:
    return TrainingSet(
        X=np.asarray(rows, dtype=np.float64).reshape(len(rows), len(names)),
        y=np.asarray(labels, dtype=np.int8),
        groups=np.asarray(groups, dtype=np.str_),
        feature_names=names,
        search_ids=np.asarray(search_ids, dtype=np.str_),
        memory_ids=np.asarray(memory_ids, dtype=np.str_),
    )


def _check_names(stored: str | None, where: str) -> tuple[str, ...]:
    """The feature names the ledger's snapshots were recorded with (current or the pre-fusion legacy set)."""
    if stored is None:  # a ledger written before the key existed: rows are checked for width below
        return FEATURE_NAMES
    try:
        names = tuple(json.loads(stored))
    except (ValueError, TypeError) as exc:
        raise UserInputError(f"{where}: meta 'feature_names' is not a JSON list: {stored!r}") from exc
    if names not in (FEATURE_NAMES, LEGACY_FEATURE_NAMES):
        raise UserInputError(
            f"{where}: feature snapshots were recorded with features {list(names)}, but this remem-agent "
            f"uses {list(FEATURE_NAMES)}; rows from a different feature set cannot be mixed into training"
        )
    return names


def _read(store: Store, group: str) -> TrainingSet:
    where = store.location
    _check_names(store.get_meta("feature_names"), where)
    d = len(FEATURE_NAMES)
    legacy = len(LEGACY_FEATURE_NAMES)
    with store.read() as tx:
        searches = list(tx.answered_searches())
        credit = {(sid, mid): cr for sid, mid, cr in tx.credit_values()}
    rows: list[list[float]] = []
    labels: list[int] = []
    sids: list[str] = []
    mids: list[str] = []
    for sid, served, feedback in searches:
        success = bool(feedback.get("success"))
        for item in served:
            f = item.get("f")
            if f is None:  # served before snapshots were recorded: nothing to learn from
                continue
            if len(f) not in (d, legacy):
                raise UserInputError(
                    f"{where}: search {sid} has a {len(f)}-feature snapshot; this remem-agent uses {d} features"
                )
            mid = str(item["id"])
            # A store opened before fusion existed keeps its old meta and has rows of both widths: an old row
            # was served from a dense pool, so its lexical is 0 and its retrieval score its cosine.
            row = [float(v) for v in f]
            rows.append(upgrade_snapshot(LEGACY_FEATURE_NAMES, row) if len(f) == legacy else row)
            labels.append(label(success, credit.get((sid, mid), 0.0)))
            sids.append(str(sid))
            mids.append(mid)
    ts = _make(rows, labels, [group] * len(rows), sids, mids, FEATURE_NAMES)
    if not np.isfinite(ts.X).all():
        raise UserInputError(f"{where}: feature snapshots contain non-finite values")
    return ts


def rerank_rows(store: Store, *, latest: int, folds: int, feature_names: Sequence[str]) -> TrainingSet:
    """The store re-ranker's training rows (``learning/rerank_fit.py``): one per served memory of those of the
    ``latest`` answered searches that recorded re-rank features, its features ``r`` (columns ``feature_names``,
    the re-ranker's ``RERANK_FEATURES``; a record of another width is skipped) and the label the learned utility's
    rows get; each row's group is its search's fold (the search's position among those read, modulo ``folds``)."""
    names = tuple(feature_names)
    with store.read() as tx:
        searches = [(sid, served, fb) for sid, served, fb in tx.answered_searches(latest) if _has_rerank(served)]
        credit = tx.credits_of_searches([sid for sid, _, _ in searches])
    width = len(names)
    rows: list[list[float]] = []
    labels: list[int] = []
    groups: list[str] = []
    sids: list[str] = []
    mids: list[str] = []
    for position, (sid, served, feedback) in enumerate(searches):
        success = bool(feedback.get("success"))
        for item in served:
            r = item.get("r")
            if not isinstance(r, list) or len(r) != width:
                continue
            mid = str(item["id"])
            rows.append([float(v) for v in r])
            labels.append(label(success, credit.get((sid, mid), 0.0)))
            groups.append(str(position % folds))
            sids.append(str(sid))
            mids.append(mid)
    ts = _make(rows, labels, groups, sids, mids, names)
    if not np.isfinite(ts.X).all():
        raise UserInputError(f"{store.location}: re-rank features contain non-finite values")
    return ts


def _has_rerank(served: Sequence[Any]) -> bool:
    return any(isinstance(item, dict) and "r" in item for item in served)


def _group_name(store: Store) -> str:
    folder = getattr(store, "folder", None)
    return folder.name if isinstance(folder, Path) else store.location


def training_rows(source: Store | HasStore | str | Path, *, group: str | None = None) -> TrainingSet:
    """Training rows from every answered search of one store.

    ``source`` is a store (``SQLiteStore``/``PostgresStore``), a ``ReMem``, a store folder or a
    ``postgresql://`` URL (opened, read and closed again; nothing is written to an existing ledger).
    ``group`` labels every row (default: the folder name). Raises ``UserInputError`` when the
    snapshots were recorded with other features than ``FEATURE_NAMES``, or when there is no ledger.
    """
    if isinstance(source, str | Path):
        if not is_postgres_url(source):
            source = Path(source).expanduser()
        try:
            opened: Store = open_store(source, create=False)
        except UserInputError as exc:
            raise UserInputError(f"{source} is not a remem-agent store: {exc}") from exc
        try:
            return _read(opened, group if group is not None else _group_name(opened))
        finally:
            opened.close()
    store: Any = getattr(source, "store", source)  # a ReMem or anything else with a .store
    if callable(getattr(store, "read", None)) and isinstance(getattr(store, "location", None), str):
        return _read(store, group if group is not None else _group_name(store))
    raise UserInputError(f"expected a store, a ReMem, a store folder or URL, got {type(source).__name__}")


def concat(sets: Sequence[TrainingSet]) -> TrainingSet:
    """Merge several training sets (e.g. one per world/seed), keeping each row's group label."""
    if not sets:
        return _make([], [], [], [], [], FEATURE_NAMES)
    names = sets[0].feature_names
    for ts in sets[1:]:
        if ts.feature_names != names:
            raise UserInputError(
                f"cannot concatenate training sets with different features: {list(names)} vs {list(ts.feature_names)}"
            )
    return TrainingSet(
        X=np.concatenate([ts.X for ts in sets]),
        y=np.concatenate([ts.y for ts in sets]),
        groups=np.concatenate([ts.groups for ts in sets]),
        feature_names=names,
        search_ids=np.concatenate([ts.search_ids for ts in sets]),
        memory_ids=np.concatenate([ts.memory_ids for ts in sets]),
    )


__all__ = ["CREDIT_THRESHOLD", "TrainingSet", "concat", "rerank_rows", "training_rows"]
