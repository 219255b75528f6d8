"""The abstain gate: serve nothing when nothing in the pool is more like the query than unrelated text is.

A similarity search always has a nearest memory, so a store with nothing relevant still injects its
closest notes: on a near-empty store a one-line question gets a few hundred tokens of unrelated memories,
which small models then answer from. The gate asks, per query, how similar *unrelated* text is to it: the
query is compared with a fixed corpus of everyday sentences on unrelated subjects (``NULL_TEXTS``,
embedded once per embedder), and a candidate counts as relevant only if its cosine similarity beats the
``quantile`` of those null similarities by ``margin``. The threshold is the query's own: a query that is
close to everything (short, generic) needs a closer memory than a specific one, and the rule holds for any
embedder without a per-model constant. If no candidate of the pool clears it, the search serves nothing and
says so (``SearchResult.abstained``); the gateway and the agent then inject no memory block at all.

Pure decisions only: the caller embeds the corpus (``ReMem`` keeps it per embedder) and passes vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

# Everyday statements and questions on subjects a user's memory rarely holds. Their only role is to sample
# "text unrelated to this query"; changing them moves every threshold, so they are fixed (a new corpus is a new
# gate version, measured again).
NULL_TEXTS: tuple[str, ...] = (
    "The kettle clicked off and the kitchen filled with steam.",
    "A flock of starlings turned over the field at dusk.",
    "She folded the map and put it back in the glove box.",
    "The bakery on the corner sells out of rye bread by noon.",
    "Rain is expected to clear by the weekend.",
    "The museum closes early on public holidays.",
    "He tuned the guitar before the rehearsal started.",
    "Tomatoes need plenty of sun and regular watering.",
    "The train was delayed by a fallen tree on the line.",
    "Our cat sleeps on the radiator every afternoon.",
    "The library extended its opening hours this winter.",
    "A good risotto needs patience and warm stock.",
    "The tide goes out far enough to walk to the island.",
    "They painted the fence a pale shade of green.",
    "The marathon route passes the old harbour.",
    "Owls hunt mostly at night and sleep during the day.",
    "The recipe calls for two eggs and a cup of flour.",
    "Snow closed the mountain pass for three days.",
    "The choir sang carols in the town square.",
    "He lost his umbrella on the bus again.",
    "The orchard's apples ripen in late September.",
    "A chess clock keeps both players to their time.",
    "The festival fireworks start after sunset.",
    "Bees visit the lavender all summer long.",
    "The bridge was built from local granite.",
    "She learned to knit from her grandmother.",
    "The ferry crossing takes about forty minutes.",
    "Fresh basil wilts quickly in the fridge.",
    "The comet will be visible low in the western sky.",
    "A lighthouse keeper once lived on that rock.",
    "The puppy chewed through another shoelace.",
    "Autumn leaves blocked the gutters on the roof.",
    "What is the tallest mountain in Africa?",
    "How long should I boil an egg for a soft yolk?",
    "Which planet has the most moons?",
    "Why do cats purr?",
    "What is a good name for a goldfish?",
    "How do you say thank you in Japanese?",
    "When does the cherry blossom season start?",
    "Who wrote the novel about a white whale?",
    "How many strings does a violin have?",
    "What makes the sky look blue?",
    "Can you recommend a board game for four players?",
    "How do I get candle wax out of a tablecloth?",
    "What is the difference between a crocodile and an alligator?",
    "Where do penguins live in the wild?",
    "How far away is the moon?",
    "What should I pack for a beach holiday?",
    "Tell me a fun fact about octopuses.",
    "Suggest a poem to read at a wedding.",
    "Is it going to rain tomorrow afternoon?",
    "How do you make pancakes fluffy?",
    "What time does the sun set in midsummer?",
    "Which bird lays the largest eggs?",
    "How old is the oldest tree on earth?",
    "What is the rule for offside in football?",
    "Why does bread go stale?",
    "Recommend a film for a rainy Sunday.",
    "How do hedgehogs survive the winter?",
    "What is the best way to store potatoes?",
    "Write a short rhyme about a sleepy dog.",
    "How do I keep my houseplants alive while I travel?",
    "What colour do you get by mixing blue and yellow?",
    "Explain how a rainbow forms.",
)


@dataclass(frozen=True, kw_only=True)
class GateDecision:
    """Whether a search abstains, and by how much its best candidate cleared (or missed) the threshold."""

    abstained: bool
    threshold: float  # the cosine a candidate had to exceed: null quantile + margin
    best: float  # the best candidate's cosine (-inf for an empty pool)

    @property
    def margin(self) -> float:
        """The best candidate's cosine minus the threshold (negative when the search abstains)."""
        return self.best - self.threshold


def null_threshold(
    query: NDArray[np.float32] | NDArray[np.float64], null: NDArray[np.floating], *, quantile: float, margin: float
) -> float:
    """The cosine a memory must exceed to count as relevant to ``query``: the ``quantile`` of the query's cosine
    similarities to the null corpus (rows of ``null``, unit-normalised like the query) plus ``margin``."""
    sims = np.asarray(null, dtype=np.float64) @ np.asarray(query, dtype=np.float64).reshape(-1)
    return float(np.quantile(sims, quantile)) + margin


def decide(similarities: NDArray[np.float64], threshold: float) -> GateDecision:
    """Abstain unless some candidate's cosine similarity exceeds ``threshold``."""
    sims = np.asarray(similarities, dtype=np.float64)
    best = float(sims.max()) if sims.size else float("-inf")
    return GateDecision(abstained=not best > threshold, threshold=threshold, best=best)
