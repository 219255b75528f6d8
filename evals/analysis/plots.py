"""Plots of a benchmark run (PNG, matplotlib with the Agg backend).

    python -m evals.analysis.plots                          # reads results/benchmark/benchmark.json
    python -m evals.analysis.plots --bench results/quick --reader first

Writes to ``<bench>/plots/``:

* ``headline.png``: task success of each system over the core families, per reader, with 95% CIs;
* ``per_family_<reader>.png``: task success per family and system, with 95% CIs;
* ``stale_in_context_<reader>.png``: share of tasks with an outdated fact for a needed key in context.

matplotlib is an optional dependency: ``pip install matplotlib``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SYSTEM_COLORS = {"A": "#9e9e9e", "B": "#64b5f6", "C": "#2e7d32"}
FALLBACK_COLORS = ("#ef6c00", "#8e24aa", "#00838f", "#c62828", "#5d4037")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - exercised only without matplotlib
        raise ImportError(
            "evals.analysis.plots needs matplotlib, which is not installed: run `pip install matplotlib`"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(system: str, i: int) -> str:
    return SYSTEM_COLORS.get(system, FALLBACK_COLORS[i % len(FALLBACK_COLORS)])


def _mean_ci(cell: dict[str, Any] | None) -> tuple[float, float]:
    """(mean, 95% half width) in percent; nan mean when missing, 0 half width when undefined (one seed)."""
    if not cell:
        return math.nan, 0.0
    mean = math.nan if cell.get("mean") is None else float(cell["mean"]) * 100
    ci = math.nan if cell.get("ci95") is None else float(cell["ci95"]) * 100  # null in JSON: no interval
    return mean, 0.0 if math.isnan(ci) else ci


def _grouped_bars(
    ax: Any,
    groups: Sequence[str],
    systems: Sequence[str],
    values: dict[str, list[tuple[float, float]]],
    *,
    labels: bool,
    label_fmt: str = "{:.1f}",
    fontsize: float = 8,
) -> None:
    n = len(systems)
    width = 0.8 / max(1, n)
    xs = list(range(len(groups)))
    for j, system in enumerate(systems):
        offs = [x + (j - (n - 1) / 2) * width for x in xs]
        means = [m for m, _ in values[system]]
        cis = [c for _, c in values[system]]
        bars = ax.bar(
            offs,
            means,
            width,
            yerr=cis,
            capsize=3,
            color=_color(system, j),
            edgecolor="black",
            linewidth=0.5,
            label=system,
            error_kw={"elinewidth": 1, "ecolor": "black"},
        )
        if labels:
            for rect, m, c in zip(bars, means, cis, strict=True):
                if math.isnan(m):
                    continue
                ax.annotate(
                    label_fmt.format(m),
                    (rect.get_x() + rect.get_width() / 2, m + c),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=fontsize,
                )
    ax.set_xticks(xs)
    ax.set_axisbelow(True)
    ax.yaxis.grid(True, color="#dddddd", linewidth=0.7)


def _legend(ax: Any, bench: dict[str, Any], systems: Sequence[str], **kw: Any) -> None:
    descriptions = bench.get("system_descriptions") or _descriptions()
    handles, _ = ax.get_legend_handles_labels()
    names = [f"{s}: {descriptions[s]}" if s in descriptions else s for s in systems]
    ax.legend(handles, names, fontsize=8, frameon=True, **kw)


def _descriptions() -> dict[str, str]:
    try:
        from evals.harness.systems import load_systems

        return {name: s.description for name, s in load_systems().items()}
    except Exception:  # noqa: BLE001 - the legend falls back to bare system names
        return {}


def _subtitle(bench: dict[str, Any]) -> str:
    seeds = bench.get("seeds") or []
    n = (bench.get("params") or {}).get("tasks_per_world")
    s = f"{len(seeds)} seeds" + (f" ({seeds[0]}–{seeds[-1]})" if seeds else "")
    if n:
        s += f", {n} tasks per world"
    return s + "; mean ± 95% t-interval over seeds"


def plot_headline(bench: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    systems = bench["systems"]
    readers = [r for r in bench["readers"] if r in bench["headline"]]
    values = {s: [_mean_ci(bench["headline"][r].get(s)) for r in readers] for s in systems}
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    _grouped_bars(ax, readers, systems, values, labels=True, fontsize=9)
    ax.set_xticklabels([f"reader `{r}`" for r in readers])
    ax.set_ylabel("task success (%)")
    ax.set_ylim(0, 105)
    core = bench.get("core_families") or []
    ax.set_title(f"Task success over the {len(core)} core families\n{_subtitle(bench)}", fontsize=10)
    deltas = []
    for r in readers:
        h = bench["headline"][r]
        if "C-A" in h:
            deltas.append(f"{r}: C − A = {h['C-A']['text']} pp")
    if deltas:
        ax.text(
            0.01, 0.98, "\n".join(deltas), transform=ax.transAxes, va="top", ha="left", fontsize=8,
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "#bbbbbb"},
        )  # fmt: skip
    _legend(ax, bench, systems, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def _families(bench: dict[str, Any], reader: str) -> list[str]:
    pf = bench["per_family"].get(reader, {})
    return [f for f in bench["families"] if f in pf]


def _family_label(fam: str, core: Sequence[str]) -> str:
    return fam.replace("_", "_\n", 1) + ("" if fam in core else "\n(extra)")


def plot_per_family(bench: dict[str, Any], reader: str, path: Path) -> Path:
    plt = _pyplot()
    systems = bench["systems"]
    fams = _families(bench, reader)
    pf = bench["per_family"][reader]
    values = {s: [_mean_ci(pf[f].get(s, {}).get("success")) for f in fams] for s in systems}
    fig, ax = plt.subplots(figsize=(max(8.0, 1.35 * len(fams) + 2), 5.2))
    _grouped_bars(ax, fams, systems, values, labels=True, label_fmt="{:.0f}", fontsize=7)
    core = bench.get("core_families") or []
    ax.set_xticklabels([_family_label(f, core) for f in fams], fontsize=8)
    ax.set_ylabel("task success (%)")
    ax.set_ylim(0, 112)
    ax.set_title(f"Task success per family, reader `{reader}`\n{_subtitle(bench)}", fontsize=10)
    _legend(ax, bench, systems, loc="upper center", ncol=len(systems), bbox_to_anchor=(0.5, -0.2))
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_stale(bench: dict[str, Any], reader: str, path: Path) -> Path:
    plt = _pyplot()
    systems = bench["systems"]
    fams = _families(bench, reader)
    pf = bench["per_family"][reader]
    values = {s: [_mean_ci(pf[f].get(s, {}).get("stale_in_context")) for f in fams] for s in systems}
    top = max((m + c for v in values.values() for m, c in v if not math.isnan(m)), default=0.0)
    fig, ax = plt.subplots(figsize=(max(8.0, 1.35 * len(fams) + 2), 5.2))
    _grouped_bars(ax, fams, systems, values, labels=True, label_fmt="{:.0f}", fontsize=7)
    core = bench.get("core_families") or []
    ax.set_xticklabels([_family_label(f, core) for f in fams], fontsize=8)
    ax.set_ylabel("tasks with a stale fact in context (%)")
    ax.set_ylim(0, max(10.0, top * 1.2))
    ax.set_title(
        f"Stale-in-context per family, reader `{reader}` (lower is better)\n"
        "a served memory asserted an outdated value for a needed key; " + _subtitle(bench).split(";")[0],
        fontsize=10,
    )
    _legend(ax, bench, systems, loc="upper center", ncol=len(systems), bbox_to_anchor=(0.5, -0.2))
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def make_plots(bench_dir: Path, readers: Sequence[str] | None = None) -> list[Path]:
    """Write every plot of ``<bench_dir>/benchmark.json`` to ``<bench_dir>/plots``; returns the paths."""
    _pyplot()  # fail early, with the install hint, before reading anything
    bench = json.loads((bench_dir / "benchmark.json").read_text())
    out = bench_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_headline(bench, out / "headline.png")]
    for reader in readers or bench["readers"]:
        if reader not in bench["per_family"]:
            raise SystemExit(f"reader {reader!r} not in {bench_dir / 'benchmark.json'}: {list(bench['per_family'])}")
        paths.append(plot_per_family(bench, reader, out / f"per_family_{reader}.png"))
        paths.append(plot_stale(bench, reader, out / f"stale_in_context_{reader}.png"))
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.analysis.plots", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default="results/benchmark", help="folder holding benchmark.json")
    ap.add_argument("--reader", help="per-family plots for this reader only (default: every reader of the run)")
    args = ap.parse_args(argv)
    for p in make_plots(Path(args.bench), [args.reader] if args.reader else None):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
