"""Prompt optimization composed with weight training (BetterTogether): bootstrapped few-shot demos per role.

``strategy="p -> w"`` first gives every role demonstrations, then trains the adapters with the demos in the prompts
(the artifact saves them: they are part of the program's DSPy state, ``predictor.demos``); ``"p"`` stops after the
demos (prompt optimization alone, the baseline weights must beat).

The rule is DSPy's ``BootstrapFewShot``: run the program on training examples, keep the runs the metric passes, and
take each role's own call of a kept run (its input values and its parsed outputs) as a demonstration for that role.
It is done here on wfc's engine rather than by calling ``dspy.BootstrapFewShot`` because that optimizer runs examples
one by one, while rollouts here are generated in batches (32 examples x 2 runs in about the time of two calls), and
because demos must be keyed by role path: two roles built from one Signature are two roles.

Invariants: a demo comes from a run whose reward has full marks; a call that answers the task itself (its outputs
hold every final output field) must also have full marks on its own answer (a voter the aggregator overruled is not a
demo); at most one demo per training example per role, so the demos of a role cover different problems; the same
inputs, seed and engine give the same demos.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Mapping, Sequence

import dspy

from compilers.credit import FULL_MARKS
from compilers.score import call_metric, score_rollout
from wfc.engines.base import SamplingParams
from wfc.lower import roles, run_rollouts


def bootstrap_demos(program: dspy.Module, trainset: Sequence[dspy.Example], engine, *, metric: Callable,
                    k: int, adapters: Mapping[str, str | None] | None = None, n_examples: int = 32,
                    repeats: int = 2, temperature: float = 0.7, max_tokens: int = 64, seed: int = 0,
                    metric_failure_score: float | None = 0.0,
                    stats: dict[str, Any] | None = None) -> dict[str, list[dspy.Example]]:
    """Role path -> up to ``k`` demonstrations (``dspy.Example`` with the role's input and output fields).
    ``stats``, when given, receives ``runs``, ``passing_runs`` and ``completion_tokens`` (the budget spent)."""
    if k <= 0:
        return {role: [] for role in roles(program)}
    rng = random.Random(seed)
    pool = rng.sample(list(trainset), min(n_examples, len(trainset)))
    runs = run_rollouts(program, pool, engine, adapters=adapters,
                        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens))
    if repeats > 1:
        sampled = run_rollouts(program, pool, engine, repeats=repeats - 1, adapters=adapters,
                               sampling=SamplingParams(temperature=temperature, max_tokens=max_tokens))
        runs = [a + b for a, b in zip(runs, sampled)]
    demos: dict[str, list[dspy.Example]] = {role: [] for role in roles(program)}
    if stats is not None:
        graphs = [g for gs in runs for g in gs]
        stats["runs"] = len(graphs)
        stats["completion_tokens"] = sum(len(c.completion_ids) for g in graphs for c in g.calls)
        stats["passing_runs"] = 0
    for graphs in runs:
        used: set[str] = set()
        for graph in graphs:
            score_rollout(metric, graph, failure_score=0.0, metric_failure_score=metric_failure_score)
            if graph.status != "ok" or graph.reward is None or graph.reward < FULL_MARKS:
                continue
            if stats is not None:
                stats["passing_runs"] += 1
            final = set(graph.outputs or {})
            for call in graph.calls:
                if call.role in used or call.inputs is None or not call.outputs or len(demos[call.role]) >= k:
                    continue
                if final <= set(call.outputs) and call_metric(
                        metric, graph.example, {f: call.outputs[f] for f in final},
                        metric_failure_score=metric_failure_score) < FULL_MARKS:
                    continue
                demos[call.role].append(dspy.Example(**call.inputs, **call.outputs).with_inputs(*call.inputs))
                used.add(call.role)
    return demos


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
