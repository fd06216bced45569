"""The warm start: fine-tune each role's adapter on the program's own passing calls before GRPO (rejection-sampling
fine-tuning, STaR; DSPy's ``BootstrapFinetune`` does this per predictor). ``compilers.loop.CompileRun.warm_start``
is the stage; this module holds its data rules and its training loop.

Data model: ``rollouts[e]`` are the scored, sampled runs of training example ``e``. A run *passes* when it finished
(status ``ok``) and scored full marks (``compilers.credit.FULL_MARKS``, the rule bootstrapped demos use). A
*success* is a call of a trained role in a passing run with status ``ok`` and a non-empty completion (a call cut at
its token budget counts: its run passed on what it wrote) whose reasoning, if it has a ``reasoning`` output, ends at
its answer (``compilers.prompts.reasoning_concludes``, as for bootstrapped demos; ``unconcluded`` counts the rest).
Its prompt ids and completion ids are exactly what the engine saw and produced, so a success is the program's own
behaviour.

Invariants (tested): successes keep run order (example, then run, then call id); an example gives a role each
distinct (prompt ids, completion ids) once (``duplicates`` counts the rest); ``max_per_example`` caps one example's
successes per role, first ones kept (``capped`` counts the rest), so examples the program already solves every time
do not fill the batches; a frozen role's calls (not in ``roles``) are never successes.

The loss (the convention): each success is a :class:`compilers.update.Row` with advantage 1, weight 1 and no engine
log-probs (no importance weight), trained under :func:`sft_sections` (one inner epoch, ``beta`` 0, ``token``
aggregation, no role balancing: a mini-batch's mix of roles is chance). With one inner epoch the ratio is exactly 1,
so the clipped surrogate's gradient is that of the negative log-likelihood of the successes' free tokens (a grammar's
forced tokens carry none), token-mean over the mini-batch, under the sampling temperature. The reported SFT loss is
that token-mean negative log-likelihood (:func:`nll_by_role`, from :func:`compilers.update.completion_nll`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from compilers.config import GuardsConfig, UpdateConfig, WarmStartConfig
from compilers.credit import FULL_MARKS
from compilers.distributed import Distributed
from compilers.prompts import reasoning_concludes
from compilers.update import AdapterOptimizers, Row, completion_nll, update_rows
from wfc.lower import derive_seed
from wfc.rollout import CallNode, RolloutGraph


@dataclass(frozen=True)
class Success:
    example: int  # index of the training example
    role: str
    call: CallNode


@dataclass
class Harvest:
    """What :func:`successes` kept, and what it left out."""

    kept: list[Success] = field(default_factory=list)
    duplicates: int = 0  # successes equal to one already kept for the same example and role
    capped: int = 0  # distinct successes past ``max_per_example``
    unconcluded: int = 0  # calls whose reasoning does not end at their answer (compilers.prompts.reasoning_concludes)


def passes(graph: RolloutGraph) -> bool:
    """A finished run that scored full marks (its reward must be set: score it first)."""
    if graph.status != "ok":
        return False
    if graph.reward is None:
        raise ValueError("rollout is not scored: score every rollout before selecting successes")
    return graph.reward >= FULL_MARKS


def successes(rollouts: Sequence[Sequence[RolloutGraph]], roles: Sequence[str], *,
              max_per_example: int | None = None) -> Harvest:
    """The successes of the roles in ``roles`` (see the module doc), deduplicated and capped per example and role."""
    if max_per_example is not None and max_per_example < 1:
        raise ValueError(f"max_per_example must be >= 1 or None (no cap), got {max_per_example}")
    wanted = set(roles)
    out = Harvest()
    for e, graphs in enumerate(rollouts):
        seen: dict[str, set[tuple[tuple[int, ...], tuple[int, ...]]]] = {}
        for graph in graphs:
            if not passes(graph):
                continue
            for call in graph.calls:
                if call.role not in wanted or call.status != "ok" or not call.completion_ids:
                    continue
                if not reasoning_concludes(call.outputs or {}):  # the rule bootstrapped demos follow
                    out.unconcluded += 1
                    continue
                key = (tuple(call.prompt_ids), tuple(call.completion_ids))
                mine = seen.setdefault(call.role, set())
                if key in mine:
                    out.duplicates += 1
                elif max_per_example is not None and len(mine) >= max_per_example:
                    out.capped += 1
                else:
                    mine.add(key)
                    out.kept.append(Success(e, call.role, call))
    return out


def run_counts(rollouts: Sequence[Sequence[RolloutGraph]]) -> dict[str, int]:
    """``runs``, ``passing_runs``, ``examples_passed`` (examples with a passing run) and ``completion_tokens`` (every
    call's, the budget spent)."""
    graphs = [g for gs in rollouts for g in gs]
    return {"runs": len(graphs), "passing_runs": sum(passes(g) for g in graphs),
            "examples_passed": sum(any(passes(g) for g in gs) for gs in rollouts),
            "completion_tokens": sum(len(c.completion_ids) for g in graphs for c in g.calls)}


def role_counts(kept: Sequence[Success], roles: Sequence[str]) -> dict[str, int]:
    """Successes per role, every role of ``roles`` present (0 where it has none)."""
    counts = {role: 0 for role in roles}
    for s in kept:
        counts[s.role] = counts.get(s.role, 0) + 1
    return counts


def sft_rows(kept: Sequence[Success], role_adapters: Mapping[str, str]) -> list[Row]:
    """One training row per success: its adapter, prompt, completion, advantage 1, no engine log-probs."""
    missing = sorted({s.role for s in kept} - set(role_adapters))
    if missing:
        raise ValueError(f"successes of roles without an adapter: {missing}; known roles: {sorted(role_adapters)}")
    return [Row(role_adapters[s.role], s.role, tuple(s.call.prompt_ids), list(s.call.completion_ids), 1.0,
                choices=s.call.choice_ids, grammar=s.call.grammar) for s in kept]


def batches(n: int, size: int, *, seed: int) -> list[list[int]]:
    """``range(n)`` shuffled by ``random.Random(seed)`` (no global generator) and cut into batches of ``size``; the
    last may be shorter."""
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return [order[i:i + size] for i in range(0, n, size)]


def nll_by_role(rows: Sequence[Row], per_row: Sequence[tuple[float, int]]) -> dict[str, float | None]:
    """Token-mean negative log-likelihood over all ``rows`` (``"all"``) and per role, from each row's (summed NLL,
    free tokens); None where a role has no free token."""
    if len(rows) != len(per_row):
        raise ValueError(f"{len(per_row)} NLL entries for {len(rows)} rows: give one per row")
    sums: dict[str, list[float]] = {"all": [0.0, 0]}
    for r, (nll, tokens) in zip(rows, per_row):
        for key in ("all", r.role):
            acc = sums.setdefault(key, [0.0, 0])
            acc[0] += nll
            acc[1] += tokens
    return {k: (s / n if n else None) for k, (s, n) in sums.items()}


def sft_sections(update: UpdateConfig, guards: GuardsConfig) -> tuple[UpdateConfig, GuardsConfig]:
    """The update's and the guards' sections as the warm start trains under them (module doc)."""
    return (update.model_copy(update={"importance_correction": "none", "inner_epochs": 1, "beta": 0.0,
                                      "loss_aggregation": "token"}),
            guards.model_copy(update={"role_balance": False}))


def fine_tune(policy, rows: list[Row], *, config: WarmStartConfig, update: UpdateConfig, guards: GuardsConfig,
              temperature: float, seed: int, rates: Mapping[str, float], distributed: Distributed) -> dict[str, Any]:
    """``config.warm_start_epochs`` epochs over ``rows`` in batches of ``config.warm_start_batch`` (seeded by
    ``seed``), one optimizer step per batch and adapter under :func:`sft_sections` of ``update`` and ``guards``, at
    the rollouts' sampling ``temperature``, with AdamW states of their own (GRPO's optimizers stay untouched).
    ``rates``: adapter -> learning rate. Returns ``optimizer_steps``, ``loss_before``, ``loss_after``
    (:func:`nll_by_role`)."""
    sft, sft_guards = sft_sections(update, guards)
    optimizers = AdapterOptimizers(policy, list(rates), lr=dict(rates))
    before = nll_by_role(rows, completion_nll(policy, rows, config=sft, temperature=temperature))
    steps = 0
    for epoch in range(config.warm_start_epochs):
        for idx in batches(len(rows), config.warm_start_batch, seed=derive_seed(seed, "warm_start", epoch)):
            update_rows(policy, optimizers, [rows[i] for i in idx], config=sft, guards=sft_guards,
                        temperature=temperature, distributed=distributed)
            steps += 1
    after = nll_by_role(rows, completion_nll(policy, rows, config=sft, temperature=temperature))
    return {"optimizer_steps": steps, "loss_before": before, "loss_after": after}
