"""``remem-mcp``: ReMem as an MCP server (stdio), so Claude Code, Claude Desktop or any MCP client can use it.

Tools: ``remember``, ``recall``, ``feedback``, ``inspect``, ``list_memories``, ``stats``. Arguments are
JSON-schema'd from typed parameters; results are structured (JSON objects). Bad arguments come back as
MCP tool errors (``isError``) and the server keeps serving; every store write is one transaction, so a
rejected call leaves the ledger as it was. A tool that reports failure has changed nothing: ``remember``
validates before it writes, and once the fact is committed it always answers (with ``error_after_write``
if reading it back failed). Every error names its cause: ``RememError`` subclasses by type and message,
anything else as an internal error with its type and message.

The tools themselves, and how recalls that get no ``feedback`` are judged, are in
:mod:`remem_agent.integrations.mcp_tools`; this module wires them to MCP and reads the environment.

Environment: ``REMEM_PATH`` (store folder, default ``~/.remem/default``, or a ``postgresql://`` URL
for a store shared by several machines), ``REMEM_EMBEDDER`` (``hash``, the default; ``minilm``, the
real all-MiniLM-L6-v2 on onnxruntime when the ``onnx`` extra is installed, else on sentence-transformers;
``onnx``; or ``sentence-transformers``), ``REMEM_ST_MODEL`` (model name or local folder for
sentence-transformers), ``REMEM_EMBED_THREADS`` (the embedder's threads, default 1),
``REMEM_AUTO_FEEDBACK`` (``0`` turns inference off), ``REMEM_SCOPE`` (the scope every tool reads and
writes, e.g. ``user:alice``; default ``default``), ``REMEM_LOG_LEVEL``.
stdout carries the protocol; logs go to stderr.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from remem_agent.embedders.base import Embedder
from remem_agent.errors import RememError, UserInputError
from remem_agent.memory import ReMem
from remem_agent.store.base import is_postgres_url

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

from remem_agent.integrations.mcp_tools import (
    RememTools,
    RoleArg,
    StateArg,
    _describe,
)

__all__ = ["RememTools", "build_server", "main", "open_from_env"]

log = logging.getLogger("remem_agent.mcp")

DEFAULT_PATH = "~/.remem/default"

INSTRUCTIONS = """\
ReMem is long-term memory that learns which memories help.
- Before answering anything that may depend on earlier facts, call `recall` (pass the same `task` for one
  kind of work). Cite the ids you relied on.
- When you learn a fact, call `remember`. For a fact with one current value, give `entity` and `attribute`
  (e.g. entity="server", attribute="region"): a new value then replaces the old one, and if the old one was
  served by a recall, that recall counts as a failure of the old memory.
- After the task, call `feedback(search_id, success, used_ids, cited_ids)`. Without it the server infers
  a weak success when you move on to the next recall of the same task.
"""


# -- MCP wiring -----------------------------------------------------------------------------------
_Text = Annotated[str, Field(description="The fact, in one self-contained sentence.")]
_Entity = Annotated[
    str | None,
    Field(description="What the fact is about (e.g. 'server'). With attribute, a new 'state' fact replaces the old."),
]
_Attribute = Annotated[str | None, Field(description="Which property of the entity (e.g. 'region').")]
_Role = Annotated[
    RoleArg,
    Field(
        description="'state' (one current value per entity+attribute; newer replaces older), "
        "'preference' or 'note' (multi-valued, never replaced)."
    ),
]
_TaskTags = Annotated[
    str | list[str] | None, Field(description="Task class(es) this fact belongs to (e.g. 'support').")
]
_Timestamp = Annotated[
    str | float | None,
    Field(
        description="When it became true: ISO-8601 (e.g. '2025-03-01T00:00:00Z') or epoch seconds (not milliseconds), "
        "within years 1-9999 UTC; default now. Passing the same timestamp again makes a repeated remember harmless."
    ),
]
_Query = Annotated[str, Field(description="What you need to know, as a question or keywords.")]
_K = Annotated[int | None, Field(ge=1, le=100, description="How many memories at most (default 5).")]
_Task = Annotated[
    str | None,
    Field(description="Task class of this recall (e.g. 'support'); outcomes are learned per task class."),
]
_AsOf = Annotated[
    str | float | None,
    Field(description="Ask about the past: ISO-8601 or epoch seconds; returns facts valid at that time."),
]
_Budget = Annotated[int | None, Field(ge=0, description="Maximum total tokens of the returned memories.")]
_SearchId = Annotated[str, Field(description="The search_id returned by recall.")]
_Success = Annotated[bool, Field(strict=True, description="Did the task that used this recall succeed?")]
_Used = Annotated[list[str] | None, Field(description="Ids of served memories whose content the answer relied on.")]
_Cited = Annotated[list[str] | None, Field(description="Ids of served memories you cited.")]
_MemoryId = Annotated[str, Field(description="A memory id (as returned by remember or recall).")]
_MemoryIds = Annotated[list[str], Field(min_length=1, description="Ids of the memories to erase.")]
_Reason = Annotated[str | None, Field(description="Why (logged with the erasure; never the erased text).")]
_State = Annotated[StateArg | None, Field(description="Only memories in this lifecycle state.")]
_RoleFilter = Annotated[RoleArg | None, Field(description="Only memories with this role.")]
_Limit = Annotated[int, Field(ge=0, le=1000, description="Page size.")]
_Offset = Annotated[int, Field(ge=0, description="How many memories to skip (insertion order).")]


def build_server(tools: RememTools) -> MCPServer:
    """An MCPServer exposing ``tools``; ReMem errors become tool errors (``isError`` results)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server: MCPServer = MCPServer(name="remem", instructions=INSTRUCTIONS, log_level=_log_level())

    def _call(fn: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            result: dict[str, Any] = fn(**kwargs)
        except RememError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # a library bug: still say what went wrong, not an opaque error
            log.exception("tool %s failed", getattr(fn, "__name__", fn))
            raise ToolError(f"internal error of remem-agent ({_describe(exc)}); please report it") from exc
        return result

    @server.tool(
        description="Store a fact in long-term memory. Give entity+attribute for facts with one current value; "
        "a new value then supersedes the old one (and counts as a correction of any recall that served it)."
    )
    def remember(
        text: _Text,
        entity: _Entity = None,
        attribute: _Attribute = None,
        role: _Role = "state",
        task: _TaskTags = None,
        timestamp: _Timestamp = None,
    ) -> dict[str, Any]:
        return _call(
            tools.remember, text=text, entity=entity, attribute=attribute, role=role, task=task, timestamp=timestamp
        )

    @server.tool(
        description="Retrieve the memories most likely to help with a query (ranked by learned usefulness, not "
        "just similarity). Returns a search_id for feedback, and each memory's id, text, score, state and validity."
    )
    def recall(
        query: _Query,
        k: _K = None,
        task: _Task = None,
        as_of: _AsOf = None,
        token_budget: _Budget = None,
    ) -> dict[str, Any]:
        return _call(tools.recall, query=query, k=k, task=task, as_of=as_of, token_budget=token_budget)

    @server.tool(
        description="Report whether the task that used a recall succeeded, and which served memories were used "
        "or cited. This is how memory learns what helps. Identical repeats are harmless."
    )
    def feedback(
        search_id: _SearchId,
        success: _Success,
        used_ids: _Used = None,
        cited_ids: _Cited = None,
    ) -> dict[str, Any]:
        return _call(tools.feedback, search_id=search_id, success=success, used_ids=used_ids, cited_ids=cited_ids)

    _inspection_tools(server, tools, _call)
    return server


def _inspection_tools(server: MCPServer, tools: RememTools, _call: Callable[..., dict[str, Any]]) -> None:
    """The tools that read or erase stored memories (``build_server`` registers the learning loop's)."""

    @server.tool(description="Everything known about one memory: state, validity, credit statistics, history.")
    def inspect(memory_id: _MemoryId) -> dict[str, Any]:
        return _call(tools.inspect, memory_id=memory_id)

    @server.tool(
        description="Erase memories for good (the user asked to be forgotten, or a secret was stored by mistake): "
        "their text, vectors and index entries are removed; they are never recalled again."
    )
    def erase(memory_ids: _MemoryIds, reason: _Reason = None) -> dict[str, Any]:
        return _call(tools.erase, memory_ids=memory_ids, reason=reason)

    @server.tool(description="List stored memories in insertion order, optionally by lifecycle state and role.")
    def list_memories(
        state: _State = None,
        role: _RoleFilter = None,
        limit: _Limit = 50,
        offset: _Offset = 0,
    ) -> dict[str, Any]:
        return _call(tools.list_memories, state=state, role=role, limit=limit, offset=offset)

    @server.tool(description="Counts of the memory store: memories by state and role, searches, feedbacks.")
    def stats() -> dict[str, Any]:
        return _call(tools.stats)


# -- configuration --------------------------------------------------------------------------------
def _log_level() -> Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]:
    level = os.environ.get("REMEM_LOG_LEVEL", "INFO").strip().upper()
    if level == "DEBUG":
        return "DEBUG"
    if level == "WARNING":
        return "WARNING"
    if level == "ERROR":
        return "ERROR"
    if level == "CRITICAL":
        return "CRITICAL"
    return "INFO"


def _flag(value: str | None, default: bool) -> bool:
    if value is None or not value.strip():
        return default
    v = value.strip().lower()
    if v in ("0", "false", "no", "off"):
        return False
    if v in ("1", "true", "yes", "on"):
        return True
    raise UserInputError(f"REMEM_AUTO_FEEDBACK must be 0 or 1, got {value!r}")


def make_embedder(env: Mapping[str, str]) -> Embedder:
    """The embedder named by ``REMEM_EMBEDDER`` (:mod:`remem_agent.embedders.registry`; ``hash`` by default)."""
    from remem_agent.embedders.registry import canonical_name
    from remem_agent.embedders.registry import make_embedder as by_name

    name = env.get("REMEM_EMBEDDER", "hash")
    model = env.get("REMEM_ST_MODEL") or None
    return by_name(name, model=model if canonical_name(name) == "sentence-transformers" else None)


def open_from_env(env: Mapping[str, str] | None = None) -> RememTools:
    """Open the store and tools configured by the environment."""
    env = os.environ if env is None else env
    raw = env.get("REMEM_PATH") or str(DEFAULT_PATH)
    # A postgresql:// URL selects the shared PostgreSQL store; anything else is a folder.
    path: str | Path = raw if is_postgres_url(raw) else Path(raw).expanduser()
    auto = _flag(env.get("REMEM_AUTO_FEEDBACK"), True)
    scope = env.get("REMEM_SCOPE") or None
    # REMEM_EMBEDDER unset: an existing store reopens with its own embedder, a new one gets the hash embedder.
    memory = ReMem(path, embedder=make_embedder(env) if env.get("REMEM_EMBEDDER") else None)
    try:
        return RememTools(memory, auto_feedback=auto, scope=scope)
    except BaseException:
        memory.close()
        raise


def main() -> int:
    """Entry point of ``remem-mcp``: serve the store over stdio until the client disconnects."""
    logging.basicConfig(stream=sys.stderr, level=_log_level(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import mcp  # noqa: F401
    except ImportError:
        print("remem-mcp needs the MCP SDK: pip install 'remem-agent[mcp]'", file=sys.stderr)
        return 2
    try:
        tools = open_from_env()
    except (RememError, ImportError) as exc:
        print(f"remem-mcp: {exc}", file=sys.stderr)
        return 2
    log.info(
        "remem-mcp serving %s (embedder %s, auto feedback %s)",
        tools.memory.path,
        tools.memory.embedder.name,
        "on" if tools.auto_feedback else "off",
    )
    try:
        build_server(tools).run("stdio")
    except KeyboardInterrupt:  # pragma: no cover
        pass
    finally:
        tools.memory.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
