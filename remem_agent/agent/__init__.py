"""The middleware, one stage per module.

=================  ==========================================================================
stage              module
=================  ==========================================================================
recall             ``ReMem.search`` (``remem_agent/ranking/pipeline.py`` ranks; :mod:`.ports`)
prompt             :mod:`.prompt` (memories as quoted data, per-ask citation labels)
call + enforce     :mod:`.call` (bounded re-asks over the retry layer), :mod:`.enforce`
score              :mod:`.scoring` (truth); user / inferred, later: ``remem_agent/outcomes/``
learn              ``ReMem.feedback`` (``remem_agent/learning/feedback.py``)
trace              :mod:`.trace` (``TraceRecord`` beside ``TRACE_SCHEMA``)
=================  ==========================================================================

:mod:`.middleware` wires them into ``MemoryAgent.ask``.
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
