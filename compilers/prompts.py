"""Prompt optimization composed with weight training (BetterTogether): bootstrapped few-shot demos per role.

``strategy="p -> w"`` first gives every role demonstrations, then trains the adapters with the demos in the prompts
(the artifact saves them: they are part of the program's DSPy state, ``predictor.demos``); ``"p"`` stops after the
demos (prompt optimization alone, the baseline weights must beat); ``"w"`` trains the weights only. The strategies
are a registry (:data:`STRATEGIES`): each says whether it bootstraps demos and whether it trains weights.

Two DSPy rules, in this order, keyed by role path (two roles built from one Signature are two roles):

1. ``LabeledFewShot`` for *labeled* roles (``labeled=True``): a role whose input fields are all inputs of the training examples and
   whose output fields are all labels of them (Voting's voters, EvalOpt's generator: roles that answer the task from
   its own inputs) takes ``(inputs, gold labels)`` of training examples as demos, no run needed. A demo teaches its
   form as much as its answer: a bare gold label teaches answering at once, which suits models that can; measured on
   SmolLM2-135M (arithmetic word problems) it is worse than the model's own short worked answers ("3 + 19 = 22"),
   so it is off by default.
2. ``BootstrapFewShot`` for the rest, with the labeled demos already in place: run the program on training examples
   (greedy once, then sampled), keep the runs the metric passes, and take each remaining role's own call of a kept
   run (its input values and its parsed outputs, as the model wrote them) as its demo; of an example's passing calls
   of a role, the shortest one that ended on its own (not cut at ``max_tokens``). A call with a ``reasoning`` output
   (``dspy.ChainOfThought``) and one answer field is a demo only if its reasoning ends at that answer
   (:func:`reasoning_concludes`): a demo whose reasoning reaches ``3 x 2 = 6`` and answers ``2`` passes the metric
   but teaches answering apart from the reasoning (seen on the ChainOfThought demo, docs/results.md).

A third kind, per run rather than per role: :func:`retrieval_pools` builds, for every labeled role, a pool of
gold-labeled training examples from which each run is shown the nearest to its own task (``retrieved_demos=K``;
selection, persistence and invariants in :mod:`wfc.retrieve`).

It is done on wfc's engine rather than by calling ``dspy.BootstrapFewShot`` because that optimizer runs examples one
by one, while rollouts here are generated in batches (32 examples x 2 runs in about the time of two calls).

Invariants: every demo has full marks under the metric (a labeled demo's gold answer is checked too: a metric that
does not pass its own gold label gives no labeled demos); a call that answers the task itself (its outputs hold every
final output field) must also have full marks on its own answer (a voter the aggregator overruled is not a demo); at
most one demo per training example per role, so the demos of a role cover different problems; the same inputs, seed
and engine give the same demos.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import dspy

from compilers.credit import FULL_MARKS
from compilers.grounded import concludes
from compilers.score import call_metric, score_rollout
from wfc.engines.base import SamplingParams
from wfc.lower import roles, run_rollouts
from wfc.retrieve import DemoRetriever


REASONING = "reasoning"  # the output field dspy.ChainOfThought puts before a signature's own outputs


@dataclass(frozen=True)
class Strategy:
    """BetterTogether's order: ``demos``, bootstrap demonstrations per role first; ``weights``, then train the
    adapters (GRPO steps)."""

    name: str
    demos: bool
    weights: bool


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("w", demos=False, weights=True),
    Strategy("p", demos=True, weights=False),
    Strategy("p -> w", demos=True, weights=True),
)}


def bootstrap_demos(program: dspy.Module, trainset: Sequence[dspy.Example], engine, *, metric: Callable,
                    k: int, adapters: Mapping[str, str | None] | None = None, n_examples: int = 32,
                    repeats: int = 2, temperature: float = 0.7, max_tokens: int = 64, seed: int = 0,
                    metric_failure_score: float | None = 0.0, labeled: bool = False,
                    stats: dict[str, Any] | None = None) -> dict[str, list[dspy.Example]]:
    """Role path -> up to ``k`` demonstrations (``dspy.Example`` with the role's input and output fields).
    ``labeled=True`` applies rule 1 first. The demos found by rule 1
    are set on ``program`` while rule 2 runs and taken off again: the input program is left as it was.
    ``stats``, when given, receives ``labeled`` (roles served by rule 1), ``runs``, ``passing_runs`` and
    ``completion_tokens`` (the budget spent)."""
    by_path = roles(program)
    if k <= 0:
        return {role: [] for role in by_path}
    rng = random.Random(seed)
    pool = rng.sample(list(trainset), min(n_examples, len(trainset)))
    demos: dict[str, list[dspy.Example]] = {role: [] for role in by_path}
    first = labeled_demos(program, pool, metric=metric, k=k, metric_failure_score=metric_failure_score) \
        if labeled else {}
    demos.update(first)
    if stats is not None:
        stats.update(labeled=sorted(first), runs=0, passing_runs=0, completion_tokens=0)
    rest = [role for role in by_path if role not in first]
    if not rest:
        return demos
    saved = {role: list(by_path[role].demos) for role in first}
    apply_demos(program, first)
    try:
        _bootstrap(program, pool, engine, demos, rest, metric=metric, k=k, adapters=adapters, repeats=repeats,
                   temperature=temperature, max_tokens=max_tokens, metric_failure_score=metric_failure_score,
                   stats=stats)
    finally:
        apply_demos(program, saved)
    return demos


def labeled_roles(program: dspy.Module, example: dspy.Example, renames: Mapping[str, str] | None = None) -> list[str]:
    """Roles whose inputs are all inputs of ``example`` and whose outputs are all its labels (rule 1); ``renames``
    maps an output field to the label holding its gold value when the names differ."""
    renames = renames or {}
    inputs = set(example.inputs().keys())
    labels = set(example.labels().keys())
    return [role for role, p in roles(program).items()
            if set(p.signature.input_fields) <= inputs
            and {renames.get(f, f) for f in p.signature.output_fields} <= labels]


def retrieval_pools(program: dspy.Module, trainset: Sequence[dspy.Example], *, metric: Callable, k: int,
                    labels: Mapping[str, str] | None = None,
                    metric_failure_score: float | None = 0.0) -> dict[str, DemoRetriever]:
    """Role path -> a :class:`wfc.retrieve.DemoRetriever` showing ``k`` nearest gold-labeled training examples per
    run, for every role whose input fields are inputs of the training examples and whose output fields are labels
    of them (``labels`` renames an output field to the example field holding its gold value). The pool is the
    trainset's examples whose gold answer has full marks under the metric, in trainset order. Raises ``ValueError``
    when no role qualifies or no gold answer passes (retrieval would show nothing), saying what to set."""
    labels = dict(labels or {})
    if not trainset:
        return {}
    first = trainset[0]
    by_path = roles(program)
    eligible = labeled_roles(program, first, labels)
    if not eligible:
        shown = {role: (list(p.signature.input_fields), list(p.signature.output_fields)) for role, p in by_path.items()}
        raise ValueError(f"retrieved_demos: no role answers the task from its own inputs with a gold label to show "
                         f"(roles' inputs, outputs: {shown}; the examples' inputs {sorted(first.inputs().keys())}, "
                         f"labels {sorted(first.labels().keys())}): name the example field holding a role "
                         "output's gold value in demo_labels, e.g. demo_labels={'code': 'solution'}")
    out: dict[str, DemoRetriever] = {}
    for role in eligible:
        sig = by_path[role].signature
        pool = []
        for ex in trainset:
            gold = {f: ex[labels.get(f, f)] for f in sig.output_fields}
            if call_metric(metric, dict(ex.items()), gold, metric_failure_score=metric_failure_score) >= FULL_MARKS:
                pool.append({**{f: ex[f] for f in sig.input_fields}, **gold})
        if not pool:
            raise ValueError(f"retrieved_demos: no training example's gold answer for role {role!r} passes the metric "
                             "(its outputs read from the fields "
                             f"{[labels.get(f, f) for f in sig.output_fields]}): check demo_labels and the metric")
        out[role] = DemoRetriever(k=k, query=list(sig.input_fields), pool=pool)
    return out


def labeled_demos(program: dspy.Module, pool: Sequence[dspy.Example], *, metric: Callable, k: int,
                  metric_failure_score: float | None = 0.0) -> dict[str, list[dspy.Example]]:
    """Rule 1: for every labeled role, the first ``k`` examples of ``pool`` whose gold labels the metric passes."""
    if not pool:
        return {}
    out: dict[str, list[dspy.Example]] = {}
    passing = [ex for ex in pool
               if call_metric(metric, dict(ex.items()), dict(ex.labels().items()),
                              metric_failure_score=metric_failure_score) >= FULL_MARKS]
    for role in labeled_roles(program, pool[0]):
        sig = roles(program)[role].signature
        out[role] = [dspy.Example(**{f: ex[f] for f in sig.input_fields}, **{f: ex[f] for f in sig.output_fields})
                     .with_inputs(*sig.input_fields) for ex in passing[:k]]
    return {role: items for role, items in out.items() if items}


def _bootstrap(program: dspy.Module, pool: list, engine, demos: dict[str, list[dspy.Example]], wanted: list[str], *,
               metric: Callable, k: int, adapters, repeats: int, temperature: float, max_tokens: int,
               metric_failure_score: float | None, stats: dict[str, Any] | None) -> None:
    """Rule 2: fill ``demos[role]`` for the roles in ``wanted`` from the program's own passing runs on ``pool``."""
    runs = run_rollouts(program, pool, engine, adapters=adapters,
                        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens))
    if repeats > 1:
        sampled = run_rollouts(program, pool, engine, repeats=repeats - 1, adapters=adapters,
                               sampling=SamplingParams(temperature=temperature, max_tokens=max_tokens))
        runs = [a + b for a, b in zip(runs, sampled)]
    if stats is not None:
        graphs = [g for gs in runs for g in gs]
        stats["runs"] = len(graphs)
        stats["completion_tokens"] = sum(len(c.completion_ids) for g in graphs for c in g.calls)
        stats["passing_runs"] = 0
    for graphs in runs:
        best: dict[str, tuple[tuple[bool, int], dict, dict]] = {}  # role -> (sort key, inputs, outputs)
        for graph in graphs:
            score_rollout(metric, graph, failure_score=0.0, metric_failure_score=metric_failure_score)
            if graph.status != "ok" or graph.reward is None or graph.reward < FULL_MARKS:
                continue
            if stats is not None:
                stats["passing_runs"] += 1
            final = set(graph.outputs or {})
            for call in graph.calls:
                if call.role not in wanted or call.inputs is None or not call.outputs:
                    continue
                if final <= set(call.outputs) and call_metric(
                        metric, graph.example, {f: call.outputs[f] for f in final},
                        metric_failure_score=metric_failure_score) < FULL_MARKS:
                    continue
                if not reasoning_concludes(call.outputs):
                    continue
                # the shortest passing call that ended on its own: a demo cut off at max_tokens teaches rambling
                key = (call.finish_reason == "length", len(call.completion_ids))
                if call.role not in best or key < best[call.role][0]:
                    best[call.role] = (key, dict(call.inputs), dict(call.outputs))
        for role, (_, inputs, outputs) in best.items():
            if len(demos[role]) < k:
                demos[role].append(dspy.Example(**inputs, **outputs).with_inputs(*inputs))


def reasoning_concludes(outputs: Mapping[str, Any], *, reasoning: str = REASONING) -> bool:
    """Whether a call's ``reasoning`` ends at its answer (rule 2's filter for ChainOfThought-style roles): True when
    the outputs have no ``reasoning`` field or more than one other field (nothing to check against); else
    ``compilers.grounded.concludes(reasoning, answer)``: a numeric answer must be the reasoning's last number, any
    other must occur in it."""
    if reasoning not in outputs:
        return True
    answers = [f for f in outputs if f != reasoning]
    if len(answers) != 1:
        return True
    return concludes(str(outputs[reasoning] or ""), outputs[answers[0]])


def apply_demos(program: dspy.Module, demos: Mapping[str, list[dspy.Example]]) -> dict[str, int]:
    """Set each role's demos in place (roles not in ``demos`` keep theirs); returns role -> number of demos."""
    by_path = roles(program)
    unknown = sorted(set(demos) - set(by_path))
    if unknown:
        raise ValueError(f"demos for unknown roles {unknown}; the program's roles are {sorted(by_path)}")
    for role, items in demos.items():
        by_path[role].demos = list(items)
    return {role: len(p.demos) for role, p in by_path.items()}


def demo_summary(program: dspy.Module) -> dict[str, Any]:
    return {role: [dict(d.items()) for d in p.demos] for role, p in roles(program).items() if p.demos}
