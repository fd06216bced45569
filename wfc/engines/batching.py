"""Request batching across threads, shared by the real engines.

Requests submitted concurrently (from many rollouts, from the voters of one rollout, from many server clients) are
collected by one worker thread until no new request arrives for ``batch_wait_s`` (or ``max_batch`` are waiting),
then handed to the subclass's ``_generate_batch`` grouped by sampling settings.

Invariants:
- every submitted future is resolved exactly once, with a result or with the batch's exception; the worker survives
  a failing batch; a future its caller cancelled before its batch started is dropped unrun (a server withdraws the
  calls of an abandoned request this way);
- greedy requests with identical (messages, adapter) are generated once and each caller gets its own copy, since
  greedy decoding is a function of those two.
"""

from __future__ import annotations

import json
import queue
import threading
from concurrent.futures import Future

from wfc.engines.base import Generation, GenerationRequest, SamplingParams


def dedup_key(request: GenerationRequest, sampling: SamplingParams, position: int):
    """Requests with equal keys in one batch are generated once: only greedy ones. A sampled request's key is its
    position in the batch, so even the same request object submitted twice gets two independent samples."""
    if not sampling.greedy:
        return position
    return (json.dumps(request.messages, sort_keys=True), request.adapter, request.grammar)


class BatchingEngine:
    """Base of engines that batch concurrent ``submit`` calls. Subclasses implement ``_generate_batch``."""

    engine_name = "engine"

    def __init__(self, *, max_batch: int = 256, batch_wait_s: float = 0.05):
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self._queue: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._closed = False
        self._start_lock = threading.Lock()

    def _generate_batch(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        raise NotImplementedError

    def submit(self, request: GenerationRequest) -> Future:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        self._ensure_worker()
        future: Future = Future()
        self._queue.put((request, future))
        return future

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._closed = True
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=5)
            self._worker = None

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._loop, name=f"wfc-{self.engine_name}-engine",
                                                daemon=True)
                self._worker.start()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            # Collect until the callers go quiet: concurrent rollouts submit within milliseconds of each other.
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get(timeout=self.batch_wait_s)
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            by_sampling: dict[SamplingParams, list] = {}
            for request, future in batch:
                if future.set_running_or_notify_cancel():  # False: cancelled while queued, nobody waits for it
                    by_sampling.setdefault(request.sampling, []).append((request, future))
            for sampling, items in by_sampling.items():
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
                    continue
                by_key = dict(zip(keys, results))
                for key, (_, future) in zip(keys_of, items):
                    future.set_result(by_key[key].model_copy(deep=True))
