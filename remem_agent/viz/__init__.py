"""Read-only views of a store's ledger: the HTML dashboard and the ``remem ledger`` tables."""

from remem_agent.viz.dashboard import LedgerSnapshot, load_snapshot, render_dashboard, write_dashboard

__all__ = ["LedgerSnapshot", "load_snapshot", "render_dashboard", "write_dashboard"]
