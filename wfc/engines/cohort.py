"""Cohorts: the threads of one batch of program runs, so an engine forms the same batches however threads are timed.

A batching engine that collects requests "until the callers go quiet" (``wfc.engines.batching``) forms batches that
follow thread timing: on a loaded machine one rollout's call lands a batch later, the batch layout changes, the
logits of every row change in their last float digits, and a seeded compile leaves its trajectory some steps later
(docs/results.md measured this on the demo). A cohort removes the timing: its members are the threads that run the
program runs of one ``run_rollouts`` (and the fan-out threads inside those runs), and an engine holding a request of
a cohort member generates only once **every** active member of that cohort is waiting on an engine. Each member's
next request is a function of its earlier results, so the batches are the same set of requests on every run; the
engine orders each batch by the requests' contents (``request_order``), so the rows are laid out the same too.

Membership is counted in slots, not threads, so a thread handing its work to helper threads never opens a gap in
which the engine could fire without it:

- ``cohort_map(fn, contexts, workers)`` runs ``fn`` in each context on ``workers`` threads, each holding one slot
  while it has items to run. Called by a member, the caller lends its own slot to the helpers (it blocks, so it
  waits on nothing the engine must count) and the last helper to finish hands it back; called outside any cohort,
  it opens a new cohort whose slots its helpers hold.
- An engine counts a member as waiting from ``submit`` until the request is taken into a batch.

Invariants: ``active`` counts the slots of threads that are running or waiting; ``0 <= waiting <= active`` whenever
an engine checks, unless threads the cohort does not count submit as members (a program's own thread pool that copies
contexts) or a member submits several requests before it waits: the batch then goes as soon as the count is reached,
so such programs run, but their batches may follow timing. A member blocked on anything other than an engine (a
slow tool, a thread pool of its own that does not copy contexts, such as ``dspy.Parallel``) holds the batch back, so
an engine that sees no member submit or leave for ``lockstep_timeout_s`` lets it go anyway and counts it
(``BatchingEngine.batching_stats``): such programs still run, batched by timing.
Requests from threads outside any cohort (a server's clients, a plain ``engine.generate``) are batched by timing as
before, and a batch that mixes them with a cohort's is laid out by their arrival.
"""

from __future__ import annotations

import contextvars
import json
import threading
from typing import Any, Callable, Sequence

from wfc.engines.base import GenerationRequest

_COHORT: contextvars.ContextVar["Cohort | None"] = contextvars.ContextVar("wfc_cohort", default=None)


class Cohort:
    """Slot counts of one cohort (module doc). Thread-safe; engines read ``complete`` under their own lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.active = 0
        self.waiting = 0
        self._listeners: dict[int, Callable[[], None]] = {}

    def listen(self, key: int, wake: Callable[[], None]) -> None:
        """``wake()`` is called whenever a member leaves (an engine holding this cohort's requests may go then)."""
        with self._lock:
            self._listeners[key] = wake

    def join(self, n: int = 1) -> None:
        with self._lock:
            self.active += n

    def leave(self, n: int = 1) -> None:
        with self._lock:
            self.active -= n
            if self.active < 0:
                raise RuntimeError("a cohort lost more slots than it had: a bug in wfc.engines.cohort")
            listeners = list(self._listeners.values())
        for wake in listeners:  # outside the lock: an engine reads ``complete`` under its own lock
            wake()

    def arrive(self) -> None:
        """A member submitted a request and waits on an engine."""
        with self._lock:
            self.waiting += 1

    def taken(self, n: int) -> None:
        """``n`` of the members' waiting requests were taken into a batch: those members are busy again."""
        with self._lock:
            self.waiting -= n

    def complete(self) -> bool:
        """Every active member waits on an engine: no request of this cohort is still to come for this round."""
        with self._lock:
            return self.waiting >= self.active


def current() -> Cohort | None:
    """The cohort the calling thread is a member of, or None."""
    return _COHORT.get()


def request_order(request: GenerationRequest) -> tuple:
    """A batch's order for a cohort's requests: by contents alone, so the same set of requests gets the same rows
    whatever order its threads submitted them in."""
    return (request.sampling.model_dump_json(), request.adapter or "", json.dumps(request.messages, sort_keys=True),
            request.grammar or "", -1 if request.seed is None else request.seed)


def cohort_map(fn: Callable[[Any], Any], items: Sequence, contexts: Sequence[contextvars.Context],
               workers: int) -> list:
    """``[ctx.run(fn, x) for ctx, x in zip(contexts, items)]`` on ``min(workers, len(items))`` threads, each a member
    of the caller's cohort (or of a new one when the caller has none) while it has items left. Every item runs; the
    first failing item's exception (in item order) is raised once all have finished."""
    if len(items) != len(contexts):
        raise ValueError(f"{len(items)} items for {len(contexts)} contexts: give one context per item")
    n = len(items)
    if n == 0:
        return []
    workers = max(1, min(workers, n))
    cohort = _COHORT.get()
    lent = cohort is not None
    if cohort is None:
        cohort = Cohort()
    for ctx in contexts:
        ctx.run(_COHORT.set, cohort)
    # A member lends its own slot to the helpers; the cohort must never count fewer slots than runnable threads.
    cohort.join(workers - 1 if lent else workers)
    results: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n
    lock = threading.Lock()
    state = {"next": 0, "running": workers}

    def helper() -> None:
        while True:
            with lock:
                i = state["next"]
                if i >= n:
                    state["running"] -= 1
                    last = state["running"] == 0
                    break
                state["next"] = i + 1
            try:
                results[i] = contexts[i].run(fn, items[i])
            except BaseException as exc:  # reported in item order once every item has run
                errors[i] = exc
        if not (lent and last):  # the last helper of a member hands the lent slot back instead of leaving
            cohort.leave(1)

    threads = [threading.Thread(target=helper, name=f"wfc-cohort-{k}", daemon=True) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for exc in errors:
        if exc is not None:
            raise exc
    return results
