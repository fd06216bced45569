"""Counterfactual per-role credit (as in CCPO): what did this call change about the outcome?

For a call ``c`` of a scored rollout, the counterfactual run replays the same example with every *other* call fixed
and only ``c`` resampled: a call whose prompt is exactly one it made in the actual rollout gets the generation it got
then (no model work), ``c``'s prompt gets one fresh sample, and calls downstream of it whose prompts changed (Voting's
aggregator once a candidate differs) are generated anew. The call's credit is the difference of the two outcomes::

    credit(c) = reward(actual rollout) - reward(counterfactual rollout)

so a call whose output did not matter scores 0 and one that made a right answer wrong scores -1. The group-relative
advantage is then taken over these credits within the call's group (``compilers.group``), as for any other credit.

Why: ``own_output`` / ``verified`` credit needs a call that answers the task or judges an answer; an orchestrator, a
planner or a worker whose result is one of several inputs has no verifiable output of its own, and inheriting the
rollout's reward gives it credit for what the others did.

Cost: one extra run per credited call, of which only the resampled call and the calls its output reaches generate
tokens. :func:`counterfactual_credit` returns the runs made and the completion tokens they generated, and the compile
loop logs them per step (``counterfactual`` in the step record), so a user sees what this credit costs.

Invariants: only ok calls of ok rollouts are credited; a counterfactual run that crashes or fails to parse scores
``failure_score`` as a rollout would; identical prompts (parallel calls of one role) are interchangeable, so for
``n`` recorded calls with the same prompt the first ``n - 1`` requests replay and the last one samples.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from concurrent.futures import Future
from typing import Any, Callable, Mapping, Sequence

import dspy

from compilers.score import score_rollout
from wfc.engines.base import Engine, Generation, GenerationRequest
from wfc.lower import parallel_map, trace
from wfc.rollout import CallNode, RolloutGraph


def _key(messages, adapter: str | None) -> str:
    return json.dumps([list(messages), adapter], sort_keys=True)


class ReplayEngine:
    """An engine for one counterfactual run: recorded generations for every recorded prompt except one resampled call.

    ``recorded``: the actual rollout's calls; ``resample``: the call to draw again. Requests whose (messages, adapter)
    match a remaining recorded call get that call's generation; all others go to ``engine``. Thread-safe (fan-out
    calls of one run arrive concurrently)."""

    def __init__(self, engine: Engine, recorded: Sequence[CallNode], resample: CallNode):
        self.engine = engine
        self.lock = threading.Lock()
        self.pool: dict[str, list[Generation]] = defaultdict(list)
        for call in sorted(recorded, key=lambda c: c.id):
            if call.id == resample.id or not call.completion_ids and not call.text:
                continue
            self.pool[_key(call.messages, call.adapter)].append(Generation(
                text=call.text, prompt_ids=list(call.prompt_ids), completion_ids=list(call.completion_ids),
                logprobs=list(call.logprobs), finish_reason=call.finish_reason or "stop",
                logprobs_known=call.logprobs_known))
        self.generated: list[Generation] = []

    def submit(self, request: GenerationRequest) -> Future:
        with self.lock:
            replay = self.pool.get(_key(request.messages, request.adapter))
            if replay:
                fut: Future = Future()
                fut.set_result(replay.pop(0))
                return fut
        fut = self.engine.submit(request)
        fut.add_done_callback(self._count)
        return fut

    def _count(self, fut: Future) -> None:
        if fut.exception() is None:
            with self.lock:
                self.generated.append(fut.result())

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        return [f.result() for f in [self.submit(r) for r in requests]]

    def load_adapters(self, revisions) -> None:  # never handed weights: it lives for one run
        return None

    def close(self) -> None:
        return None


def counterfactual_credit(program: dspy.Module, examples: Sequence, rollouts: Sequence[Sequence[RolloutGraph]],
                          engine: Engine, *,
                          metric: Callable, roles: Sequence[str], adapters: Mapping[str, str | None] | None,
                          sampling, failure_score: float, metric_failure_score: float | None,
                          max_workers: int = 256) -> dict[str, Any]:
    """Set ``CallNode.reward`` to the counterfactual credit for every ok call of ``roles`` (``"*"``: all roles) in
    the ok rollouts of ``rollouts`` (already scored; ``rollouts[i]`` are the runs of ``examples[i]``). Returns
    ``{"runs", "completion_tokens"}``: the counterfactual runs made and the completion tokens they generated."""
    if len(examples) != len(rollouts):
        raise ValueError(f"{len(examples)} examples for {len(rollouts)} rollout lists: give one example per list")
    wanted = None if "*" in roles else set(roles)
    jobs: list[tuple[Any, RolloutGraph, CallNode]] = []
    for example, graphs in zip(examples, rollouts):
        for g in graphs:
            if g.status != "ok" or g.reward is None:
                continue
            jobs.extend((example, g, c) for c in g.calls if c.status == "ok" and (wanted is None or c.role in wanted))

    def run(job: tuple[Any, RolloutGraph, CallNode]) -> tuple[float, int]:
        example, graph, call = job
        replay = ReplayEngine(engine, graph.calls, call)
        cf = trace(program, example, replay, adapters=adapters, sampling=sampling)
        value = score_rollout(metric, cf, failure_score=failure_score, metric_failure_score=metric_failure_score)
        return value, sum(len(gen.completion_ids) for gen in replay.generated)

    results = parallel_map(run, jobs, max_workers=min(max_workers, len(jobs) or 1))
    for (_, graph, call), (value, _) in zip(jobs, results):
        call.reward = float(graph.reward) - float(value)
        call.no_credit = False
    return {"runs": len(jobs), "completion_tokens": sum(t for _, t in results)}
