"""Answers that wait for their verdict, and the rules that give one.

=================  ==========================================================================
module             what it holds
=================  ==========================================================================
:mod:`.rules`      the inference rules: a correction fails the answers that relied on the
                   corrected memory; moving on is a weak success (:data:`~.rules.WEAK_SUCCESS_WEIGHT`)
:mod:`.pending`    a waiting answer (:class:`~.pending.Waiting`), the :class:`~.pending.PendingStore`
                   protocol, and the in-process store (:class:`~.pending.PendingOutcomes`)
:mod:`.ledger`     the store that several processes share: waiting answers as ledger rows
                   (:class:`~.ledger.LedgerPendingOutcomes`, over ``store/pending.py``'s SQL)
=================  ==========================================================================

The agent (``MemoryAgent.ask`` and ``chat``), the gateway and the MCP server all settle answers through
these modules. ``rules`` and ``pending`` import nothing of the ledger, so the agent depends on them without
pulling the store in; only ``ledger`` does.
"""
