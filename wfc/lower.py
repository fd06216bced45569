"""Lowering: run a DSPy program on an example under a tracer and get its rollout graph.

How a call finds its role: every rollout runs on its own copy of the program, whose predictors each hold their own
``dspy.LM`` handle (DSPy 3.4 custom engine interface). That handle's engine, a ``RoleEngine``, knows the role path,
the adapter it routes to, the sampling settings and the rollout's recorder. No global or thread-local lookup is
needed, so rollouts and the fan-out threads inside them can run concurrently and still land in the right graph.

Role identity is the dotted path from ``named_predictors()``; two roles built from the same Signature class are two
roles.

Fan-out branches: ``parallel_map`` runs item i in a context whose branch path is the caller's plus ``(i,)``. A call
is placed by (branch path, its count among the role's calls in that branch), which follows the program, not thread
timing; once the rollout ends, each role's calls are numbered (``invocation``) in that order: the role's calls outside
any fan-out first, in submission order, then branch by branch (Voting's voter i is invocation i).

Stopped rollouts: ``trace(..., stop_roles={"optimizer"})`` ends the run at the first call of any of those roles,
before it is generated (no node, no tokens), and takes as the run's outputs the latest answer made before it: the
outputs of the last finished ``ok`` call that gave every output field of the stopping role (the answer a reviser
would have revised). A compile skips its frozen roles' calls in training rollouts this way
(``MMGRPOConfig.skip_frozen``): calls that train nothing and whose output no trained call's reward reads.
The stop is a ``BaseException`` so that a program's own ``except Exception`` (a vote that drops a failed voter)
cannot swallow it.

Seeded rollouts: ``trace(..., seed=s)`` gives every call its own sampling seed, ``derive_seed(s, role, branch path,
count)``, so a rollout samples the same tokens from the same logits and numbers them the same way. The logits
themselves depend on a batch's layout in their last float digits; ``run_rollouts`` and ``parallel_map`` run their
threads as one cohort (``wfc.engines.cohort``), so a batching engine forms the same batches whatever the timing.
"""

from __future__ import annotations

import contextvars
import copy
import hashlib
import itertools
import threading
import traceback
from typing import Any, Callable, Iterable, Mapping

import dspy
from dspy.lm15 import Message, Response, TextPart, Usage
from dspy.utils.exceptions import AdapterParseError
from pydantic import BaseModel, ConfigDict, Field

from wfc.adapter import CompactChatAdapter
from wfc.constrain import DEFAULT_FIELD_TOKENS, field_budgets, react_tools, signature_grammar
from wfc.engines.base import Engine, GenerationRequest, SamplingParams
from wfc.engines.cohort import cohort_map
from wfc.retrieve import select_demos
from wfc.rollout import CallNode, RolloutGraph

RoleAdapters = Mapping[str, str | None]


class Decoding(BaseModel):
    """How calls are decoded beyond sampling. ``structured``: every call follows its signature's grammar
    (``wfc.constrain``), so it parses by construction; ``field_tokens``: a free-text output field's token budget,
    unless the field carries its own (``wfc.constrain.with_budgets``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    structured: bool = True
    field_tokens: int = Field(DEFAULT_FIELD_TOKENS, ge=1)


# the fan-out branch a call is made in: () outside any parallel_map, (i,) in item i, (i, j) in a nested one
_BRANCH: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar("wfc_branch", default=())


class RolloutStop(BaseException):
    """Raised by a stopping role's call (``trace``'s ``stop_roles``): ends the run there. Caught by ``trace``."""

    def __init__(self, role: str):
        super().__init__(role)
        self.role = role


def derive_seed(*parts: Any) -> int:
    """A seed in [0, 2**31) determined by ``parts`` alone (their ``repr``s, in order): stable across processes and
    runs, unlike ``hash``; 31 bits, which every engine's seed argument takes."""
    digest = hashlib.blake2b("\x1f".join(repr(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 2**31


def roles(program: dspy.Module) -> dict[str, dspy.Predict]:
    """Role path -> predictor. A program without predictors is an error (there is nothing to lower or train)."""
    if not isinstance(program, dspy.Module):
        raise TypeError(f"expected a dspy.Module, got {type(program).__name__}: wrap your roles in a dspy.Module")
    found = dict(program.named_predictors())
    if not found:
        raise ValueError(
            f"{type(program).__name__} has no predictors: give it at least one dspy.Predict / dspy.ChainOfThought "
            "attribute (the roles wfc lowers and trains)"
        )
    return found


def copy_program(program: dspy.Module) -> dspy.Module:
    """A deep copy of ``program`` that shares (never copies) the LM handles its predictors hold."""
    memo: dict[int, Any] = {}
    for _, predictor in program.named_predictors():
        lm = getattr(predictor, "lm", None)
        if lm is not None:
            memo[id(lm)] = None  # the copy starts unbound; bind() gives it handles of its own
    return copy.deepcopy(program, memo)


class _Recorder:
    """Collects the calls of one rollout. Thread-safe: fan-out calls record concurrently. Each call is placed by
    (branch path, count of the role's calls in that branch so far), which does not depend on thread timing."""

    def __init__(self, seed: int | None = None):
        self.seed = seed  # the rollout's seed: each call samples with derive_seed(seed, role, *place)
        self._lock = threading.Lock()
        self._clock = itertools.count(1)
        self._ids = itertools.count()
        self._counts: dict[tuple[str, tuple[int, ...]], int] = {}
        self.places: dict[int, tuple[tuple[int, ...], int]] = {}  # call id -> (branch path, count in the branch)
        self.calls: list[CallNode] = []

    def start(self, role: str, adapter: str | None, messages: list[dict[str, str]], temperature: float) -> CallNode:
        branch = _BRANCH.get()
        with self._lock:
            count = self._counts.get((role, branch), 0)
            self._counts[(role, branch)] = count + 1
            node = CallNode(  # invocation is provisional until renumber() orders the role's calls by place
                id=next(self._ids), role=role, invocation=count, adapter=adapter, messages=messages,
                temperature=temperature, started=next(self._clock),
            )
            self.places[node.id] = (branch, count)
            self.calls.append(node)
            return node

    def seed_of(self, node: CallNode) -> int | None:
        """The sampling seed of a recorded call (None in an unseeded rollout)."""
        return None if self.seed is None else derive_seed(self.seed, node.role, *self.places[node.id])

    def renumber(self) -> None:
        """Number each role's calls by place (module doc): sequential calls keep submission order, fan-out calls
        follow their branch index."""
        by_role: dict[str, list[CallNode]] = {}
        for node in self.calls:
            by_role.setdefault(node.role, []).append(node)
        for nodes in by_role.values():
            for k, node in enumerate(sorted(nodes, key=lambda n: self.places[n.id])):
                node.invocation = k

    def tick(self) -> int:
        with self._lock:
            return next(self._clock)


def request_messages(request) -> list[dict[str, str]]:
    """A DSPy engine request's system prompt and turns as chat messages (the system text joined from its parts)."""
    out = []
    if request.system is not None:
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system)
        out.append({"role": "system", "content": system})
    out.extend({"role": m.role, "content": m.text or ""} for m in request.messages)
    return out


def call_adapter() -> dspy.Adapter:
    """The DSPy adapter that formats and parses a lowered call: DSPy's setting (``dspy.context(adapter=...)``), else
    the compact one. Read at call time, so what a compile formats outside a call (a demo as the call it shows) is
    formatted the same way."""
    return dspy.settings.adapter or CompactChatAdapter()


class RoleEngine:
    """DSPy engine object for one role of one rollout: routes to the wfc engine and records a CallNode per call."""

    def __init__(self, engine: Engine, role: str, adapter: str | None, signature, sampling: SamplingParams,
                 recorder: _Recorder | None, stop: bool = False, *, decoding: Decoding = Decoding(),
                 tools: Mapping[str, Mapping[str, Any]] | None = None):
        self.engine = engine
        self.decoding = decoding
        self.tools = tools  # a ReAct role's tools (name -> JSON schema of the arguments): one grammar branch each
        self.stop = stop  # the run ends at this role's first call (trace's stop_roles)
        self.role = role
        self.adapter = adapter
        self.signature = signature
        self.sampling = sampling
        self.recorder = recorder

    def complete(self, request):
        if self.stop:
            raise RolloutStop(self.role)
        messages = request_messages(request)
        cfg = request.config
        parser = self._parser()
        sampling = self.sampling.model_copy(update={
            "temperature": cfg.temperature if cfg.temperature is not None else self.sampling.temperature,
            "max_tokens": cfg.max_tokens if cfg.max_tokens is not None else self.sampling.max_tokens,
            "stop": tuple(cfg.stop) if cfg.stop else self.sampling.stop,
            # a Literal output is decoded as one of its values when the adapter in effect reads the completion as
            # that value (the compact adapter's single-output format)
            "choices": parser.choices(self.signature) if isinstance(parser, CompactChatAdapter) else (),
        })
        grammar = None if sampling.choices else self.grammar(parser, sampling.max_tokens)
        node = self.recorder.start(self.role, self.adapter, messages, sampling.temperature) if self.recorder else None
        if node is not None:
            node.grammar = grammar
        seed = self.recorder.seed_of(node) if node is not None else None
        try:
            gen = self.engine.submit(GenerationRequest(messages=tuple(messages), adapter=self.adapter,
                                                       sampling=sampling, seed=seed, grammar=grammar)).result()
        except Exception as exc:
            if node is not None:
                node.status, node.error = "crash", f"{type(exc).__name__}: {exc}"
                node.finished = self.recorder.tick()
            raise
        if node is not None:
            node.prompt_ids, node.completion_ids, node.logprobs = gen.prompt_ids, gen.completion_ids, gen.logprobs
            node.logprobs_known, node.choice_ids = gen.logprobs_known, gen.choice_ids
            node.text, node.finish_reason = gen.text, gen.finish_reason
            if not gen.text:  # DSPy rejects an empty response before parsing: so does the graph
                node.status, node.error = "format_error", "empty completion"
            else:
                try:
                    node.outputs = parser.parse(self.signature, gen.text)
                except AdapterParseError as exc:
                    node.status, node.error = "format_error", str(exc)[:500]
                except Exception as exc:  # a parser bug is still this call's format failure, never a lost call
                    node.status, node.error = "format_error", f"{type(exc).__name__}: {exc}"
            node.finished = self.recorder.tick()
        usage = Usage(input_tokens=len(gen.prompt_ids), output_tokens=len(gen.completion_ids),
                      total_tokens=len(gen.prompt_ids) + len(gen.completion_ids))
        return Response(id=None, model=f"wfc/{self.role}", message=Message.assistant([TextPart(gen.text)]),
                        # truncation is routine in RL rollouts and is kept on the node (finish_reason); telling
                        # DSPy would only log a warning per call
                        finish_reason="stop", usage=usage)

    def grammar(self, parser, max_tokens: int) -> str | None:
        """The grammar this role's calls follow under ``parser`` (None: unconstrained; ``wfc.constrain``)."""
        return call_grammar(self.signature, parser, max_tokens=max_tokens, decoding=self.decoding, tools=self.tools)

    @staticmethod
    def _parser():
        return call_adapter()

    def stream(self, request):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


def bind(program: dspy.Module, engine: Engine, *, adapters: RoleAdapters | None = None,
         sampling: SamplingParams | Mapping[str, SamplingParams] = SamplingParams(),
         recorder: _Recorder | None = None, stop_roles: Iterable[str] = (),
         decoding: Decoding = Decoding()) -> dspy.Module:
    """Give every predictor of ``program`` (in place) its own LM handle on ``engine``; returns ``program``. A call
    of a role in ``stop_roles`` raises :class:`RolloutStop` instead of generating. ``decoding``: structured
    decoding settings of every role (:class:`Decoding`)."""
    adapters = adapters or {}
    stop_roles = frozenset(stop_roles)
    tools = _react_tools(program)
    for path, predictor in roles(program).items():
        role_sampling = sampling.get(path, SamplingParams()) if isinstance(sampling, Mapping) else sampling
        role_engine = RoleEngine(engine, path, adapters.get(path), predictor.signature, role_sampling, recorder,
                                 stop=path in stop_roles, decoding=decoding, tools=tools.get(id(predictor)))
        predictor.lm = dspy.LM(model=f"wfc/{path}", engine=role_engine, cache=False, num_retries=0,
                               temperature=role_sampling.temperature, max_tokens=role_sampling.max_tokens)
        predictor.lm.wfc_role = path  # a tracer's handle (``is_bound``), not an LM a user or an optimizer set
    return program


def is_bound(program: dspy.Module) -> bool:
    """Whether ``bind`` gave ``program``'s predictors their handles (an enclosing tracer routes its calls)."""
    return any(getattr(getattr(p, "lm", None), "wfc_role", None) is not None for _, p in program.named_predictors())


def role_grammars(program: dspy.Module, sampling: SamplingParams, decoding: Decoding,
                  adapter: dspy.Adapter | None = None) -> dict[str, str | None]:
    """Role path -> the grammar its calls follow under ``adapter`` (the compact one by default) at ``sampling``'s
    token limit: what an artifact records of its decoding."""
    tools = _react_tools(program)
    parser = adapter or CompactChatAdapter()
    return {path: None if CompactChatAdapter.choices(predictor.signature) else
            call_grammar(predictor.signature, parser, max_tokens=sampling.max_tokens, decoding=decoding,
                         tools=tools.get(id(predictor)))
            for path, predictor in roles(program).items()}


def call_grammar(signature, parser, *, max_tokens: int, decoding: Decoding,
                 tools: Mapping[str, Mapping[str, Any]] | None = None) -> str | None:
    """The grammar of one call of ``signature`` under ``parser`` and ``decoding`` (None: unconstrained)."""
    if not decoding.structured:
        return None
    return signature_grammar(signature, parser, max_tokens=max_tokens, tools=tools,
                             field_tokens=field_budgets(signature, decoding.field_tokens))


def _react_tools(program: dspy.Module) -> dict[int, dict[str, dict[str, Any]]]:
    """id of each ``dspy.ReAct``'s ``react`` predictor -> that agent's tools (``wfc.constrain.react_tools``)."""
    found = {}
    for _, module in [("", program), *program.named_sub_modules()]:
        tools = react_tools(module)
        if tools is not None:
            found[id(module.react)] = tools
    return found


def _prediction_dict(prediction: Any) -> dict[str, Any] | None:
    if prediction is None:
        return None
    if isinstance(prediction, dspy.Prediction):
        return dict(prediction.items())
    if isinstance(prediction, Mapping):
        return dict(prediction)
    return {"output": prediction}


def trace(program: dspy.Module, example: dspy.Example | Mapping[str, Any], engine: Engine, *,
          adapters: RoleAdapters | None = None,
          sampling: SamplingParams | Mapping[str, SamplingParams] = SamplingParams(),
          adapter: dspy.Adapter | None = None, seed: int | None = None,
          stop_roles: Iterable[str] = (), decoding: Decoding = Decoding()) -> RolloutGraph:
    """Run ``program`` once on ``example`` and return its rollout graph. Never raises for a failing run: a format
    error or a crash becomes the rollout's status, with every call made up to that point kept. ``seed``: every
    sampled call gets its own seed derived from it (module doc), so the run repeats. ``stop_roles``: the run ends
    at the first call of one of them (module doc, "Stopped rollouts"); ``stopped_at`` names it."""
    inputs = dict(example.inputs()) if isinstance(example, dspy.Example) else dict(example)
    record = dict(example.items()) if isinstance(example, dspy.Example) else dict(example)
    recorder = _Recorder(seed)
    prog = bind(copy_program(program), engine, adapters=adapters, sampling=sampling, recorder=recorder,
                stop_roles=stop_roles, decoding=decoding)
    select_demos(prog, inputs)  # this run's copy: the retrieved demos of its own task (wfc.retrieve)
    status, error, outputs, stopped_at = "ok", None, None, None
    dspy_trace: list = []
    root = _BRANCH.set(())  # a rollout's places start at the root, whichever fan-out runs the rollout itself
    try:
        with dspy.context(adapter=adapter or CompactChatAdapter(), trace=dspy_trace):
            outputs = _prediction_dict(prog(**inputs))
            dspy_trace = list(dspy.settings.trace)
    except RolloutStop as stop:
        stopped_at = stop.role
    except AdapterParseError as exc:
        status, error = "format_error", str(exc)[:2000]
    except Exception as exc:
        status = "crash"
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    finally:
        _BRANCH.reset(root)
    recorder.renumber()
    _attach_inputs(prog, dspy_trace, recorder.calls)
    if stopped_at is not None:
        outputs = _latest_answer(recorder.calls, list(roles(prog)[stopped_at].signature.output_fields))
    if status == "ok" and any(c.status == "crash" for c in recorder.calls):
        status = "crash"  # a crashed call the program swallowed still interrupted its trajectory
    return RolloutGraph(recorder.calls, example=record, outputs=outputs, status=status, error=error,
                        stopped_at=stopped_at)


def _latest_answer(calls: list[CallNode], fields: list[str]) -> dict[str, Any] | None:
    """The ``fields`` of the last finished ``ok`` call that gave them all (a stopped run's outputs), else None."""
    done = [c for c in calls if c.status == "ok" and c.outputs and all(f in c.outputs for f in fields)]
    if not done:
        return None
    last = max(done, key=lambda c: c.finished)
    return {f: last.outputs[f] for f in fields}


def _attach_inputs(program: dspy.Module, dspy_trace: list, calls: list[CallNode]) -> None:
    """Give each ok call the input values DSPy recorded for it. DSPy's trace holds (predictor, inputs, prediction)
    in completion order; a call is matched by role and equal outputs (parallel calls of one role with equal outputs
    share their inputs too, so which of them gets which entry does not matter)."""
    path_of = {id(p): path for path, p in program.named_predictors()}
    for entry in dspy_trace:
        predictor, values, prediction = entry[0], entry[1], entry[2]
        role = path_of.get(id(predictor))
        produced = _prediction_dict(prediction)
        for call in calls:
            if call.role == role and call.inputs is None and call.status == "ok" and call.outputs == produced:
                call.inputs = {k: v for k, v in dict(values).items()}
                break


def parallel_map(fn: Callable, items: Iterable, *, max_workers: int | None = None) -> list:
    """``[fn(x) for x in items]`` on threads, each in a copy of the caller's context (so ``dspy.context`` settings
    follow). Use it for fan-out inside programs: the engine batches the concurrent calls into one generate. The
    threads are members of the caller's cohort, or of a new one (``wfc.engines.cohort``): an engine batches their
    calls the same way however the threads are timed."""
    items = list(items)
    if not items:
        return []
    workers = max_workers or len(items)
    branch = _BRANCH.get()
    contexts = []
    for i in range(len(items)):
        ctx = contextvars.copy_context()
        ctx.run(_BRANCH.set, branch + (i,))  # item i's calls are placed in branch i (module doc)
        contexts.append(ctx)
    return cohort_map(fn, items, contexts, workers)


def run_rollouts(program: dspy.Module, examples: list, engine: Engine, *, repeats: int = 1,
                 adapters: RoleAdapters | None = None,
                 sampling: SamplingParams | Mapping[str, SamplingParams] = SamplingParams(),
                 adapter: dspy.Adapter | None = None, max_workers: int = 256,
                 on_done: Callable[[], Any] | None = None,
                 seeds: list[int] | None = None, stop_roles: Iterable[str] = (),
                 decoding: Decoding = Decoding()) -> list[list[RolloutGraph]]:
    """``repeats`` rollouts of ``program`` per example, all in flight together so the engine batches them.
    Returns one list of graphs per example, in input order. ``on_done`` is called (from a worker thread) as each
    example's last rollout finishes, e.g. a progress bar's ``update``. ``seeds``: one per example; rollout r of
    example i is traced with ``derive_seed(seeds[i], r)``, so the draw repeats whatever the thread timing.
    ``stop_roles``: every run ends at the first call of one of them (``trace``)."""
    roles(program)  # validate once, before any thread starts
    if seeds is not None and len(seeds) != len(examples):
        raise ValueError(f"seeds has {len(seeds)} entries for {len(examples)} examples: give one per example")
    jobs = [(i, ex, None if seeds is None else derive_seed(seeds[i], r))
            for i, ex in enumerate(examples) for r in range(repeats)]
    left = [repeats] * len(examples)
    lock = threading.Lock()

    def run(job):
        graph = trace(program, job[1], engine, adapters=adapters, sampling=sampling, adapter=adapter, seed=job[2],
                      stop_roles=stop_roles, decoding=decoding)
        if on_done is not None:
            with lock:
                left[job[0]] -= 1
                finished = left[job[0]] == 0
            if finished:
                on_done()
        return graph

    graphs = parallel_map(run, jobs, max_workers=min(max_workers, len(jobs) or 1))
    out: list[list[RolloutGraph]] = [[] for _ in examples]
    for (i, _, _), g in zip(jobs, graphs):
        out[i].append(g)
    return out
