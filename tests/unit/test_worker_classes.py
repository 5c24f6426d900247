"""Each isolation class within its own capacity, without a database: the per-class slot arithmetic
(taskq.worker.decisions), the worker's classes (taskq.worker.classes), the registry's and the completer's
counts per class, and the dispatcher's wake on a freed slot of a full class."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from taskq.backend.workers import ClaimedJob, Finish
from taskq.settings import WorkerSettings
from taskq.worker.classes import CLASS_INDEX, WorkerClasses
from taskq.worker.completer import Completer
from taskq.worker.decisions import (
    class_claim_sizes,
    class_free_slots,
    classes_free,
    leftover,
    strays_due,
)
from taskq.worker.dispatcher import ClaimWake
from taskq.worker.registry import ActiveJob, ActiveJobRegistry
from taskq.worker.state import WorkerState

CAPACITIES = {"async": 50, "thread": 4, "process": 1}


def test_an_async_slot_is_lent_while_its_outcome_is_written_up_to_twice_the_capacity() -> None:
    assert class_free_slots("async", 50, held=50, outstanding=0) == 0
    assert class_free_slots("async", 50, held=50, outstanding=20) == 20
    assert class_free_slots("async", 50, held=100, outstanding=50) == 0


def test_a_thread_or_process_slot_frees_only_once_the_outcome_is_written() -> None:
    assert class_free_slots("process", 1, held=1, outstanding=1) == 0
    assert class_free_slots("process", 1, held=0, outstanding=0) == 1
    assert class_free_slots("thread", 4, held=3, outstanding=3) == 1


def test_each_class_is_free_within_its_own_capacity_whatever_the_others_hold() -> None:
    free = classes_free(CAPACITIES, held={"process": 1, "async": 10}, outstanding={},
                        classes=("async", "thread", "process"))
    assert free == {"async": 40, "thread": 4, "process": 0}
    # a class over its capacity (a lower capacity after a restart) frees nothing, and takes nothing away
    assert classes_free(CAPACITIES, held={"thread": 9}, outstanding={}, classes=("thread",)) == {"thread": 0}


def test_a_claim_asks_each_class_for_its_free_slots_at_most_a_batch_and_leaves_full_classes_out() -> None:
    assert class_claim_sizes({"async": 150, "thread": 4, "process": 0}, 100) == {"async": 100, "thread": 4}
    assert class_claim_sizes({"process": 0}, 100) == {}


def test_what_a_first_claim_leaves_is_claimed_next_and_a_class_that_got_all_it_asked_for_is_done() -> None:
    assert leftover({"async": 100, "process": 2}, {"async": 30, "process": 2}) == {"async": 70}
    assert leftover({"thread": 4}, {}) == {"thread": 4}


def test_strays_are_looked_for_at_most_once_per_poll_interval() -> None:
    assert strays_due(None, 5.0, 1.0)
    assert not strays_due(5.0, 5.5, 1.0)
    assert strays_due(5.0, 6.0, 1.0)


def mixed() -> WorkerClasses:
    return WorkerClasses.of(CAPACITIES, [("examples.nap", "async"), ("examples.sum_primes", "process")])


def test_a_worker_of_one_class_counts_every_job_on_it_even_an_unknown_actors() -> None:
    single = WorkerClasses.of(CAPACITIES, [("crunch", "process"), ("crunch2", "process")])
    assert not single.mixed and single.claimed == ("process",)
    assert single.class_of("nobody.knows") == "process"
    assert WorkerClasses.of(CAPACITIES, []).claimed == ("async",)


def test_a_mixed_worker_counts_an_unknown_actors_job_on_the_async_class() -> None:
    classes = mixed()
    assert classes.mixed and classes.stray == "async"
    assert classes.claimed == ("async", "process")
    assert classes.class_of("examples.sum_primes") == "process"
    assert classes.class_of("nobody.knows") == "async"
    assert classes.actors_of("process") == ["examples.sum_primes"]
    thread_and_process = WorkerClasses.of(CAPACITIES, [("t", "thread"), ("p", "process")])
    assert thread_and_process.claimed == ("async", "thread", "process")  # async: for the unknown actors


def test_the_start_line_names_the_three_capacities_and_the_defaults_need_no_tuning() -> None:
    assert mixed().describe() == "async=50 thread=4 process=1"
    settings = WorkerSettings(max_children=2)
    assert WorkerClasses.of(settings.capacities(), []).describe() == "async=200 thread=16 process=2"
    assert list(CLASS_INDEX.items()) == [("async", 1), ("thread", 2), ("process", 3)]


def claimed(actor: str) -> ClaimedJob:
    return ClaimedJob(id=uuid4(), actor=actor, queue="default", payload="{}", attempt=1, max_attempts=3,
                      claim_epoch=1, progress=None, schedule_to_close=None)


def test_the_registry_counts_held_jobs_per_class() -> None:
    registry = ActiveJobRegistry(mixed().class_of)
    nap, crunch, stray = ActiveJob(claimed("examples.nap")), ActiveJob(claimed("examples.sum_primes")), \
        ActiveJob(claimed("nobody.knows"))
    for entry in (nap, crunch, stray):
        registry.add(entry)
    assert registry.held_by_class == {"async": 2, "process": 1}
    assert registry.class_of_job(crunch.id) == "process"
    registry.remove(crunch.id, crunch)
    registry.remove(crunch.id, crunch)  # twice: counted once
    assert registry.held_by_class == {"async": 2, "process": 0}
    assert registry.class_of_job(crunch.id) == "async"  # no longer held


class _Store:
    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def finish_batch(self, items: list[Finish]) -> dict[Any, str]:
        await self.gate.wait()
        return {item.job_id: item.status for item in items}


async def test_the_completer_counts_outstanding_outcomes_per_class_until_they_are_written() -> None:
    registry = ActiveJobRegistry(mixed().class_of)
    crunch = ActiveJob(claimed("examples.sum_primes"))
    registry.add(crunch)
    queued: list[str] = []
    handed_over = asyncio.Event()

    def on_queued(isolation: str) -> None:
        queued.append(isolation)
        handed_over.set()

    store = _Store()
    completer = Completer(store, give_up_after=5.0, on_queued=on_queued,  # type: ignore[arg-type]
                          class_of=registry.class_of_job)
    runner = asyncio.get_running_loop().create_task(completer.run())
    job = crunch.job
    finish = Finish(job_id=job.id, attempt=1, claim_epoch=1, status="succeeded", outcome="succeeded")
    written = asyncio.get_running_loop().create_task(completer.finish(finish))
    await asyncio.wait_for(handed_over.wait(), 5)
    assert queued == ["process"] and completer.outstanding_by_class == {"process": 1}
    store.gate.set()
    assert await written == "succeeded"
    assert completer.outstanding_by_class == {"process": 0} and completer.outstanding == 0
    runner.cancel()


class _Control:
    limited = False


def test_a_freed_slot_wakes_the_dispatcher_only_for_a_class_it_found_full() -> None:
    wake = ClaimWake(WorkerState(), _Control())  # type: ignore[arg-type]
    wake.full = {"process"}
    wake.slot_freed("async")
    assert not wake.event.is_set()  # async jobs were not what it lacked: no empty claim per async job
    wake.slot_freed("process")
    assert wake.event.is_set()
    wake.event.clear()
    wake.slot_freed()  # a slot of some class (an abandoned thread's verdict): any full class will do
    assert wake.event.is_set()
