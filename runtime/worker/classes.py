"""The isolation classes of one worker: which class each of its actors is in, each class's capacity, and
which classes its claims take jobs for. Pure (no database): the dispatcher, the registry and the
registration read it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from taskq.settings import ISOLATION_CLASSES

CLASS_INDEX = {name: i + 1 for i, name in enumerate(ISOLATION_CLASSES)}
"""Each class's index in the claim statements' slot arrays (1-based, as SQL arrays are)."""


class WorkerClasses:
    """`capacities`: jobs of each class the worker runs at once; `actors`: the class of each actor it knows.

    A worker whose actors are all of one class ("single") claims with job_claim, every job counting on that
    class, a job of an actor it does not know too (it fails at once as UnknownActor). A worker with actors
    of several classes ("mixed") claims each class within its free slots, and counts the jobs of actors it
    does not know on the async class. Everything is worked out once: `class_of` runs for every job."""

    def __init__(self, capacities: Mapping[str, int], actors: Mapping[str, str]) -> None:
        self.capacities = dict(capacities)
        self.actors = dict(actors)
        found = set(self.actors.values())
        self.present: tuple[str, ...] = tuple(c for c in ISOLATION_CLASSES if c in found) or ("async",)
        """The classes of the worker's actors, in ISOLATION_CLASSES order (async alone for no actor)."""
        self.mixed = len(self.present) > 1
        self.stray = "async" if self.mixed else self.present[0]
        """The class a job of an unknown actor counts on: async in a mixed worker, else the only class."""
        claimed = {*self.present, self.stray}
        self.claimed: tuple[str, ...] = tuple(c for c in ISOLATION_CLASSES if c in claimed)
        """The classes the worker's claims take jobs for: its actors' classes, and the stray class."""

    @classmethod
    def of(cls, capacities: Mapping[str, int], actors: Iterable[tuple[str, str]]) -> WorkerClasses:
        """From the capacities and (actor name, isolation) pairs."""
        return cls(capacities, dict(actors))

    def class_of(self, actor: str) -> str:
        return self.actors.get(actor, self.stray)

    def actors_of(self, isolation: str) -> list[str]:
        """The known actors of one class, sorted."""
        return sorted(a for a, c in self.actors.items() if c == isolation)

    def describe(self) -> str:
        """`async=200 thread=16 process=2`: the line `taskq worker` prints at start."""
        return " ".join(f"{c}={self.capacities[c]}" for c in ISOLATION_CLASSES)
