"""Request batching across threads, shared by the real engines.

Requests submitted concurrently (from many rollouts, from the voters of one rollout, from many server clients) are
collected by one worker thread and handed to the subclass's ``_generate_batch``, grouped by sampling settings, at
most ``max_batch`` at a time. When the batch goes:

- requests of a cohort's members (``wfc.engines.cohort``: the threads of one ``run_rollouts``) go once every active
  member of their cohort is waiting on an engine, ordered by their contents, so a seeded run forms the same batches
  however its threads are timed; when no member has submitted or left for ``lockstep_timeout_s`` (a member
  blocked on something else: a slow tool, its own thread pool), the batch goes anyway and is counted in
  ``batching_stats``;
- other requests go when no new one has arrived for ``batch_wait_s`` (or ``max_batch`` are waiting).

Invariants:
- every submitted future is resolved exactly once, with a result or with the batch's exception; the worker survives
  a failing batch; a future its caller cancelled before its batch started is dropped unrun (a server withdraws the
  calls of an abandoned request this way);
- greedy requests with identical (messages, adapter) are generated once and each caller gets its own copy, since
  greedy decoding is a function of those two.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from typing import NamedTuple

from wfc.engines.base import Generation, GenerationRequest, SamplingParams
from wfc.engines.cohort import Cohort, current, request_order


def dedup_key(request: GenerationRequest, sampling: SamplingParams, position: int):
    """Requests with equal keys in one batch are generated once: only greedy ones. A sampled request's key is its
    position in the batch, so even the same request object submitted twice gets two independent samples."""
    if not sampling.greedy:
        return position
    return (json.dumps(request.messages, sort_keys=True), request.adapter, request.grammar)


class _Pending(NamedTuple):
    request: GenerationRequest
    future: Future
    cohort: Cohort | None


def _cohorts(pending: list[_Pending]) -> dict[int, Cohort]:
    """The distinct cohorts of ``pending``'s members, by identity."""
    return {id(p.cohort): p.cohort for p in pending if p.cohort is not None}


class BatchingEngine:
    """Base of engines that batch concurrent ``submit`` calls. Subclasses implement ``_generate_batch``."""

    engine_name = "engine"

    def __init__(self, *, max_batch: int = 256, batch_wait_s: float = 0.05, lockstep_timeout_s: float = 2.0):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.lockstep_timeout_s = lockstep_timeout_s
        self._cond = threading.Condition()
        self._pending: list[_Pending] = []
        self._last_arrival = 0.0  # the last submit
        self._last_event = 0.0  # the last submit or cohort member leaving
        self._lockstep = {"lockstep_batches": 0, "lockstep_timeouts": 0}
        self._worker: threading.Thread | None = None
        self._closed = False
        self._start_lock = threading.Lock()

    def _generate_batch(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        raise NotImplementedError

    @property
    def batching_stats(self) -> dict[str, int]:
        """Batches that went with a complete cohort, and those a cohort's timeout let go (module doc)."""
        with self._cond:
            return dict(self._lockstep)

    def submit(self, request: GenerationRequest) -> Future:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        self._ensure_worker()
        future: Future = Future()
        cohort = current()
        with self._cond:
            now = time.monotonic()
            self._pending.append(_Pending(request, future, cohort))
            self._last_arrival = self._last_event = now
            if cohort is not None:
                cohort.arrive()
                cohort.listen(id(self), self._wake)
            self._cond.notify_all()
        return future

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=5)
            self._worker = None

    def _wake(self) -> None:
        with self._cond:
            self._last_event = time.monotonic()
            self._cond.notify_all()

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._loop, name=f"wfc-{self.engine_name}-engine",
                                                daemon=True)
                self._worker.start()

    def _wait_left(self, now: float) -> float:
        """Seconds until the pending requests go (module doc), 0.0 when they go now, and then counted in
        ``batching_stats`` by the rule that let a cohort's batch go; called under ``_cond``."""
        cohorts = _cohorts(self._pending)
        if cohorts:
            if all(c.complete() for c in cohorts.values()):
                self._lockstep["lockstep_batches"] += 1
                return 0.0
            # Members still working submit or leave; none doing either for this long are blocked elsewhere.
            left = self.lockstep_timeout_s - (now - self._last_event)
            if left <= 0:
                self._lockstep["lockstep_timeouts"] += 1
                return 0.0
            return left  # a member's submit or leave wakes the worker sooner
        # Collect until the callers go quiet: concurrent callers submit within milliseconds of each other.
        if len(self._pending) >= self.max_batch:
            return 0.0
        return max(0.0, self.batch_wait_s - (now - self._last_arrival))

    def _take(self) -> list[_Pending] | None:
        """Wait until the pending requests go; take them, a cohort's in content order. None once closed and done
        (requests submitted before ``close`` still run)."""
        with self._cond:
            while True:
                if not self._pending:
                    if self._closed:
                        return None
                    self._cond.wait()
                    continue
                left = 0.0 if self._closed else self._wait_left(time.monotonic())
                if left <= 0.0:
                    break
                self._cond.wait(timeout=left)
            taken, self._pending = self._pending, []
        members = [p for p in taken if p.cohort is not None]
        for cohort in _cohorts(members).values():
            cohort.taken(sum(p.cohort is cohort for p in members))
        members.sort(key=lambda p: request_order(p.request))
        return members + [p for p in taken if p.cohort is None]

    def _loop(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            by_sampling: dict[SamplingParams, list] = {}
            for p in taken:
                if p.future.set_running_or_notify_cancel():  # False: cancelled while queued, nobody waits for it
                    by_sampling.setdefault(p.request.sampling, []).append((p.request, p.future))
            for sampling, group in by_sampling.items():
                for start in range(0, len(group), self.max_batch):
                    self._run(group[start:start + self.max_batch], sampling)

    def _run(self, items: list, sampling: SamplingParams) -> None:
        """Generate one batch of (request, future) pairs of one sampling setting and resolve every future."""
        keys_of = [dedup_key(request, sampling, i) for i, (request, _) in enumerate(items)]
        unique: dict = {}
        for key, (request, _) in zip(keys_of, items):
            unique.setdefault(key, request)
        keys = list(unique)
        try:
            results = self._generate_batch([unique[k] for k in keys], sampling)
        except BaseException as exc:  # every waiting caller learns of the failure; the worker lives on
            for _, future in items:
                future.set_exception(exc)
            return
        by_key = dict(zip(keys, results))
        for key, (_, future) in zip(keys_of, items):
            future.set_result(by_key[key].model_copy(deep=True))
