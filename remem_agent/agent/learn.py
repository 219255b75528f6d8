"""What a reply teaches: the memories it cited, the served values it repeated, and the answer that waits for
its verdict.

Pure decisions over one reply (no I/O): :func:`read_reply` updates the turn's state and returns the
:class:`~remem_agent.agent.chat_types.ChatReply` with, when memories were served, the waiting answer and the
thread it is filed under (:func:`thread_after`, what the next user turn looks up). The caller adds the
waiting answer to the pending outcomes; its verdict is learned later by the rules of
:mod:`remem_agent.outcomes.rules`.
"""

from __future__ import annotations

import json
import logging

from remem_agent.adapters.base import ChatResponse, Message
from remem_agent.agent.chat_types import ChatOptions, ChatReply, TurnState
from remem_agent.agent.conversation import extract_citations, strip_citations, tool_arguments, transcript_digest
from remem_agent.learning.credit import carried_values_used
from remem_agent.outcomes.pending import Thread, Waiting

log = logging.getLogger("remem_agent.agent")


def turn_key(key: tuple[int, str]) -> str:
    """A turn's key (index of its user message, hash of its text) as the pending store keeps it."""
    return f"{key[0]}:{key[1]}"


def thread_after(opts: ChatOptions, resp: ChatResponse) -> Thread:
    """The thread a reply's waiting answer is filed under: what the next user turn will look up."""
    if opts.threaded:
        return ("conv", f"{opts.scope}|{opts.conversation_id}")
    reply = Message("assistant", resp.text, resp.tool_calls)
    return ("after", f"{opts.scope}|{transcript_digest((*opts.messages, reply))}")


def read_reply(
    opts: ChatOptions, turn: TurnState, resp: ChatResponse, *, recalled: bool
) -> tuple[ChatReply, tuple[Waiting, Thread] | None]:
    """Citations and value use of one reply (the turn's state updated), and the waiting answer it leaves
    (None when nothing was served), for the caller to add to the pending outcomes."""
    cited, unknown = extract_citations(resp.text, turn.aliases)
    texts = {h.id: h.text for h in turn.result.items}
    said = "\n".join([resp.text, *(json.dumps(a, ensure_ascii=False) for a in tool_arguments(resp.tool_calls))])
    used = sorted(carried_values_used(texts, said, exclude=turn.user_text))
    turn.cited += [c for c in cited if c not in turn.cited]
    turn.used += [u for u in used if u not in turn.used]
    turn.replies.append(resp.text)
    turn.answered = True
    waiting: tuple[Waiting, Thread] | None = None
    if turn.result.items:
        waiting = (
            Waiting(
                answer_id=turn.answer_id,
                search_id=turn.result.search_id,
                served_ids=tuple(turn.result.ids),
                cited_ids=tuple(turn.cited),
                value=None,
                used_ids=tuple(turn.used),
                scope=opts.scope,
                turn=turn_key(turn.key),
            ),
            thread_after(opts, resp),
        )
    if unknown:
        log.debug("reply cited labels that were not served: %s", unknown)
    reply = ChatReply(
        text=strip_citations(resp.text) if opts.strip else resp.text,
        raw=resp.text,
        tool_calls=resp.tool_calls,
        finish_reason=resp.finish_reason,
        usage=resp.usage,
        answer_id=turn.answer_id,
        conversation_id=opts.conversation_id,
        scope=opts.scope,
        search_id=turn.result.search_id,
        served=turn.result.items,
        aliases=dict(turn.aliases),
        citations=cited,
        used=tuple(used),
        recalled=recalled,
        abstained=turn.result.abstained,
    )
    return reply, waiting
