"""The chat benchmark runs and writes a well-formed report (structure only: timings are never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from evals.perf import chat as perf_chat


def test_perf_chat_quick_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "chat.json"
    assert perf_chat.main(["--quick", "--out", str(out), "--tmpdir", str(tmp_path)]) == 0
    rep = json.loads(out.read_text())
    assert rep["benchmark"] == "perf_chat" and rep["quick"] is True
    assert rep["machine"]["cpu_count"] >= 1 and "git_commit" in rep and rep["wall_time_s"] > 0
    res = rep["result"]
    ov, ft = res["overhead"], res["first_token"]
    assert ov["calls"] == ov["overhead"]["n"] == 20 and ov["overhead"]["p50_ms"] > 0
    assert ov["overhead_first_turn"]["n"] + ov["overhead_later_turns"]["n"] == 20
    assert ov["model_fake"]["n"] == 20 and ov["recall"]["p50_ms"] > 0
    assert ft["calls"] == ft["added"]["n"] == 20
    for key in ("direct_first_chunk", "chat_stream_first_chunk", "first_token_in_trace"):
        assert ft[key]["p50_ms"] > 0
    names = {t["name"]: t for t in rep["targets"]}
    assert set(names) == {"chat_overhead_p50_ms", "first_token_added_p50_ms"}
    assert all(isinstance(t["met"], bool) and t["target"] == 5.0 for t in names.values())
    conc = res["concurrency"]
    assert conc["conversations"] == 10 and conc["answers"] == 40  # four user turns each
    assert conc["chat_calls"] == 50  # the owner turn is a tool loop: two calls
    assert conc["answers_served_without_verdict"] == 0 and conc["answers_with_two_verdicts"] == 0
    assert sum(conc["outcomes"].values()) == 40 - conc["answers_served_nothing"]  # one verdict per served answer
    assert rep["checks"]["no_cross_conversation_credit"] is True and rep["checks"]["verify_ok"] is True
    assert conc["scopes"] == 5 and rep["checks"]["scope_check"] == {"run": True, "met": True}
    assert conc["served_other_scopes_memories"] == 0 and conc["served_memories_scope_checked"] > 0
    assert isinstance(rep["checks"]["no_verdict_from_another_conversation"], bool)  # counted, not asserted


def test_perf_chat_one_scope_records_that_the_scope_check_did_not_run(tmp_path: Path) -> None:
    out = tmp_path / "chat1.json"
    perf_chat.main(["--quick", "--scopes", "1", "--out", str(out), "--tmpdir", str(tmp_path)])
    rep = json.loads(out.read_text())
    scope = rep["checks"]["scope_check"]
    assert rep["result"]["concurrency"]["scopes"] == 1 and scope["run"] is False and scope["met"] is None
