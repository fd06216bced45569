"""Serve: one compiled artifact over HTTP (FastAPI), whole workflows and single roles.

Routes (every one but ``/health`` requires ``Authorization: Bearer <key>`` when the app has an API key):

- ``POST /v1/programs/<name>``: one run of the workflow on ``{"inputs": {...}, "return_graph": false}``; answers
  the outputs of its final prediction and, when asked, the rollout graph of that run. ``<name>`` is the manifest's.
- ``POST /v1/chat/completions``: OpenAI-compatible chat on one role. ``model`` is a role path (routed to that role's
  adapter, as the workflow would), an adapter name, or the base model (no adapter). Unset sampling fields take the
  artifact's sampling settings (``manifest.sampling``), so a plain request reproduces the role's own calls.
  ``stream=true`` answers server-sent events in OpenAI's format (``chat.completion.chunk`` objects, one content
  delta per completion token, then ``data: [DONE]``). The engines return whole completions (they batch requests
  and have no token callback), so the events are sent once the completion is generated: a client sees the format
  it expects, not an earlier first token.
- ``GET /v1/models``: those model names in OpenAI's list shape. ``GET /v1/programs``: the program and its inputs.
- ``GET /v1/stats``: load and counters (:class:`wfc.serve_limits.ServeStats`). ``GET /health``: liveness, what is
  served, and the current load.

Layout: :class:`ServeState` holds what the routes share (program, engine, limits, pool, gate, counters); each route
group is built by its own function (``health_router``, ``stats_router``, ``models_router``, ``programs_router``,
``chat_router``), and :func:`create_app` registers them, the API-key check on all but ``/health``.

Limits (:mod:`wfc.serve_limits`, set by :class:`ServeLimits`): body size and body time, prompt tokens (at most the
model's context), a bounded queue (``max_concurrent`` working, ``max_queue`` waiting), a per-request timeout; a
client that disconnects gives its slot back and its pending engine calls are withdrawn.

Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: 400 (a request the server refuses:
``max_tokens`` above the server's limit, a prompt over the token limit), 401 (API key), 404 (unknown program or
model), 408 (the body came too slowly), 413 (the body is too large), 422 (a body that does not validate, missing or
unknown program inputs), 429 (the queue is full; ``Retry-After`` says when to retry), 500 (the run ended in a
``format_error`` / ``crash``; the body says which), 503 (the engine raised; the server stays up), 504 (the request
timed out).

Concurrency: the engine batches requests that are in flight together (``HFEngine`` collects its queue), so nothing
here serialises requests. Chat requests are submitted and awaited as futures (no thread is held while a completion
is generated); a program run blocks a thread of the app's own pool (``max_concurrent`` threads) and its role calls
reach the engine from there, fan-out included, through the request's :class:`RequestWork` (so they can be
withdrawn).

Invariants: the app never mutates the artifact or the engine's adapters; a chat completion on a role is the request
that role's call would make, so greedy answers equal ``engine.generate`` with that adapter, streamed or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import hmac
import inspect
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from wfc.artifact import load, read_manifest
from wfc.constrain import response_format_grammar
from wfc.engines import make_engine
from wfc.engines.base import GenerationRequest, SamplingParams
from wfc.lower import trace
from wfc.serve_limits import (APIError, BodyLimit, Gate, PromptCounter, RequestCancelled, RequestWork, ServeLimits,
                              ServeStats, error_response)

DEFAULT_MAX_TOKENS_LIMIT = 1024
MAX_CHOICES = 16  # ``n`` per chat request; more is a client bug, not a workload
MAX_STOPS = 4  # OpenAI's own limit on stop strings


# ----- request bodies -------------------------------------------------------------------------------------------------
class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def as_dict(self) -> dict[str, str]:
        """The engine's message: text parts joined; OpenAI's ``developer`` role is the chat template's system."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat request, the fields this server honours. Other OpenAI fields are accepted and ignored, so
    stock clients work; unset sampling fields take the artifact's sampling settings."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="OpenAI's newer name for max_tokens")
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = Field(
        None, description="OpenAI's: {'type': 'json_schema', 'json_schema': {'schema': ...}}, 'json_object' or 'text'")

    def grammar(self) -> str | None:
        """The decoding grammar ``response_format`` asks for (``wfc.constrain.response_format_grammar``)."""
        return response_format_grammar(self.response_format)

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)


class ProgramRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: dict[str, Any]
    return_graph: bool = False


# ----- errors ---------------------------------------------------------------------------------------------------------
def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        hint = "" if loc else " (send a JSON object with the header Content-Type: application/json)"
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}{hint}")
    return "invalid request: " + "; ".join(parts)


# ----- what the artifact exposes --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProgramInputs:
    """The input fields of a run: ``fields`` in order, of which ``required`` must be given."""

    fields: tuple[str, ...]
    required: frozenset[str]

    def check(self, given: dict[str, Any]) -> None:
        missing = [f for f in self.fields if f in self.required and f not in given]
        unknown = sorted(set(given) - set(self.fields))
        if missing or unknown:
            problems = ([f"missing {missing}"] if missing else []) + ([f"unknown {unknown}"] if unknown else [])
            raise APIError(422, f"this program takes input fields {list(self.fields)} (required: "
                                f"{[f for f in self.fields if f in self.required]}); {', '.join(problems)}",
                           param="inputs", code="bad_inputs")


def program_inputs(program) -> ProgramInputs:
    """The inputs a run of ``program`` takes: ``forward``'s named parameters when it declares them (those without a
    default are required); else, for ``forward(**inputs)`` workflows, the input fields every role shares, in the
    first role's order (a workflow hands its inputs to each role; derived roles add inputs of their own, such as an
    aggregator's candidates, that the workflow fills in)."""
    # through the class: dspy warns on any ``module.forward`` access outside ``__call__``; [1:] drops ``self``
    params = list(inspect.signature(type(program).forward).parameters.values())[1:]
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return ProgramInputs(tuple(p.name for p in named),
                             frozenset(p.name for p in named if p.default is inspect.Parameter.empty))
    signatures = [predictor.signature for _, predictor in program.named_predictors()]
    if not signatures:
        raise ValueError(f"{type(program).__name__} has no roles: there is nothing to serve")
    shared = [f for f in signatures[0].input_fields if all(f in s.input_fields for s in signatures[1:])]
    fields = tuple(shared or signatures[0].input_fields)
    return ProgramInputs(fields, frozenset(fields))


def model_routes(manifest) -> dict[str, str | None]:
    """Chat model name -> adapter (``None``: the base model). Role paths first, then adapter names, then the base
    model: a name that is both a role and an adapter routes as the role does."""
    routes: dict[str, str | None] = dict(manifest.roles)
    for adapter in sorted({a for a in manifest.roles.values() if a is not None}):
        routes.setdefault(adapter, adapter)
    routes.setdefault(manifest.base_model, None)
    return routes


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def graph_view(graph) -> dict[str, Any]:
    """A rollout graph as the program route returns it: :meth:`RolloutGraph.to_dict` with each call's token ids and
    log-probs replaced by token counts, and without the example (the client sent it)."""
    view = graph.to_dict()
    view.pop("example", None)
    for call in view["calls"]:
        call["prompt_tokens"] = len(call.pop("prompt_ids"))
        call["completion_tokens"] = len(call.pop("completion_ids"))
        call.pop("logprobs")
    return _jsonable(view)


# ----- streaming ------------------------------------------------------------------------------------------------------
def text_pieces(text: str, ids: list[int], tokenizer) -> list[str]:
    """``text`` cut into one piece per completion token (a token that ends inside a character joins the next one);
    the pieces always join to ``text``. Without a tokenizer, one piece."""
    if tokenizer is None or not ids:
        return [text] if text else []
    pieces, emitted = [], ""
    for k in range(1, len(ids) + 1):
        so_far = tokenizer.decode(ids[:k], skip_special_tokens=True)
        if len(so_far) > len(emitted) and so_far.startswith(emitted) and not so_far.endswith("\ufffd"):
            pieces.append(so_far[len(emitted):])
            emitted = so_far
    if not text.startswith(emitted):
        return [text] if text else []
    return pieces + ([text[len(emitted):]] if len(text) > len(emitted) else [])


def sse_events(head: dict[str, Any], gens, tokenizer, usage: dict[str, int] | None):
    """OpenAI's chat stream of whole generations ``gens``: per choice a role delta, content deltas and a finish;
    then usage when asked (``stream_options.include_usage``), then ``[DONE]``. Yields ``data:`` lines."""
    def event(choices, **more) -> str:
        return f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', 'choices': choices, **more})}\n\n"

    for i, gen in enumerate(gens):
        yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}])
        for piece in text_pieces(gen.text, gen.completion_ids, tokenizer):
            yield event([{"index": i, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}])
        yield event([{"index": i, "delta": {}, "logprobs": None, "finish_reason": gen.finish_reason}])
    if usage is not None:
        yield event([], usage=usage)
    yield "data: [DONE]\n\n"


# ----- the app's state ------------------------------------------------------------------------------------------------
class ServeState:
    """What the routes share, built once per app: the compiled program and its engine, the settings (``limits``,
    ``max_tokens_limit``, the prompt limit they come to), the tables read off the artifact (chat ``routes``, program
    ``inputs``, sampling ``defaults``), the worker ``pool`` (``max_concurrent`` threads), the ``gate`` and the counters
    (``stats``). Checks the settings, so a bad one fails in :func:`create_app`, before anything is served."""

    def __init__(self, compiled, *, max_tokens_limit: int, limits: ServeLimits):
        try:  # the limit must itself be a valid request: the engine protocol bounds max_tokens too
            SamplingParams(max_tokens=max_tokens_limit)
        except ValidationError as exc:
            raise ValueError(f"max_tokens_limit={max_tokens_limit} is out of range: {exc.errors()[0]['msg']}") from None
        self.compiled, self.manifest, self.engine = compiled, compiled.manifest, compiled.engine
        self.limits, self.max_tokens_limit = limits, max_tokens_limit
        self.context = context = self.engine.context_length
        if limits.max_prompt_tokens is not None and context is not None and limits.max_prompt_tokens > context:
            raise ValueError(f"max_prompt_tokens={limits.max_prompt_tokens} is above the model's context of {context} "
                             "tokens; pass at most that, or None for the context itself")
        self.max_prompt_tokens = limits.max_prompt_tokens or context
        self.count = PromptCounter(self.engine)
        self.routes = model_routes(self.manifest)
        self.inputs = program_inputs(compiled.program)
        self.defaults = compiled.sampling()
        self.created = int(time.time())
        self.pool = ThreadPoolExecutor(max_workers=limits.max_concurrent, thread_name_prefix="wfc-serve")
        self.stats = ServeStats()
        self.gate = Gate(limits, self.stats)

    async def in_pool(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on a thread of the pool, awaited."""
        # a copy of the caller's context, so dspy.context settings follow the call onto the worker thread
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.pool, call)

    async def guarded(self, raw: Request, work) -> tuple[RequestWork, Any]:
        """``work(job)`` through the gate (queue, timeout, disconnect); an engine that raised is a 503."""
        job = RequestWork(self.engine, count=self.count, max_prompt_tokens=self.max_prompt_tokens, context=self.context)
        try:
            return job, await self.gate.run(raw.receive, work, job)
        except (APIError, RequestCancelled, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise self.engine_failed(exc) from exc

    def engine_failed(self, exc: BaseException, *, extra: dict[str, Any] | None = None) -> APIError:
        """The 503 for an engine that raised ``exc``, counted."""
        self.stats.outcomes["engine_error"] += 1
        return APIError(503, f"the engine failed: {type(exc).__name__}: {exc}; the server is still up, retry",
                        kind="server_error", code="engine_error", extra=extra)


# ----- the app --------------------------------------------------------------------------------------------------------
def create_app(compiled, *, api_key: str | None = None, max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT,
               limits: ServeLimits | None = None) -> FastAPI:
    """A FastAPI app serving ``compiled`` (a loaded :class:`wfc.CompiledProgram`) on its own engine.

    ``api_key``: when set, every route but ``/health`` requires ``Authorization: Bearer <api_key>``.
    ``max_tokens_limit``: the largest ``max_tokens`` a chat request may ask for (more is a 400).
    ``limits``: body size, prompt tokens, queue, timeouts (:class:`ServeLimits`; its defaults when ``None``).
    The app does not own the engine: whoever built it closes it.
    """
    if api_key is not None and not api_key:
        raise ValueError("api_key is empty: pass None to serve without a key, or a non-empty key")
    limits = limits or ServeLimits()
    state = ServeState(compiled, max_tokens_limit=max_tokens_limit, limits=limits)
    app = FastAPI(title=f"wfc: {state.manifest.name}", lifespan=_closes_pool(state.pool))
    app.add_middleware(BodyLimit, limits=limits, stats=state.stats)
    app.state.compiled, app.state.pool, app.state.stats, app.state.limits = compiled, state.pool, state.stats, limits
    for exc_class, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
    app.include_router(health_router(state))  # open
    keyed = [Depends(bearer_key(api_key))]
    for router in (stats_router(state), models_router(state), programs_router(state), chat_router(state)):
        app.include_router(router, dependencies=keyed)
    return app


def _closes_pool(pool: ThreadPoolExecutor):
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        pool.shutdown(wait=False, cancel_futures=True)
    return lifespan


def bearer_key(api_key: str | None):
    """The dependency that checks ``Authorization: Bearer <api_key>`` (a 401 otherwise; nothing when no key)."""
    async def check_key(authorization: str | None = Header(None)) -> None:
        if api_key is None:
            return
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                           kind="authentication_error", code="invalid_api_key")
    return check_key


# ----- error handlers: every error in OpenAI's shape ------------------------------------------------------------------
async def _api_error(_request: Request, exc: APIError):
    return exc.response()


async def _cancelled(_request: Request, _exc: RequestCancelled):
    return Response(status_code=499)  # nginx's "client closed request": nobody reads it


async def _invalid(_request: Request, exc: RequestValidationError):
    return APIError(422, _validation_message(exc)).response()


async def _http_error(_request: Request, exc: StarletteHTTPException):
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return APIError(exc.status_code, str(exc.detail), kind=kind).response()


async def _bug(_request: Request, exc: Exception):
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error")


ERROR_HANDLERS = {APIError: _api_error, RequestCancelled: _cancelled, RequestValidationError: _invalid,
                  StarletteHTTPException: _http_error, Exception: _bug}


# ----- routes: health and stats ---------------------------------------------------------------------------------------
def health_router(state: ServeState) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health():
        manifest, stats, limits = state.manifest, state.stats, state.limits
        return {"status": "ok", "program": manifest.name, "base_model": manifest.base_model,
                "roles": manifest.roles, "engine": type(state.engine).__name__,
                "load": {"active": stats.active, "waiting": stats.waiting, "max_concurrent": limits.max_concurrent,
                         "max_queue": limits.max_queue}}

    return router


def stats_router(state: ServeState) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/stats")
    async def server_stats():
        return {**state.stats.view(),
                "limits": {**dataclasses.asdict(state.limits), "max_prompt_tokens": state.max_prompt_tokens,
                           "context_length": state.context, "max_tokens_limit": state.max_tokens_limit}}

    return router


# ----- routes: models -------------------------------------------------------------------------------------------------
def models_router(state: ServeState) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models():
        data = []
        for name, adapter in state.routes.items():
            kind = "role" if name in state.manifest.roles else ("adapter" if adapter is not None else "base")
            data.append({"id": name, "object": "model", "created": state.created, "owned_by": "wfc", "kind": kind,
                         "adapter": adapter})
        return {"object": "list", "data": data}

    return router


# ----- routes: programs -----------------------------------------------------------------------------------------------
def programs_router(state: ServeState) -> APIRouter:
    router = APIRouter()
    manifest, compiled = state.manifest, state.compiled

    def known_program(name: str) -> str:
        if name != manifest.name:
            raise APIError(404, f"no program {name!r} here; this server runs {manifest.name!r}",
                           kind="not_found_error", param="name", code="program_not_found")
        return name

    @router.get("/v1/programs")
    async def list_programs():
        return {"object": "list", "data": [{"id": manifest.name, "object": "program",
                                            "inputs": list(state.inputs.fields), "roles": manifest.roles}]}

    @router.post("/v1/programs/{name}")
    async def run_program(body: ProgramRequest, raw: Request, name: str = Depends(known_program)):
        state.inputs.check(body.inputs)

        async def work(job: RequestWork):  # trace never raises: failures are its status, the causes are on job
            return await state.in_pool(trace, compiled.program, dict(body.inputs), job, adapters=compiled.roles,
                                       sampling=state.defaults)

        job, graph = await state.guarded(raw, work)
        if job.refused is not None:
            raise job.refused
        view = {"graph": graph_view(graph)} if body.return_graph else {}
        if graph.status == "crash" and job.engine_error is not None:
            raise state.engine_failed(job.engine_error, extra=view)
        if graph.status != "ok":
            raise APIError(500, f"the run ended with {graph.status}: {graph.error}", kind=graph.status,
                           code="run_failed", extra=view)
        return {"id": f"run-{uuid.uuid4().hex}", "object": "program.run", "program": name, "status": graph.status,
                "outputs": _jsonable(graph.outputs), **view}

    return router


# ----- routes: chat completions ---------------------------------------------------------------------------------------
def chat_router(state: ServeState) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        request = generation_request(body, state)

        async def work(job: RequestWork):
            # count and submit off the event loop (tokenising a long prompt takes a while), then await the futures
            futures = await state.in_pool(lambda: [job.submit(request) for _ in range(body.n)])
            return await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))

        _job, gens = await state.guarded(raw, work)
        return chat_response(body, gens, state.engine.tokenizer)

    return router


def generation_request(body: ChatCompletionRequest, state: ServeState) -> GenerationRequest:
    """The engine request a chat body asks for: its model routed to an adapter, unset sampling fields from the
    artifact's defaults, ``response_format`` as a grammar. A body the server refuses is a 404 or a 400."""
    routes, defaults, max_tokens_limit = state.routes, state.defaults, state.max_tokens_limit
    if body.model not in routes:
        raise APIError(404, f"unknown model {body.model!r}; this server has {list(routes)} (roles, adapters, "
                            "the base model)", kind="not_found_error", param="model", code="model_not_found")
    if len(body.stops()) > MAX_STOPS:
        raise APIError(400, f"at most {MAX_STOPS} stop strings, got {len(body.stops())}", param="stop")
    max_tokens = body.max_tokens or body.max_completion_tokens or min(defaults.max_tokens, max_tokens_limit)
    if max_tokens > max_tokens_limit:
        raise APIError(400, f"max_tokens={max_tokens} is above this server's limit of {max_tokens_limit}; ask "
                            f"for at most {max_tokens_limit} (the server sets it with --max-tokens-limit)",
                       param="max_tokens", code="max_tokens_too_large")
    sampling = SamplingParams(
        temperature=defaults.temperature if body.temperature is None else body.temperature,
        top_p=defaults.top_p if body.top_p is None else body.top_p,
        max_tokens=max_tokens, stop=body.stops() or defaults.stop)
    try:
        grammar = body.grammar()
    except ValueError as exc:
        raise APIError(400, str(exc), param="response_format", code="invalid_response_format") from None
    return GenerationRequest(messages=tuple(m.as_dict() for m in body.messages), adapter=routes[body.model],
                             sampling=sampling, grammar=grammar)


def chat_response(body: ChatCompletionRequest, gens, tokenizer):
    """The answer to a chat body from its generations ``gens``: a ``chat.completion``, or its event stream."""
    prompt_tokens = len(gens[0].prompt_ids)
    completion_tokens = sum(len(g.completion_ids) for g in gens)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        events = sse_events(head, gens, tokenizer, usage if include_usage else None)
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return {
        **head, "object": "chat.completion",
        "choices": [{"index": i, "message": {"role": "assistant", "content": g.text}, "logprobs": None,
                     "finish_reason": g.finish_reason} for i, g in enumerate(gens)],
        "usage": usage,
    }


# ----- running it -----------------------------------------------------------------------------------------------------
class ServerThread:
    """uvicorn serving ``app`` on a background thread of this process (tests, benchmarks, notebooks).
    ``port=0`` picks a free port; ``url`` is known once the context is entered."""

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 startup_timeout_s: float = 30.0):
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.thread = threading.Thread(target=self.server.run, name="wfc-serve-uvicorn", daemon=True)
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.server.should_exit = True
                raise RuntimeError(f"the server did not start on {self.host} (port in use?)")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def serve(path, *, engine: str = "hf", model: str | None = None, host: str = "127.0.0.1", port: int = 8000,
          api_key: str | None = None, max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT,
          limits: ServeLimits | None = None, log_level: str = "info", trust_code: bool = False,
          program_import_path: str | None = None) -> None:
    """Load the artifact at ``path`` on a new ``engine`` (``hf`` or ``vllm``) and serve it until interrupted.
    ``model`` overrides where the base weights come from (its checksum must still match the manifest's);
    ``limits``: see :class:`ServeLimits`; ``trust_code``, ``program_import_path``: see :func:`wfc.artifact.load`."""
    import uvicorn

    manifest = read_manifest(path)  # a wrong directory fails here, before a model loads
    built = make_engine(engine, model or manifest.base_model)
    try:
        compiled = load(path, engine=built, trust_code=trust_code, program_import_path=program_import_path)
        app = create_app(compiled, api_key=api_key, max_tokens_limit=max_tokens_limit, limits=limits)
        uvicorn.run(app, host=host, port=port, log_level=log_level)
    finally:
        built.close()
