"""Actors are bound to queues: `@actor(queue=..., queues=...)` validation, the shared pattern syntax, and
the enqueue checks that refuse a registered actor on a queue it may not run on (no database)."""

from __future__ import annotations

from typing import Any

import pytest

from taskq.actors.declaration import Actor, ActorRegistry, actor
from taskq.enqueue import check_options, prepare_insert
from taskq.exceptions import ActorDefinitionError, ConfigurationError, ScheduleDefinitionError
from taskq.patterns import matches_any, pattern_problem, queue_matches
from taskq.schedules import Schedule


def declare(registry: ActorRegistry | None = None, **options: Any) -> Actor[Any, Any]:
    async def body(payload: Any) -> None:
        return None

    return actor(name="bind.body", registry=registry if registry is not None else ActorRegistry(), **options)(body)


# -- the pattern syntax ------------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "queue", "expected"), [
    ("billing", "billing", True),
    ("billing", "billing-eu", False),
    ("billing", "Billing", False),
    ("billing-*", "billing-eu", True),
    ("billing-*", "billing-", True),
    ("billing-*", "billing", False),
    ("*-eu", "billing-eu", True),
    ("*", "anything at all", True),
    ("a*b*c", "a-x-b-y-c", True),
    ("a*b*c", "a-x-c", False),
    ("bill.ng", "billing", False),  # only `*` is special: a dot is a dot
    ("[ab]", "a", False),
    ("q?", "q1", False),
])
def test_queue_patterns_match_the_whole_name_with_star_as_any_run(pattern: str, queue: str, expected: bool) -> None:
    assert queue_matches(pattern, queue) is expected


def test_token_grants_and_actor_queues_agree_on_the_pattern_syntax() -> None:
    from taskq.ops.tokens import Grant

    for pattern, queue in [("billing-*", "billing-eu"), ("billing-*", "billing"), ("*x", "x"), ("a.c", "abc"),
                           ("*", ""), ("s*b*x", "sandbox")]:
        assert Grant("jobs:enqueue", pattern).matches(queue) is queue_matches(pattern, queue), (pattern, queue)


def test_pattern_problems_name_what_is_wrong() -> None:
    assert pattern_problem("billing-*") is None
    assert "1-255 characters" in str(pattern_problem(""))
    assert "1-255 characters" in str(pattern_problem("x" * 256))
    assert "NUL" in str(pattern_problem("a\x00b"))
    assert "string" in str(pattern_problem(5))
    assert "lone surrogates" in str(pattern_problem("\udc80"))
    assert matches_any(("a", "b*"), "bee") and not matches_any(("a", "b*"), "c")


# -- declarations --------------------------------------------------------------------------------------


def test_an_actor_runs_only_on_its_declared_queue_by_default() -> None:
    declared = declare(queue="billing")
    assert declared.queues == ("billing",)
    assert declared.allows_queue("billing") and not declared.allows_queue("sandbox")
    assert declare().queues == ("default",)


def test_queues_widens_the_binding_with_patterns_and_star_opts_into_any_queue() -> None:
    declared = declare(queue="billing", queues=["billing", "billing-*"])
    assert declared.queues == ("billing", "billing-*")
    assert declared.allows_queue("billing-eu") and not declared.allows_queue("sandbox")
    anywhere = declare(queue="billing", queues=["*"])
    assert anywhere.allows_queue("sandbox") and anywhere.allows_queue("billing")
    assert declare(queue="billing", queues=("billing-*", "billing")).queues == ("billing-*", "billing")


@pytest.mark.parametrize(("options", "fragment"), [
    ({"queue": "billing", "queues": ["sandbox"]},
     "queue 'billing' must match one of its queues= patterns (['sandbox'])"),
    ({"queue": "billing", "queues": []}, "queues must name at least one queue pattern"),
    ({"queue": "billing", "queues": "billing"}, "queues must be a list of queue patterns, not one string"),
    ({"queue": "billing", "queues": ["billing", ""]}, "queues: a queue pattern must be 1-255 characters"),
    ({"queue": "billing", "queues": ["billing", None]}, "queues: a queue pattern must be a string"),
    ({"queue": "billing", "queues": ["billing", "a\x00"]}, "queues: a queue pattern must not contain NUL"),
    ({"queue": "billing", "queues": 5}, "queues must be a list of queue patterns"),
])
def test_bad_queues_give_a_clear_actor_definition_error(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ActorDefinitionError) as raised:
        declare(**options)
    assert fragment in str(raised.value)


# -- enqueue checks --------------------------------------------------------------------------------------


def test_a_registered_actor_is_refused_on_a_queue_it_may_not_run_on() -> None:
    registry = ActorRegistry()
    refund = declare(registry, queue="billing")
    for target in (refund, "bind.body"):
        with pytest.raises(ConfigurationError) as raised:
            prepare_insert(target, None, registry=registry, max_payload_bytes=1024, queue="sandbox")
        message = str(raised.value)
        assert "'bind.body'" in message and "'sandbox'" in message and "['billing']" in message
        assert "@actor(queues=[...])" in message
        with pytest.raises(ConfigurationError):
            check_options(target, registry, queue="sandbox")
    assert prepare_insert(refund, None, registry=registry, max_payload_bytes=1024).options.queue == "billing"
    assert prepare_insert(refund, None, registry=registry, max_payload_bytes=1024,
                          queue="billing").options.queue == "billing"


def test_an_actor_no_process_here_knows_may_still_be_enqueued_by_name_on_any_queue() -> None:
    job = prepare_insert("somewhere.else", None, registry=ActorRegistry(), max_payload_bytes=1024, queue="sandbox")
    assert job.options.queue == "sandbox" and job.options.actor == "somewhere.else"


def test_queues_patterns_let_enqueue_pick_any_queue_they_match() -> None:
    registry = ActorRegistry()
    declare(registry, queue="billing", queues=["billing", "billing-*"])
    assert prepare_insert("bind.body", None, registry=registry, max_payload_bytes=1024,
                          queue="billing-eu").options.queue == "billing-eu"
    with pytest.raises(ConfigurationError):
        prepare_insert("bind.body", None, registry=registry, max_payload_bytes=1024, queue="sandbox")


def test_a_schedule_on_a_queue_its_actor_may_not_run_on_is_refused_at_declaration() -> None:
    refund = declare(queue="billing")
    with pytest.raises(ScheduleDefinitionError) as raised:
        Schedule("nightly-refunds", refund, every=60, queue="sandbox")
    assert "'sandbox'" in str(raised.value) and "nightly-refunds" in str(raised.value)
    assert Schedule("nightly-refunds", refund, every=60).queue == "billing"
    widened = declare(queue="billing", queues=["billing*"])
    assert Schedule("eu", widened, every=60, queue="billing-eu").queue == "billing-eu"
