"""Limits of ``wfc serve``: what one request may cost, how many are served at once, and what the server remembers.

A request goes through these stages, each with its own bound and its own answer when the bound is hit:

1. :class:`BodyLimit` (ASGI middleware, before any route): the body is read here, at most ``max_body_bytes``
   (a ``Content-Length`` above it is refused before a byte is read; chunked bodies are counted as they arrive)
   and within ``body_timeout_s`` (a slow-loris client is cut off). 413 / 408. No queue slot is held yet.
2. the route validates the body (422) and its own fields (400, 404).
3. :class:`Gate`: at most ``max_concurrent`` requests work at once and ``max_queue`` more wait; beyond that 429 with
   ``Retry-After``. From admission on, the request runs under ``request_timeout_s`` (504) and is abandoned when its
   client disconnects; either way its slot is freed at once and its work is cancelled (:class:`RequestWork`).
4. :class:`RequestWork`, the engine as one request sees it: every prompt is counted against ``max_prompt_tokens``
   and the model's context (400), and an engine that raises is recorded so the route answers 503.

Invariants: ``active <= max_concurrent`` and ``waiting <= max_queue`` at every moment; every admitted request leaves
the gate exactly once (answered, timed out, or disconnected) and gives its slot back then; :class:`ServeStats` holds
a fixed amount of memory however long the server runs (counters and a ring of recent latencies).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import json
import math
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from fastapi.responses import JSONResponse

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: ~250k tokens of text, far beyond any context this serves
DEFAULT_MAX_CONCURRENT = 64
DEFAULT_MAX_QUEUE = 256
DEFAULT_REQUEST_TIMEOUT_S = 300.0
DEFAULT_BODY_TIMEOUT_S = 30.0
LATENCY_RING = 1024  # latencies kept for percentiles: the most recent ones only


@dataclass(frozen=True)
class ServeLimits:
    """Bounds of a server. ``max_prompt_tokens=None``: the model's context length (when the engine knows it)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_tokens: int | None = None
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    max_queue: int = DEFAULT_MAX_QUEUE
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S

    def __post_init__(self):
        for name in ("max_body_bytes", "max_concurrent"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0 (0: refuse when all slots work), got {self.max_queue}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1 or None (the model's context), "
                             f"got {self.max_prompt_tokens}")
        for name in ("request_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")


def error_response(status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None,
                   extra: dict[str, Any] | None = None) -> JSONResponse:
    """OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}, **(extra or {})}
    return JSONResponse(body, status_code=status, headers=headers)


class APIError(Exception):
    """A request the server answers with ``status`` and an OpenAI-shaped error body."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, extra: dict[str, Any] | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.extra, self.headers = extra or {}, dict(headers or {})

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer", **self.headers} if self.status == 401 else self.headers
        return error_response(self.status, self.message, kind=self.kind, param=self.param, code=self.code,
                              headers=headers or None, extra=self.extra)


# ----- statistics -----------------------------------------------------------------------------------------------------
class ServeStats:
    """Counters and a ring of recent latencies: fixed memory however many requests pass. Event-loop thread only."""

    def __init__(self, ring: int = LATENCY_RING):
        self.started = time.time()
        self.requests = 0
        self.statuses: collections.Counter = collections.Counter()  # HTTP status -> responses (a small set)
        self.outcomes: collections.Counter = collections.Counter()  # named refusals: queue_full, timeout, ...
        self.latencies: collections.deque = collections.deque(maxlen=ring)  # seconds of recent 200 answers
        self.active = self.waiting = self.max_active = self.max_waiting = 0

    def latency_ms(self, q: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return round(1000 * ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 1)

    def retry_after_s(self, max_concurrent: int) -> int:
        """A hint for refused clients: the time the queue ahead of them takes to drain, from recent latencies."""
        typical = (sum(self.latencies) / len(self.latencies)) if self.latencies else 1.0
        return max(1, min(60, math.ceil(typical * (self.waiting + 1) / max_concurrent)))

    def view(self) -> dict[str, Any]:
        return {"uptime_s": round(time.time() - self.started, 1), "requests": self.requests,
                "active": self.active, "waiting": self.waiting, "max_active": self.max_active,
                "max_waiting": self.max_waiting, "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "outcomes": dict(sorted(self.outcomes.items())),
                "latency_ms": {"window": len(self.latencies), "p50": self.latency_ms(50), "p90": self.latency_ms(90),
                               "p99": self.latency_ms(99)}}


# ----- stage 1: the body ----------------------------------------------------------------------------------------------
class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


class BodyLimit:
    """ASGI middleware: reads each HTTP request's body within ``max_bytes`` and ``timeout_s`` before the app runs,
    then replays it; counts every response status in ``stats``."""

    def __init__(self, app, *, limits: ServeLimits, stats: ServeStats):
        self.app, self.limits, self.stats = app, limits, stats

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        self.stats.requests += 1
        t0 = time.perf_counter()

        async def counted_send(message):
            if message["type"] == "http.response.start":
                self.stats.statuses[message["status"]] += 1
                if message["status"] == 200 and scope["path"].startswith("/v1/") and scope["method"] == "POST":
                    self.stats.latencies.append(time.perf_counter() - t0)
            await send(message)

        refusal = self._check_length(scope)
        if refusal is None:
            try:
                body = await asyncio.wait_for(self._read(receive), self.limits.body_timeout_s)
            except _ClientGone:
                self.stats.outcomes["disconnected_during_body"] += 1
                return
            except _BodyTooLarge:
                refusal = self._too_large()
            except asyncio.TimeoutError:
                self.stats.outcomes["body_timeout"] += 1
                refusal = error_response(408, f"the request body did not arrive within {self.limits.body_timeout_s:g} "
                                              "s; send it at once", code="body_timeout",
                                         headers={"Connection": "close"})
        if refusal is not None:
            return await refusal(scope, receive, counted_send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's disconnect, which routes watch for

        await self.app(scope, replay, counted_send)

    def _check_length(self, scope):
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.strip().isdigit():
                    return error_response(400, f"malformed Content-Length {value[:40].decode('latin-1')!r}",
                                          code="bad_content_length", headers={"Connection": "close"})
                if int(value) > self.limits.max_body_bytes:
                    return self._too_large(int(value))
        return None

    def _too_large(self, length: int | None = None) -> JSONResponse:
        self.stats.outcomes["body_too_large"] += 1
        got = f"{length} bytes" if length is not None else "more"
        return error_response(413, f"the request body is {got}; this server accepts at most "
                                   f"{self.limits.max_body_bytes} bytes (set with --max-body-bytes)",
                              code="request_too_large", headers={"Connection": "close"})

    async def _read(self, receive) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


# ----- stage 3: the gate ----------------------------------------------------------------------------------------------
class RequestCancelled(Exception):
    """The request was abandoned (timed out, or its client left): its remaining engine calls are not made."""


class Gate:
    """Admission of requests: ``max_concurrent`` work at once, ``max_queue`` wait, the rest get 429 at once.
    Create it inside the server's event loop's lifetime; use it from that loop only."""

    def __init__(self, limits: ServeLimits, stats: ServeStats):
        self.limits, self.stats = limits, stats
        self._slots = asyncio.Semaphore(limits.max_concurrent)

    async def run(self, receive, work: Callable[["RequestWork"], Awaitable[Any]], job: "RequestWork") -> Any:
        """``await work(job)`` in a slot, under the request timeout, abandoned if the client disconnects
        (``receive`` is the request's ASGI receive, whose next message after the body is the disconnect)."""
        stats, limits = self.stats, self.limits
        if stats.active + stats.waiting >= limits.max_concurrent + limits.max_queue:
            stats.outcomes["queue_full"] += 1
            raise APIError(429, f"the server is at capacity ({limits.max_concurrent} requests working, "
                                f"{limits.max_queue} waiting); retry later", kind="rate_limit_error",
                           code="server_busy", headers={"Retry-After": str(stats.retry_after_s(limits.max_concurrent))})
        task = asyncio.ensure_future(self._in_slot(work, job))
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            done, _ = await asyncio.wait({task, watcher}, timeout=limits.request_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                return task.result()
            if watcher in done:
                stats.outcomes["disconnected"] += 1
                raise RequestCancelled("the client disconnected")
            stats.outcomes["timeout"] += 1
            raise APIError(504, f"the request did not finish within {limits.request_timeout_s:g} s (the server's "
                                "--request-timeout); its work was cancelled", kind="timeout_error", code="timeout")
        finally:
            watcher.cancel()
            if not task.done():
                job.cancel()
                task.cancel()

    async def _in_slot(self, work, job):
        stats = self.stats
        stats.waiting += 1
        stats.max_waiting = max(stats.max_waiting, stats.waiting)
        try:
            await self._slots.acquire()
        finally:
            stats.waiting -= 1
        stats.active += 1
        stats.max_active = max(stats.max_active, stats.active)
        try:
            return await work(job)
        finally:
            stats.active -= 1
            self._slots.release()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


# ----- stage 4: the engine as one request sees it ---------------------------------------------------------------------
class PromptCounter:
    """Counts a chat prompt's tokens as the engine will see them (its chat template, its tokenizer), one count at a
    time on a private copy of the engine's tokenizer: a fast tokenizer keeps its padding settings on the instance,
    so counting on the engine's own one while its worker tokenizes a padded batch breaks that batch. ``None`` for
    engines that cannot count (no ``tokenizer``, e.g. a scripted fake built without one)."""

    def __init__(self, engine):
        tokenizer = engine.tokenizer
        self._tokenizer = copy.deepcopy(tokenizer) if tokenizer is not None else None
        self._lock = threading.Lock()

    def __call__(self, messages) -> int | None:
        if self._tokenizer is None:
            return None
        with self._lock:  # same rendering as HFEngine.encode_prompt
            text = self._tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
            return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])


class RequestWork:
    """The engine as one request sees it: counts each prompt against the limits before submitting it, and can be
    cancelled as a whole (pending engine calls are withdrawn, callers blocked on them are released, later calls
    refused). A program run's role calls go through it from their threads; ``refused`` and ``engine_error`` tell
    the route why a run crashed."""

    def __init__(self, engine, *, count: PromptCounter, max_prompt_tokens: int | None, context: int | None):
        self.engine, self.max_prompt_tokens, self.context = engine, max_prompt_tokens, context
        self.refused: APIError | None = None
        self.engine_error: BaseException | None = None
        self.prompt_tokens: int | None = None
        self._count = count
        self._counted: dict[str, int] = {}
        self._lock = threading.RLock()  # re-entered: cancelling an engine future runs its done-callback at once
        self._pending: list[tuple[Future, Future]] = []
        self._cancelled = False

    def check(self, request) -> None:
        """400 when the prompt of ``request`` is over the prompt limit, or prompt + max_tokens over the context."""
        key = json.dumps(request.messages)
        if key not in self._counted:
            self._counted[key] = self._count(request.messages)
        n = self.prompt_tokens = self._counted[key]
        if n is None:
            return  # an engine that cannot count (a scripted fake): no token limit to apply
        if self.max_prompt_tokens is not None and n > self.max_prompt_tokens:
            raise APIError(400, f"the prompt is {n} tokens; this server accepts at most {self.max_prompt_tokens} "
                                "prompt tokens (the model's context, or --max-prompt-tokens): shorten the messages",
                           param="messages", code="prompt_too_long")
        if self.context is not None and n + request.sampling.max_tokens > self.context:
            raise APIError(400, f"the prompt is {n} tokens and max_tokens is {request.sampling.max_tokens}: together "
                                f"above the model's context of {self.context} tokens; lower max_tokens or shorten the "
                                "messages", param="max_tokens", code="context_length_exceeded")

    def submit(self, request) -> Future:
        if self._cancelled:
            raise RequestCancelled("the request was abandoned")
        try:
            self.check(request)
        except APIError as exc:
            self.refused = exc
            raise
        try:
            inner = self.engine.submit(request)
        except Exception as exc:
            self.engine_error = exc
            raise
        outer: Future = Future()
        with self._lock:
            self._pending.append((inner, outer))
            if self._cancelled:  # cancelled while submitting: withdraw at once
                inner.cancel()
                outer.set_exception(RequestCancelled("the request was abandoned"))
                return outer
        inner.add_done_callback(lambda f: self._settle(f, outer))
        return outer

    def _settle(self, inner: Future, outer: Future) -> None:
        with self._lock:
            if outer.done() or inner.cancelled():
                return
            exc = inner.exception()
            if exc is not None:
                self.engine_error = exc
                _set(outer, exc=exc)
            else:
                _set(outer, result=inner.result())

    def generate(self, requests):
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def cancel(self) -> None:
        """Withdraw this request's pending engine calls (a batching engine drops them unrun) and release its callers."""
        with self._lock:
            self._cancelled = True
            for inner, outer in self._pending:
                inner.cancel()
                if not outer.done():
                    _set(outer, exc=RequestCancelled("the request was abandoned"))
            self._pending.clear()

    def __getattr__(self, name):  # tokenizer, adapters, ...: the engine's own
        return getattr(self.engine, name)


def _set(future: Future, *, result=None, exc: BaseException | None = None) -> None:
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except InvalidStateError:  # the caller cancelled its future first: nobody waits for it
        pass
