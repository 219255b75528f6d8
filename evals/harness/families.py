"""The task families of the synthetic benchmark (reference design §9), one generator each.

Every family is built from the same toolkit (:class:`Gen`): services with attributes whose values
live in small domains, state facts (and their updates), look-alike *traps* that share the question's
words but hold no value, *noise* notes, and tasks that ask for one or two keys. What differs is the
mix, the timeline and the budget:

=================== =====================================================================
distractor          recurring questions, each key with look-alike traps that never help
distractor_norecur  control: every key is asked once, so per-memory history cannot help
long_horizon        many keys arriving over a long timeline, noise accumulating
contradiction       values change (updates with wording), questions ask the current value
state_change        frequent changes; a third of the questions ask about the past (as_of)
rare_critical       critical keys needed rarely: dormant ones and ones retrieved elsewhere
useless_frequent    generic notes similar to every question of a class, never helpful
budget_tight        45-token budget; gold facts are long, each key has two short traps
budget_medium       90-token budget, same world shape
budget_lookalike    45-token budget, one short trap for half of the keys (outside the headline)
=================== =====================================================================

Each generator registers itself under its name (:func:`register`, :data:`FAMILIES`); :func:`make_world`
builds a family's world for a seed. The world data model itself is :mod:`evals.harness.world`, which
knows nothing of the families (no import cycle).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, Protocol, TypeVar

from evals.harness.world import (
    DAY,
    T0,
    Fact,
    FactKind,
    Role,
    Step,
    Task,
    World,
    WorldParams,
    drop_keys,
    key_name,
    truth_at,
)


class Generator(Protocol):
    """A family's world generator: ``(seed, params) -> World``, deterministic in its arguments.

    A generator may take extra keyword-only arguments with defaults (``distractor(..., recur=False)``);
    the registry calls it with the two positional ones only.
    """

    def __call__(self, seed: int, params: WorldParams, /) -> World: ...


G = TypeVar("G", bound=Generator)

FAMILIES: dict[str, Generator] = {}
"""Every registered family by name (filled by :func:`register` below, when this module is imported)."""

CORE_FAMILIES = (
    "distractor",
    "long_horizon",
    "contradiction",
    "rare_critical",
    "useless_frequent",
    "budget_tight",
    "state_change",
)
CONTROL_FAMILIES = ("distractor_norecur",)

WORLDS_VERSION = 2
"""Which generation of these worlds a run used; bump it whenever any generator's output changes.

Runs record it (per world and in ``benchmark.json``), a resumed run never mixes versions, and the report
explains the budget worlds of the version it shows. Version 1 (runs up to commit ab59c9f) had one
look-alike for half of the keys in budget_tight and budget_medium: the world ``budget_lookalike`` keeps.
Version 2 gives each budget key two look-alikes, the worlds' first design (see ``_budget``).
"""


def register(name: str) -> Callable[[G], G]:
    """Register a generator under ``name``; the decorated function keeps its own signature."""

    def deco(fn: G) -> G:
        FAMILIES[name] = fn
        return fn

    return deco


def make_world(family: str, seed: int, params: WorldParams | None = None) -> World:
    """Build the world of ``family`` for ``seed`` (deterministic), with the imperfect-extraction knob applied."""
    if family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    world = FAMILIES[family](seed, params or WorldParams())
    return drop_keys(world, world.params.drop_keys, seed)


SERVICES = (
    "billing checkout auth payments inventory email analytics gateway reports ledger catalog search "
    "shipping pricing profile session notify export import scheduler webhooks metrics audit media "
    "backup cache-warmer recommender fraud invoices refunds onboarding support-portal chat maps "
    "geo tagging thumbnails sync uploads streaming ads"
).split()

SHORT_FILLER = (
    "the team",
    "last quarter",
    "after the review",
    "per the runbook",
    "as agreed",
    "for now",
    "since the incident",
    "according to the wiki",
    "in the last sync",
    "during the audit",
)


@dataclass(frozen=True)
class Attr:
    name: str
    task_class: str
    state: str  # "{e}" service, "{v}" value
    update: str  # explicit update wording
    update_plain: str  # the same change without update wording
    query: str
    historical: str  # an as_of question, "{d}" = date
    trap: str  # a look-alike without a value
    values: tuple[str, ...]


ATTRS: tuple[Attr, ...] = (
    Attr(
        "region",
        "ops",
        "The {e} service runs in region {v}.",
        "The {e} service moved to region {v}.",
        "The {e} service runs in region {v} (deployment record).",
        "Which region does the {e} service run in?",
        "Which region did the {e} service run in on {d}?",
        "Open question from the ops sync: which region should the {e} service run in long term?",
        ("us-east-1", "us-west-2", "eu-west-1", "eu-central-1", "ap-south-1", "ap-northeast-1"),
    ),
    Attr(
        "owner",
        "ownership",
        "The {e} service is owned by {v}.",
        "The {e} service is now owned by {v}.",
        "Owner of the {e} service: {v}.",
        "Who owns the {e} service?",
        "Who owned the {e} service on {d}?",
        "Who owns the {e} service? Ownership of the {e} service is being discussed in the org review.",
        ("alice", "bob", "carol", "dana", "erin", "frank", "grace", "heidi"),
    ),
    Attr(
        "database",
        "data",
        "The {e} service stores its data in {v}.",
        "The {e} service migrated its data to {v}.",
        "The {e} service stores data in {v} per the data map.",
        "Which database does the {e} service use?",
        "Which database did the {e} service use on {d}?",
        "Which database should the {e} service use? The data team wants a database review for {e}.",
        ("postgres", "mysql", "mongodb", "cassandra", "dynamodb", "cockroachdb"),
    ),
    Attr(
        "oncall",
        "ops",
        "On-call for the {e} service is {v}.",
        "On-call for the {e} service switched to {v}.",
        "Current pager rotation for the {e} service: {v}.",
        "Who is on call for the {e} service?",
        "Who was on call for the {e} service on {d}?",
        "Reminder: the on-call schedule for the {e} service is posted weekly; ask who is on call.",
        ("team-red", "team-blue", "team-green", "team-gold", "team-violet"),
    ),
    Attr(
        "version",
        "deploy",
        "The {e} service is deployed at version {v}.",
        "The {e} service was updated to version {v}.",
        "Deployed build of the {e} service: version {v}.",
        "Which version of the {e} service is deployed?",
        "Which version of the {e} service was deployed on {d}?",
        "Deploy checklist for the {e} service: confirm which version is deployed before the release.",
        ("v1.2", "v1.4", "v2.0", "v2.3", "v3.1", "v3.5", "v4.0"),
    ),
    Attr(
        "approver",
        "deploy",
        "Deploys of the {e} service are approved by {v}.",
        "Deploys of the {e} service are no longer approved by the old approver; {v} approves them now.",
        "Deploy approvals for the {e} service: {v}.",
        "Who approves deploys of the {e} service?",
        "Who approved deploys of the {e} service on {d}?",
        "Who approves deploys of the {e} service? The approval policy for {e} deploys is under review.",
        ("ivan", "judy", "mallory", "niaj", "olivia", "peggy"),
    ),
)
ATTR_BY_NAME = {a.name: a for a in ATTRS}

DEPENDS_VALUES = ("kafka", "redis", "s3", "sqs", "elasticsearch", "memcached", "rabbitmq", "nats")

NOISE_TEMPLATES = (
    "The {e} team lunch is on Friday.",
    "The {e} team celebrated the launch with cake.",
    "Slides from the {e} all-hands are in the shared drive.",
    "The {e} standup moved to 10am.",
    "New hire onboarding for the {e} team starts Monday.",
    "The {e} team prefers dark mode in the dashboard.",
)

LEXICON: tuple[tuple[str, ...], ...] = (
    ("region", "location", "zone"),
    ("owner", "owned", "owns"),
    ("database", "data", "datastore"),
    ("oncall", "on-call", "pager", "rotation"),
    ("version", "build", "release"),
    ("approver", "approves", "approved", "approval", "approvals"),
)


class Gen:
    """Builds one world: keeps the clock, ids and every fact so far (for truth)."""

    def __init__(self, family: str, seed: int, params: WorldParams, *, stream: str | None = None) -> None:
        """``stream`` names the random stream when it is not the family's (a family that keeps another's draws)."""
        self.family, self.seed, self.params = family, seed, params
        self.rng = random.Random(f"{stream or family}:{seed}")
        self.t = T0
        self.n = 0
        self.facts: list[Fact] = []
        self.current: dict[tuple[str, str], str] = {}
        self.steps: list[Step] = []
        self.pending: list[Fact] = []
        self.n_tasks = 0

    # -- facts ----------------------------------------------------------------------------------
    def _fact(
        self,
        text: str,
        key: tuple[str, str] | None,
        value: str | None,
        kind: FactKind,
        role: Role = "state",
        public_key: bool = True,
        multi: bool = False,
    ) -> Fact:
        self.n += 1
        self.t += self.rng.uniform(60, 600)
        ent, attr = key if key and public_key else (None, None)
        f = Fact(f"f{self.n:05d}", text, ent, attr, role, self.t, key, value, kind, multi)
        self.facts.append(f)
        self.pending.append(f)
        return f

    def state(self, e: str, a: Attr, v: str | None = None, *, long: bool = False) -> Fact:
        """A (new or changed) state fact for (e, a); an update when the key already has a value."""
        key = (e, a.name)
        old = self.current.get(key)
        if v is None:
            v = self.rng.choice([x for x in a.values if x != old])
        if old is None:
            text = a.state
        else:
            text = a.update if self.params.wording else a.update_plain
        text = text.format(e=e, v=v)
        if long:
            text += " " + self.padding(16)
        self.current[key] = v
        return self._fact(text, key, v, "gold" if old is None else "update")

    def trap(self, e: str, a: Attr) -> Fact:
        """A look-alike: the question's words, no value. Stored as a note by the extractor."""
        return self._fact(a.trap.format(e=e), None, None, "trap", role="note")

    def noise(self) -> Fact:
        e = self.rng.choice(SERVICES)
        return self._fact(self.rng.choice(NOISE_TEMPLATES).format(e=e), None, None, "noise", role="note")

    def depends(self, e: str) -> Fact:
        """A multi-valued fact (the extractor marks it as a preference, so it never supersedes)."""
        v = self.rng.choice(DEPENDS_VALUES)
        return self._fact(
            f"The {e} service depends on {v}.", (e, "depends_on"), v, "multi", role="preference", multi=True
        )

    def padding(self, words: int) -> str:
        parts: list[str] = []
        while len(" ".join(parts).split()) < words:
            parts.append(self.rng.choice(SHORT_FILLER))
        return "Context: " + ", ".join(parts) + "."

    # -- tasks ----------------------------------------------------------------------------------
    def ask(self, keys: list[tuple[str, str]], *, as_of: float | None = None, critical: bool = False) -> Task:
        self.t += self.rng.uniform(0.2, 1.0) * DAY / 8
        asked = as_of if as_of is not None else self.t
        truth = {}
        for key in keys:
            v = truth_at(self.facts, key, asked)
            assert v is not None, f"task asks {key} before any fact about it"
            truth[key_name(key)] = v
        a = ATTR_BY_NAME[keys[0][1]]
        if as_of is not None:
            from datetime import UTC, datetime

            d = datetime.fromtimestamp(as_of, tz=UTC).strftime("%Y-%m-%d %H:%M")
            query = a.historical.format(e=keys[0][0], d=d)
        else:
            query = " ".join(ATTR_BY_NAME[k[1]].query.format(e=k[0]) for k in keys)
        self.n_tasks += 1
        task = Task(
            f"{self.family}-{self.seed}-t{self.n_tasks:04d}",
            self.t,
            a.task_class,
            query,
            as_of,
            tuple(keys),
            truth,
            critical,
        )
        self.steps.append(Step(tuple(self.pending), task))
        self.pending = []
        return task

    def world(self, domains_extra: dict[str, tuple[str, ...]] | None = None) -> World:
        if self.pending:
            self.steps.append(Step(tuple(self.pending), None))
            self.pending = []
        domains = {a.name: a.values for a in ATTRS} | (domains_extra or {})
        return World(self.family, self.seed, self.params, tuple(self.steps), domains, LEXICON)

    def keys(self, n: int, attrs: tuple[Attr, ...] = ATTRS) -> list[tuple[str, Attr]]:
        pairs = [(e, a) for e in SERVICES for a in attrs]
        self.rng.shuffle(pairs)
        return pairs[:n]


@register("distractor")
def distractor(seed: int, params: WorldParams, *, recur: bool = True, family: str = "distractor") -> World:
    g = Gen(family, seed, params)
    n_keys = 40 if recur else params.n_tasks
    keys = g.keys(n_keys)
    for e, a in keys:
        g.state(e, a)
        for _ in range(g.rng.choice((1, 2))):
            g.trap(e, a)
    for _ in range(40 if recur else 20):
        g.noise()
    order = [keys[g.rng.randrange(len(keys))] for _ in range(params.n_tasks)] if recur else list(keys)
    for e, a in order:
        g.ask([(e, a.name)])
    return g.world()


@register("distractor_norecur")
def distractor_norecur(seed: int, params: WorldParams) -> World:
    return distractor(seed, params, recur=False, family="distractor_norecur")


@register("long_horizon")
def long_horizon(seed: int, params: WorldParams) -> World:
    g = Gen("long_horizon", seed, params)
    keys = g.keys(120)
    introduced: list[tuple[str, Attr]] = []
    per_task = len(keys) / params.n_tasks
    budget = 0.0
    for _ in range(params.n_tasks):
        budget += per_task
        while budget >= 1 and len(introduced) < len(keys):
            e, a = keys[len(introduced)]
            g.state(e, a)
            if g.rng.random() < 0.5:
                g.trap(e, a)
            introduced.append((e, a))
            budget -= 1
            if g.rng.random() < 0.7:
                g.noise()
        if not introduced:
            e, a = keys[0]
            g.state(e, a)
            introduced.append((e, a))
        if g.rng.random() < 0.08:  # an occasional change
            e, a = g.rng.choice(introduced)
            g.state(e, a)
        # questions favour recent keys but keep coming back to old ones
        i = len(introduced) - 1 - min(len(introduced) - 1, int(g.rng.expovariate(1 / 15)))
        e, a = introduced[i] if g.rng.random() < 0.7 else g.rng.choice(introduced)
        g.ask([(e, a.name)])
    return g.world()


@register("contradiction")
def contradiction(seed: int, params: WorldParams) -> World:
    g = Gen("contradiction", seed, params)
    keys = g.keys(40)
    for e, a in keys:
        g.state(e, a)
        if g.rng.random() < 0.5:
            g.trap(e, a)
    for _ in range(30):
        g.noise()
    for e in dict.fromkeys(e for e, _ in keys[:10]):  # ordered: set order depends on PYTHONHASHSEED
        g.depends(e)
        g.depends(e)
    for _ in range(params.n_tasks):
        if g.rng.random() < 0.12:
            e, a = g.rng.choice(keys)
            g.state(e, a)
        e, a = g.rng.choice(keys)
        g.ask([(e, a.name)])
    return g.world({"depends_on": DEPENDS_VALUES})


@register("state_change")
def state_change(seed: int, params: WorldParams) -> World:
    g = Gen("state_change", seed, params)
    keys = g.keys(30)
    first_t: dict[tuple[str, str], float] = {}
    for e, a in keys:
        first_t[(e, a.name)] = g.state(e, a).t
    for _ in range(20):
        g.noise()
    for _ in range(params.n_tasks):
        if g.rng.random() < 0.2:
            e, a = g.rng.choice(keys)
            g.state(e, a)
        e, a = g.rng.choice(keys)
        key = (e, a.name)
        if g.rng.random() < 0.33:
            lo = first_t[key]
            g.ask([key], as_of=g.rng.uniform(lo, g.t))
        else:
            g.ask([key])
    return g.world()


@register("rare_critical")
def rare_critical(seed: int, params: WorldParams) -> World:
    g = Gen("rare_critical", seed, params)
    keys = g.keys(56)
    regular, dormant, elsewhere = keys[:40], keys[40:48], keys[48:56]
    for e, a in keys:
        g.state(e, a)
        if (e, a) in regular and g.rng.random() < 0.5:
            g.trap(e, a)
    for _ in range(30):
        g.noise()
    # "shown elsewhere" critical facts share their service with frequently asked regular keys
    crit_slots = set(g.rng.sample(range(params.n_tasks // 3, params.n_tasks), 16))
    crit = dormant + elsewhere
    g.rng.shuffle(crit)
    hot = [(e2, a2) for (e2, a2) in regular if any(e2 == e for e, _ in elsewhere)] or regular
    for i in range(params.n_tasks):
        if i in crit_slots and crit:
            e, a = crit.pop()
            g.ask([(e, a.name)], critical=True)
            continue
        pool = hot if g.rng.random() < 0.4 else regular
        e, a = g.rng.choice(pool)
        g.ask([(e, a.name)])
    return g.world()


@register("useless_frequent")
def useless_frequent(seed: int, params: WorldParams) -> World:
    g = Gen("useless_frequent", seed, params)
    keys = g.keys(40)
    for e, a in keys:
        g.state(e, a)
    classes = sorted({a.task_class for a in ATTRS})
    for cls in classes:
        words = " ".join(f"{a.name} {a.query.split()[0].lower()}" for a in ATTRS if a.task_class == cls)
        for j in range(3):
            services = " ".join(g.rng.sample(SERVICES, 4))
            g._fact(
                f"Desk note {j} for {cls}: questions about which service {words} are common; "
                f"recent ones mentioned {services}.",
                None,
                None,
                "noise",
                role="note",
            )
    for _ in range(20):
        g.noise()
    for _ in range(params.n_tasks):
        e, a = g.rng.choice(keys)
        g.ask([(e, a.name)])
    return g.world()


LookAlikes = Literal["two_per_key", "half_of_keys"]


def _budget(
    seed: int, params: WorldParams, family: str, budget: int, look_alikes: LookAlikes, *, stream: str | None = None
) -> World:
    """Long gold facts (~36 tokens) under a token budget, beside short look-alikes (~18 tokens) of their key.

    ``two_per_key`` is our reading of the reference's description of its budget world: the long gold fact
    ranks below its look-alikes on similarity and nearly fills the budget, so at 45 tokens the family is low
    for every system (with the hash embedder; with MiniLM, C learns past the look-alikes and A does not).
    ``half_of_keys`` leaves room for the gold fact whenever a ranking does not put a look-alike first;
    there cost-aware selection (utility floor, knapsack) keeps what a similarity ranking crowds out.
    """
    g = Gen(family, seed, replace(params, token_budget=budget, k=10), stream=stream)
    keys = g.keys(40)
    for e, a in keys:
        g.state(e, a, long=True)
        n = 2 if look_alikes == "two_per_key" else int(g.rng.random() < 0.5)
        for _ in range(n):
            g.trap(e, a)
    for _ in range(30):
        g.noise()
    for _ in range(params.n_tasks):
        e, a = g.rng.choice(keys)
        g.ask([(e, a.name)])
    return g.world()


BUDGET_TIGHT_TOKENS = 45  # also quoted by the benchmark report (evals/analysis/comparison.py)


@register("budget_tight")
def budget_tight(seed: int, params: WorldParams) -> World:
    return _budget(seed, params, "budget_tight", BUDGET_TIGHT_TOKENS, "two_per_key")


@register("budget_medium")
def budget_medium(seed: int, params: WorldParams) -> World:
    return _budget(seed, params, "budget_medium", 90, "two_per_key")


@register("budget_lookalike")
def budget_lookalike(seed: int, params: WorldParams) -> World:
    """budget_tight's facts and questions of version 1 (its random stream), outside the headline: the knapsack's case.

    Task ids name the family, so the simulated reader's coins differ from version 1's budget_tight runs.
    """
    return _budget(seed, params, "budget_lookalike", BUDGET_TIGHT_TOKENS, "half_of_keys", stream="budget_tight")
