"""A backdated update in learned-schema mode that completes the attribute's evidence (the batched add path
found it): learning the attribute single-valued retires the backdated fact itself, retroactively, and the
insert must then stop there instead of invalidating it a second time (which raised InvalidTransition and
failed the whole batch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from remem_agent import MemoryInput, ReMem, RememConfig
from remem_agent.learning.staleness import StalenessPolicy
from remem_agent.types import State

DAY = 86_400.0


def _facts(t0: float) -> list[MemoryInput]:
    key = {"entity": "svc-api", "attribute": "region", "role": "state"}
    return [
        MemoryInput("svc-api region is eu-west", timestamp=t0, **key),
        MemoryInput("svc-api region changed to us-east", timestamp=t0 + 2 * DAY, **key),
        # backdated: between the two, and its update wording is the attribute's second confirmation
        MemoryInput("svc-api region changed to ap-south", timestamp=t0 + 1 * DAY, **key),
    ]


@pytest.mark.parametrize("batched", [True, False])
def test_backdated_update_that_teaches_the_schema_is_superseded_once(tmp_path: Path, batched: bool) -> None:
    mem = ReMem(tmp_path / "s", config=RememConfig(staleness=StalenessPolicy(mode="learned")))
    facts = _facts(1_700_000_000.0)
    if batched:
        ids = mem.add_many(facts)
    else:
        ids = [mem.add_many([f])[0] for f in facts]
    first, newest, backdated = (mem.get(i) for i in ids)
    assert newest.state is State.ACTIVE
    assert first.state is State.INVALIDATED and first.superseded_by == newest.id
    assert backdated.state is State.INVALIDATED and backdated.superseded_by == newest.id
    events = [e for e in mem.inspect(backdated.id).history if e.kind == "invalidate"]
    assert len(events) == 1  # retired once, by the retroactive supersession
    assert mem.verify().ok
    mem.close()
