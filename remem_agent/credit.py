"""Credit assignment: turning one outcome into per-memory credit and blame.

Observable signals only (reference §4): whether the agent *cited* a memory (self-reported, noisy)
and whether it *used* the memory's value (the answer committed to a value the memory holds). Credit
is per memory, not split equally among the served set. On failure, memories whose value was used are
blamed; shown memories with neither signal are "wasted" exposures. Only served memories receive
anything (bandit feedback).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CreditPolicy:
    cited_and_used: float = 1.0
    used_only: float = 0.75
    cited_only: float = 0.5
    blame_used: float = 1.0
    blame_cited_only: float = 0.25

    def assign(
        self, served: Sequence[str], *, success: bool, cited: Collection[str], used: Collection[str]
    ) -> dict[str, tuple[float, float]]:
        """(credit, blame) for every served id."""
        out: dict[str, tuple[float, float]] = {}
        for mid in served:
            c, u = mid in cited, mid in used
            if success:
                credit = self.cited_and_used if (c and u) else self.used_only if u else self.cited_only if c else 0.0
                out[mid] = (credit, 0.0)
            else:
                blame = self.blame_used if u else self.blame_cited_only if c else 0.0
                out[mid] = (0.0, blame)
        return out
