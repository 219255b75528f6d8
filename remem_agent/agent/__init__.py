"""The middleware, one stage per module.

=================  ==========================================================================
stage              module
=================  ==========================================================================
recall             :mod:`.recall` (once per user turn) over ``ReMem.search`` (:mod:`.ports`)
prompt             :mod:`.prompt` (memories as quoted data, per-ask citation labels)
call + enforce     :mod:`.call` (bounded re-asks over the retry layer), :mod:`.enforce`
score              :mod:`.scoring` (truth); user / inferred, later: ``remem_agent/outcomes/``
learn              :mod:`.learn` (what a reply used), then ``ReMem.feedback`` (``learning/feedback.py``)
trace              :mod:`.trace` (``TraceRecord`` beside ``TRACE_SCHEMA``), :mod:`.chat_trace` (chat lines)
=================  ==========================================================================

:mod:`.middleware` wires them into ``MemoryAgent.ask``; :mod:`.chat` and :mod:`.stream` into ``chat`` and
``chat_stream``.
"""

from remem_agent.agent.middleware import Answer, MemoryAgent
from remem_agent.agent.scoring import Outcome, exact_match
from remem_agent.agent.trace import TRACE_SCHEMA, TraceRecord, TraceWriter, load_traces

__all__ = [
    "TRACE_SCHEMA",
    "Answer",
    "MemoryAgent",
    "Outcome",
    "TraceRecord",
    "TraceWriter",
    "exact_match",
    "load_traces",
]
