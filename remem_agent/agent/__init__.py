"""The middleware: recall -> prompt -> call -> enforce -> score -> learn -> trace."""

from remem_agent.agent.middleware import Answer, MemoryAgent
from remem_agent.agent.scoring import Outcome, exact_match
from remem_agent.agent.trace import TRACE_SCHEMA, TraceWriter, load_traces

__all__ = ["TRACE_SCHEMA", "Answer", "MemoryAgent", "Outcome", "TraceWriter", "exact_match", "load_traces"]
