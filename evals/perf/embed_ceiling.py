"""How many texts per second all-MiniLM-L6-v2 can embed on this machine at most, beside what it does.

A roofline for the batched-add target (a benchmark, not a test). The model's work is counted, not
guessed: per token, each of its 6 layers multiplies the token's 384 values by four 384 x 384 attention
weights and the 384 x 1536 and 1536 x 384 feed-forward weights (1,769,472 multiply-adds), and attends over
the sequence (2 x length x 384 more). The machine's rate is measured: numpy's float32 matrix product
(OpenBLAS) at the model's own shapes for a batch of ``--batch`` texts of the mean length, with 1 and with
``--threads`` threads. Dividing the second by a text's multiply-adds (at its own length, no padding) gives
the most texts per second any fp32 implementation of this model can reach here when it does nothing but
those products at BLAS speed; the measured rate of :class:`~remem_agent.embedders.onnx.OnnxEmbedder`
(length-sorted batches, padding included) on the same texts sits beside it, with its share of the ceiling.

Usage::

    python -m evals.perf.embed_ceiling [--texts 600] [--out results/perf/embed_ceiling.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from evals.perf.measure import git_commit, git_dirty, loadavg, machine_facts

HIDDEN = 384  # all-MiniLM-L6-v2 (its config.json): hidden size, feed-forward size, layers
FEED_FORWARD = 1536
LAYERS = 6
WEIGHT_MACS_PER_TOKEN = LAYERS * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * FEED_FORWARD)


def macs_per_text(tokens: int) -> int:
    """Multiply-adds of one text of ``tokens`` tokens: the weight products and attention (scores and
    context: 2 x tokens x hidden per token per layer). Layer norms, GELU and softmax are left out."""
    return tokens * WEIGHT_MACS_PER_TOKEN + LAYERS * 2 * tokens * tokens * HIDDEN


def gemm_rate(rows: int, threads: int, seconds: float = 1.5) -> dict[str, float]:
    """float32 multiply-adds per second of numpy's matrix product at the model's shapes (a ``rows``-token
    batch times each weight shape, in the proportions a layer uses them), with BLAS at ``threads``."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, HIDDEN), dtype=np.float32)
    h = rng.standard_normal((rows, FEED_FORWARD), dtype=np.float32)
    w_attn = rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32)
    w_up = rng.standard_normal((HIDDEN, FEED_FORWARD), dtype=np.float32)
    w_down = rng.standard_normal((FEED_FORWARD, HIDDEN), dtype=np.float32)
    layer_macs = rows * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * FEED_FORWARD)

    def layer() -> None:
        for _ in range(4):
            x @ w_attn
        x @ w_up
        h @ w_down

    with threadpool_limits(threads):
        for _ in range(3):
            layer()
        best = float("inf")
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:  # the best of many: the rate the machine can reach
            t = time.perf_counter()
            layer()
            best = min(best, time.perf_counter() - t)
    return {"threads": threads, "macs_per_s": layer_macs / best, "gflop_per_s": round(2 * layer_macs / best / 1e9, 1)}


def onnx_rate(texts: list[str], threads: int) -> dict[str, Any]:
    """:class:`OnnxEmbedder`'s batched rate on ``texts`` (one ``embed`` call, as ``ReMem.add_many`` makes)."""
    from remem_agent.embedders.onnx import OnnxEmbedder

    emb = OnnxEmbedder(threads=threads)
    emb.embed(texts[:32])
    t, c = time.perf_counter(), time.process_time()
    emb.embed(texts)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    return {"threads": threads, "texts_per_s": round(len(texts) / wall, 1), "cpu_s": round(cpu, 3)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.perf.embed_ceiling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=600, help="texts of the perf_core world to embed")
    ap.add_argument("--threads", type=int, default=2, help="threads for the multi-threaded rates")
    ap.add_argument("--batch", type=int, default=16, help="texts per product (OnnxEmbedder's batch size)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="results/perf/embed_ceiling.json")
    args = ap.parse_args(argv)
    if args.texts < 1 or args.threads < 1 or args.batch < 1:
        ap.error("--texts, --threads and --batch must be >= 1")
    from evals.harness.jsonio import write_json
    from evals.perf.core import make_world
    from remem_agent.embedders.onnx import OnnxEmbedder

    start_load = loadavg()
    texts = [it.text for it in make_world(max(args.texts, 100), 1, seed=args.seed).items][: args.texts]
    counts = OnnxEmbedder().token_counts(texts)
    mean_tokens = float(np.mean(counts))
    text_macs = float(np.mean([macs_per_text(n) for n in counts]))
    rows = max(1, round(args.batch * mean_tokens))
    gemm = {str(th): gemm_rate(rows, th) for th in sorted({1, args.threads})}
    measured = {str(th): onnx_rate(texts, th) for th in sorted({1, args.threads})}
    ceiling = {th: g["macs_per_s"] / text_macs for th, g in gemm.items()}
    share = {th: round(measured[th]["texts_per_s"] / ceiling[th], 3) for th in ceiling}
    doc: dict[str, Any] = {
        "benchmark": "evals.perf.embed_ceiling",
        "command": "python -m evals.perf.embed_ceiling " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "machine": machine_facts(),
        "loadavg": {"start": start_load, "end": loadavg()},
        "texts": {"n": len(texts), "mean_tokens": round(mean_tokens, 1), "max_tokens": max(counts)},
        "model_macs": {"weights_per_token": WEIGHT_MACS_PER_TOKEN, "mean_per_text": round(text_macs)},
        "gemm": gemm,
        "ceiling_texts_per_s": {th: round(v, 1) for th, v in ceiling.items()},
        "onnx_measured": measured,
        "onnx_share_of_ceiling": share,
        "note": "ceiling = the numpy float32 product rate at the model's shapes / a text's multiply-adds (no "
        "padding, no other operator, no ledger work): an upper bound for any fp32 implementation here",
    }
    write_json(args.out, doc, indent=2)
    for th in ceiling:
        print(
            f"threads={th}: gemm {gemm[th]['gflop_per_s']} GFLOP/s -> ceiling {ceiling[th]:.0f} texts/s; "
            f"OnnxEmbedder {measured[th]['texts_per_s']}/s ({share[th]:.0%})",
            file=sys.stderr,
        )
    print(f"-> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
