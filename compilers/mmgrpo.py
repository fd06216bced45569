"""mmGRPO: multi-module GRPO over a workflow program's roles, on LoRA adapters of one resident base model.

One step: sample ``examples_per_step`` examples -> ``group_size`` rollouts of the whole program on each, all in flight
together (the engine batches them) -> score every rollout with the metric -> group calls per (example, role path,
invocation) -> group-relative advantages -> one optimizer step per adapter on the policy -> ``engine.load_adapters``.

Policy and engine apart: the **policy** (:class:`wfc.policy.Policy`: the base model, its adapters, optimizers'
parameters, revisions, checkpoints, the manifest's base checksum) is all the trainer touches; the **engine** only
generates. After every weight change (creation, update, rollback, restore, the final keep) the changed adapters are
handed over with the engine's one weight method, ``load_adapters(policy.export(names))``: the HF engine shares the
policy's model (colocated: a no-op); the vLLM engines get only those adapters' tensors, never the base weights.
Where the policy lives: ``device`` (``auto``: CUDA when available; bf16 autocast for training there), ``dtype``,
``gradient_checkpointing`` in :class:`~compilers.config.MMGRPOConfig`: the first two used when compile builds the
policy; checkpointing also switched on for a policy taken from the HF engine or given.

Validation runs before training, every ``eval_every`` steps and at the end; every evaluated revision is kept, and the
artifact holds the best one (or the last, on request).

Learning rate: each adapter's base rate (``learning_rate``, ``role_learning_rates``) times the step's multiplier from
``lr_schedule`` / ``warmup_steps`` / ``min_lr_ratio`` (``compilers.schedule``), logged per step as ``lr_multiplier``
and ``learning_rates``.

Backends map roles to adapters (``backends.resolve_backend``): ``shared`` (one adapter for all roles), ``isolated``
(one per role), a dict partition, or ``auto`` (``compilers.auto.plan``: traced before training, with reasons).

Frozen roles (``frozen_roles``): roles that run on the base model and are never trained; the plan, the optimizers
and the update know only the trained roles, a frozen role's groups are left out of the update and of dynamic
sampling's signal, and the manifest lists it with adapter None. ``skip_frozen`` ends training rollouts at a frozen
role's first call (``wfc.lower``, stopped rollouts), for frozen revisers after every trained call; the step-0
validation checks that, and the config refuses it where credit would read the skipped calls.

Guards (``compilers.guards``; each switchable in the config and logged): fan-out row weights, role-balanced loss in
multi-role adapters, per-role gradient clipping and learning rates, an entropy floor (``entropy_floor``: a role whose
sampled entropy in a step is below it gets an entropy bonus in that step's loss, logged per role as
``entropy_bonus``), and cliff rollback: after each validation, a
cliff (``cliff_patience`` evaluations more than ``cliff_drop`` below the best) restores every adapter that moved since
the best revision to that revision's exact weights, multiplies its learning rate by ``cliff_lr_factor``, and records
an event (``metrics.jsonl`` kind ``event``, and ``manifest.events``). Every evaluated revision is still kept.

Log records (``metrics.jsonl``): ``plan`` (backend, role -> adapter, reasons), ``eval``, ``step`` (with per-role
diagnostics under ``roles``, the guards in force under ``guards``, and the engine/trainer ``logprob_mismatch`` that
``importance_correction`` acts on), ``event``, ``resume`` (a resumed compile: the step it continued after).

Resume (``compilers.checkpoint``): after the step-0 validation and after every step, the whole training state is
checkpointed in ``run_dir/checkpoint/``; ``compile(..., resume=RUN_DIR)`` restores it, cuts ``metrics.jsonl`` back to
the checkpointed records and continues with the next step. A checkpoint of another config (``steps`` aside), base
model, plan, data, metric or program class is refused.

Data parallel (``compilers.distributed``; ``torchrun --nproc_per_node N -m wfc.cli compile ...``): every rank runs
this same compile with its own engine and policy. The sampler draws the same indices everywhere; each rank rolls out,
scores and credits its contiguous shard of them, and the scored rollouts are gathered back into one process's order,
so everything after (groups, advantages, dynamic sampling, guards, validation decisions) is identical on every rank.
Validation shards the valset likewise. The update shards the backward and sums the gradients (``compilers.update``),
so the adapters stay equal on every rank. The backend plan (``auto``) and bootstrapped demos are computed on rank 0
and broadcast. Only rank 0 writes the run directory (``metrics.jsonl``, checkpoints, revisions, plots) and shows
progress; every rank returns the same :class:`CompiledProgram`, and only rank 0 should ``save`` it (the CLI does so).
With a deterministic engine (a script, greedy decoding) N ranks end with the adapters one process would have (up to
the summation order of the gradients); sampled rollouts draw other random numbers than one process would.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import dspy
import torch

from compilers.advantages import group_advantages, no_signal_rate, role_scales
from compilers import checkpoint as ckpt
from compilers.backends import BackendPlan, resolve_backend
from compilers.config import MMGRPOConfig
from compilers.group import Group, build_groups
from compilers.guards import (adapter_learning_rates, check_role_keys, cohort_sizes, detect_cliff, entropy_bonus,
                              fanout_weights, member_key)
from compilers.runlog import RunLog
from compilers.counterfactual import counterfactual_credit
from compilers.credit import get_credit
from compilers.distributed import Distributed, SingleProcess, from_env
from compilers.prompts import apply_demos, bootstrap_demos, retrieval_pools
from compilers.sampling import PromptSampler, signal_examples
from compilers.schedule import lr_multiplier
from compilers.score import mean_interval, score_rollout
from compilers.offpolicy import merge_mismatch
from compilers.update import AdapterOptimizers, adapter_parameters, update
from wfc.artifact import CompiledProgram, Manifest, package_versions
from wfc.engines.base import SamplingParams
from wfc.policy import Policy, resolve_device
from wfc.lower import copy_program, derive_seed, roles, run_rollouts
from wfc.retrieve import install as install_retrievers
from wfc.rollout import RolloutGraph


def evaluate(program: dspy.Module, examples: Sequence, engine, *, metric: Callable, adapters: Mapping[str, Any],
             max_tokens: int, failure_score: float = 0.0, metric_failure_score: float | None = 0.0,
             progress: bool | str = False, distributed: Distributed | None = None) -> dict[str, Any]:
    """Greedy accuracy (mean metric) of ``program`` on ``examples`` with the given role -> adapter map, with its 95%
    confidence interval (``interval``). Every example's calls are in flight together, so the engine batches them;
    ``progress`` (True or a label) shows a bar over finished examples. ``distributed``: each rank runs its shard of
    ``examples``; every rank returns the result over all of them (``graphs`` in ``examples`` order)."""
    from tqdm.auto import tqdm

    distributed = distributed or SingleProcess()
    examples = distributed.shard(list(examples))
    bar = tqdm(total=len(examples), desc=progress if isinstance(progress, str) else "evaluate", leave=False,
               disable=not progress)
    try:
        graphs = [g for gs in run_rollouts(program, examples, engine, adapters=adapters,
                                           sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
                                           on_done=bar.update) for g in gs]
    finally:
        bar.close()
    scores = [score_rollout(metric, g, failure_score=failure_score, metric_failure_score=metric_failure_score)
              for g in graphs]
    if distributed.world > 1:
        pairs = distributed.gather(list(zip(graphs, scores)))
        graphs, scores = [g for g, _ in pairs], [x for _, x in pairs]
    calls = [c for g in graphs for c in g.calls]
    return {
        "accuracy": sum(scores) / max(len(scores), 1),
        "interval": mean_interval(scores),
        "n": len(scores),
        "format_error_rate": sum(c.status == "format_error" for c in calls) / max(len(calls), 1),
        "crash_rate": sum(g.status == "crash" for g in graphs) / max(len(graphs), 1),
        "graphs": graphs,
    }


def _role_stats(graphs: list[RolloutGraph], groups: list[Group]) -> dict[str, dict[str, float]]:
    """Per role: calls, tokens, token share, reward mean/spread, no-signal group rate, format-error rate, truncated
    rate, entropy (and whether it was measured: the engine reported log-probs)."""
    out: dict[str, dict[str, float]] = {}
    calls = [c for g in graphs for c in g.calls]
    total_tokens = sum(len(c.completion_ids) for c in calls) or 1
    for role in dict.fromkeys(c.role for c in calls):
        mine = [c for c in calls if c.role == role]
        role_groups = [g for g in groups if g.role == role]
        rewards = [r for g in role_groups for r in g.rewards]
        known = [c for c in mine if c.logprobs_known and c.logprobs]
        if known and all(c.choice_ids is not None for c in known):
            # a choice role: its calls' log-probs sum to log q(c), the choice's probability among the choices, so
            # the estimate is per choice (nats per decision), not per token of the choice's spelling
            sampled = [sum(c.logprobs) for c in known]
        else:
            sampled = [lp for c in known for lp in c.logprobs]
        out[role] = {
            "calls": len(mine),
            "tokens": sum(len(c.completion_ids) for c in mine),
            "token_share": sum(len(c.completion_ids) for c in mine) / total_tokens,
            "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
            "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
            "no_signal_rate": sum(bool(g.no_signal) for g in role_groups) / max(len(role_groups), 1),
            "format_error_rate": sum(c.status == "format_error" for c in mine) / max(len(mine), 1),
            # calls cut at max_tokens: a rising rate means answers are being cut off (overlong_penalty acts on it)
            "truncated_rate": sum(c.finish_reason == "length" for c in mine) / max(len(mine), 1),
            # Monte-Carlo estimate of the sampling entropy: mean negative log-prob of the sampled tokens (of the
            # sampled choices, for a choice role: the entropy of its distribution over the choices)
            "entropy": -statistics.fmean(sampled) if sampled else 0.0,
            "entropy_measured": bool(sampled),  # False: the engine reported no log-probs (entropy 0.0 says nothing)
        }
    return out


def _add_guard_stats(per_role: dict[str, dict[str, Any]], groups: list[Group], weights: Mapping[tuple, float],
                     upd: dict[str, dict[str, Any]], role_adapters: Mapping[str, str], optimizers) -> None:
    """Adds per role: adapter, lr, fan_out (largest cohort), fanout_weight (mean row weight), grad_norm (the role's
    own gradient contribution, before its clip), grad_clipped, adapter_grad_norm (the summed gradient of its adapter),
    mass_share / mass_share_raw (share of its adapter's gradient mass after / before role balancing),
    balance_weight."""
    fan = cohort_sizes(groups)
    for role, adapter in role_adapters.items():
        if role not in per_role:
            continue
        mine = [weights.get(member_key(g, m), 1.0)
                for g in groups if g.role == role for m in g.members]
        st = upd.get(adapter, {}).get("roles", {}).get(role, {})
        per_role[role].update(
            adapter=adapter, lr=optimizers.lr(adapter), fan_out=fan.get(role, 1),
            fanout_weight=statistics.fmean(mine) if mine else 1.0,
            grad_norm=st.get("grad_norm", 0.0), grad_clipped=st.get("clipped", False),
            adapter_grad_norm=upd.get(adapter, {}).get("grad_norm", 0.0),
            mass_share=st.get("mass_share", 0.0), mass_share_raw=st.get("mass_share_raw", 0.0),
            balance_weight=st.get("balance_weight", 1.0))


class MMGRPO:
    """``MMGRPO(metric=..., steps=..., ...).compile(program, trainset=..., valset=..., model=..., backend=...)``."""

    def __init__(self, metric: Callable, *, config: MMGRPOConfig | None = None, **overrides):
        if not callable(metric):
            raise TypeError("metric must be callable: metric(example, prediction, trace=None) -> float | bool")
        self.metric = metric
        base = config.model_dump() if config is not None else {}
        self.config = MMGRPOConfig(**{**base, **overrides})

    def compile(self, program: dspy.Module, *, trainset: Sequence, valset: Sequence | None = None,
                model: str = "smollm2-135m", backend: Any = "shared", engine=None, policy: Policy | None = None,
                run_dir: str | Path | None = None, program_import_path: str | None = None,
                progress: bool = True, resume: str | Path | bool | None = None,
                distributed: Distributed | None = None) -> CompiledProgram:
        """Train ``program``'s roles and return a :class:`CompiledProgram`. The input program is never mutated.

        ``policy`` (a :class:`wfc.policy.Policy`) holds the trained weights; ``engine`` (an engine, or a name:
        ``"hf"``, ``"vllm"``, ``"vllm-server"``) runs the rollouts. Neither given: a policy on ``model`` (on the
        config's ``device``/``dtype``) and a colocated HF engine on it. An ``HFEngine`` alone: its own policy, unless
        its weights are in another dtype than the config's (``HFEngine(m, dtype="bfloat16")``, a bf16 rollout engine):
        then a policy of its own on the same base, in the config's dtype. Another engine alone: a policy on the
        engine's base (its loaded handle where it has one).

        ``resume=RUN_DIR`` (or ``resume=True`` with ``run_dir``) continues a killed compile from the checkpoint in
        that run directory; pass the same arguments otherwise (``steps`` may change).

        ``distributed`` (``compilers.distributed``): the data-parallel ranks this compile is one of; default
        :func:`~compilers.distributed.from_env` (the ranks of a ``torchrun`` launch, else one process). Every rank
        must call compile with the same arguments; only rank 0 writes ``run_dir`` and shows progress."""
        cfg = self.config
        run_dir = _resume_dir(resume, run_dir)
        resumed = ckpt.load(run_dir) if resume else None  # verified before any model work: a bad one fails fast
        role_map = roles(program)
        trainset = list(trainset)
        if not trainset:
            raise ValueError("trainset is empty: pass the examples to train on (dspy.Examples with inputs set)")
        for i, ex in enumerate(trainset[:3] + list(valset or [])[:3]):
            if not isinstance(ex, dspy.Example) or not ex.inputs().keys():
                raise TypeError(f"example {i} must be a dspy.Example with inputs, e.g. "
                                "dspy.Example(question=..., answer=...).with_inputs('question')")
        valset = list(valset) if valset else []
        student = copy_program(program)
        if distributed is None:  # before the policy is built: a CUDA rank must be on its own GPU first
            distributed = from_env(device=policy.device if policy is not None else cfg.device)
        main = distributed.is_main
        progress = progress and main
        frozen = _check_frozen(cfg, list(role_map))
        trained = [r for r in role_map if r not in frozen]
        engine, policy = _policy_and_engine(engine, policy, model, cfg)
        check_role_keys("role_learning_rates", cfg.role_learning_rates, trained)
        check_role_keys("role_max_grad_norm", cfg.role_max_grad_norm, trained)
        check_role_keys("counterfactual_roles", {r: 1 for r in cfg.counterfactual_roles if r != "*"}, trained)
        # LoRA init and unseeded sampling (counterfactual reruns) draw from torch's generator
        torch.manual_seed(cfg.seed)
        if resumed is not None and isinstance(backend, str) and backend == "auto":  # the run's own traced choice
            plan = BackendPlan(resumed.plan["spec"], dict(resumed.plan["role_adapters"]), list(resumed.plan["reasons"]))
        elif isinstance(backend, str) and backend == "auto":
            from compilers.auto import plan as auto_plan

            plan = distributed.broadcast(auto_plan(student, trainset, engine, config=cfg, seed=cfg.seed)
                                         if main else None)  # traced once: every rank trains the same plan
            plan = _without(plan, frozen)
            if progress:
                print(plan.describe())
        else:
            plan = resolve_backend(backend, trained)
        # trained role -> adapter: what rollouts route by (a role it does not name, a frozen one, runs on the base
        # model: wfc.lower.bind) and what the update trains; the artifact also lists the frozen roles, as None
        role_adapters = plan.role_adapters
        fingerprint = ckpt.fingerprint(cfg, base_model=policy.handle.name, base_checksum=policy.handle.checksum,
                                       role_adapters=role_adapters, trainset=trainset, valset=valset,
                                       metric=self.metric, program=program)
        if resumed is not None:
            ckpt.check_fingerprint(resumed.data["fingerprint"], fingerprint, where=resumed.path)
            if cfg.steps < resumed.step:
                raise ValueError(f"steps={cfg.steps} but the checkpoint in {run_dir} is after step {resumed.step}: "
                                 f"resume with steps >= {resumed.step}")
        if distributed.world > 1:
            _check_same_compile(distributed, fingerprint)
        rates = adapter_learning_rates(role_adapters, cfg.learning_rate, cfg.role_learning_rates)
        multi_role = any(list(role_adapters.values()).count(a) > 1 for a in plan.adapters)  # balancing applies
        credit = get_credit(cfg.credit)
        if cfg.curriculum_key is not None and not all(cfg.curriculum_key in ex for ex in trainset):
            raise ValueError(f"curriculum_key={cfg.curriculum_key!r}: every training example needs that field "
                             "(a number, easier is smaller); or leave it None to treat trainset order as easiest first")
        sampler = PromptSampler(
            len(trainset), seed=cfg.seed, band=cfg.pass_band, replay_after=cfg.replay_after,
            difficulty=[float(ex[cfg.curriculum_key]) for ex in trainset] if cfg.curriculum_key else None,
            curriculum_steps=cfg.curriculum_steps, curriculum_start=cfg.curriculum_start)
        for adapter in plan.adapters:
            policy.add_adapter(adapter, cfg.lora.peft_config())
            if distributed.world > 1:  # seeded alike already; rank 0's initial weights make sure of it
                distributed.broadcast_(adapter_parameters(policy.model, adapter))
        optimizers = AdapterOptimizers(policy, plan.adapters, lr=rates)
        handed: dict[str, int] = {}  # adapter -> the revision the engine holds

        def hand_off(names: Sequence[str] | None = None) -> None:
            """Give the engine every adapter (of ``names``) whose revision it does not hold yet."""
            changed = [a for a in (plan.adapters if names is None else names)
                       if handed.get(a) != policy.revision(a)]
            if changed:
                revs = policy.export(changed)
                engine.load_adapters(revs)
                handed.update({r.name: r.revision for r in revs})

        hand_off()
        if main and resumed is None and ckpt.find(run_dir) is not None:
            warnings.warn(f"{run_dir} holds the checkpoint of an earlier compile: this one starts over and replaces "
                          f"it (its metrics.jsonl moves to metrics.previous.jsonl); pass resume={str(run_dir)!r} "
                          f"(CLI --resume) to continue that one instead",
                          stacklevel=2)
        log = RunLog(run_dir, write=main, fresh=resumed is None)
        if resumed is None:
            log.append({"kind": "plan", "backend": plan.spec, "roles": role_adapters, "reasons": plan.reasons,
                        "learning_rates": rates, "frozen_roles": frozen, "skip_frozen": cfg.skip_frozen})
        steps = cfg.steps
        st = ckpt.LoopState()  # history, evals, events, revisions, best, rollback, tokens spent: what a resume restores
        if resumed is not None:  # the demos are in the program state the checkpoint restores
            steps = 0 if cfg.strategy == "p" else steps
        elif cfg.strategy in ("p", "p -> w"):
            t0 = time.time()
            boot: dict[str, Any] = {}
            demos = None
            if main:  # bootstrapped once: every rank trains with the same demos
                demos = bootstrap_demos(student, trainset, engine, metric=self.metric, k=cfg.demos_per_role,
                                        adapters=role_adapters, n_examples=cfg.bootstrap_examples,
                                        repeats=cfg.bootstrap_repeats, temperature=cfg.temperature,
                                        max_tokens=cfg.max_tokens, seed=cfg.seed,
                                        metric_failure_score=cfg.metric_failure_score, labeled=cfg.labeled_demos,
                                        stats=boot)
            demos, boot = distributed.broadcast((demos, boot))
            counts = apply_demos(student, demos)
            st.spent += boot["completion_tokens"]
            log.append({"kind": "demos", "strategy": cfg.strategy, "counts": counts, **boot,
                        "seconds": round(time.time() - t0, 2)})
            if progress:
                print(f"bootstrapped demos per role: {counts} ({time.time() - t0:.0f}s)")
            if cfg.strategy == "p":
                steps = 0
        if cfg.retrieved_demos:
            # rebuilt on a resume too: the pools are a pure function of the trainset and the metric (no tokens)
            t0 = time.time()
            pools = retrieval_pools(student, trainset, metric=self.metric, k=cfg.retrieved_demos,
                                    labels=cfg.demo_labels, metric_failure_score=cfg.metric_failure_score)
            install_retrievers(student, pools)
            if resumed is None:
                log.append({"kind": "retrieval", "k": cfg.retrieved_demos,
                            "pools": {role: len(r.pool) for role, r in pools.items()},
                            "seconds": round(time.time() - t0, 2)})
            if progress:
                print(f"retrieved demos: {cfg.retrieved_demos} per run from pools "
                      f"{ {role: len(r.pool) for role, r in pools.items()} } ({time.time() - t0:.0f}s)")
        revisions = st.revisions
        eval_tokens = cfg.eval_max_tokens or cfg.max_tokens
        sampling = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens)

        def validate(step: int) -> float | None:
            if not valset:
                revisions[step] = {a: policy.adapter_state(a) for a in plan.adapters}
                return None
            t0 = time.time()
            res = evaluate(student, valset, engine, metric=self.metric, adapters=role_adapters,
                           max_tokens=eval_tokens, failure_score=cfg.failure_score, progress=progress and "validate",
                           metric_failure_score=cfg.metric_failure_score if cfg.metric_failure_score is not None
                           else cfg.failure_score, distributed=distributed)
            revisions[step] = {a: policy.adapter_state(a) for a in plan.adapters}
            if cfg.skip_frozen and step == 0:
                _check_skippable(res["graphs"], frozen, roles(student))
            record = {"kind": "eval", "step": step, "val_accuracy": res["accuracy"], "n": res["n"],
                      "interval": [round(x, 4) for x in res["interval"]],
                      "format_error_rate": res["format_error_rate"], "crash_rate": res["crash_rate"],
                      "seconds": round(time.time() - t0, 2)}
            log.append(record)
            st.history.append(record)
            st.evals.append((step, res["accuracy"]))
            return res["accuracy"]

        def guard_cliff(step: int) -> None:
            cliff = detect_cliff(st.evals, drop=cfg.cliff_drop, patience=cfg.cliff_patience,
                                 after_step=st.last_rollback)
            if cliff is None:
                return
            best = revisions[cliff.best_step]
            moved = [a for a in plan.adapters
                     if any(not torch.equal(v, best[a][k]) for k, v in revisions[step][a].items())]
            for adapter in moved:
                policy.restore_adapter(adapter, best[adapter])
                optimizers.scale_lr(adapter, cfg.cliff_lr_factor)
            hand_off(moved)
            event = {"kind": "cliff", "action": "rollback", "step": step, "from_step": step, "to_step": cliff.best_step,
                     "best_accuracy": cliff.best_accuracy, "fell_at": list(cliff.steps),
                     "accuracies": list(cliff.accuracies), "drop": cfg.cliff_drop, "patience": cfg.cliff_patience,
                     "adapters": moved, "lr_factor": cfg.cliff_lr_factor,
                     "learning_rates": {a: optimizers.lr(a) for a in moved}}
            log.append({"kind": "event", **{k: v for k, v in event.items() if k != "kind"}, "event": event["kind"]})
            st.events.append(event)
            st.history.append({"kind": "event", "step": step, "event": event["kind"], "to_step": cliff.best_step})
            st.last_rollback, st.current = step, cliff.best_step

        from tqdm.auto import tqdm

        cf_cost = {"runs": 0, "completion_tokens": 0}  # counterfactual credit's cost in the current step

        def roll_out(indices: list[int], step: int) -> list[list[RolloutGraph]]:
            """The scored, credited rollouts of ``indices`` (this rank's shard run here, the rest gathered)."""
            mine = distributed.shard(indices)
            examples = [trainset[i] for i in mine]
            # an example's rollouts at a step sample with seeds of their own (seed, step, example index): the
            # draw repeats whatever the thread timing and whichever rank runs it
            seeds = [derive_seed(cfg.seed, "rollout", step, i) for i in mine]
            rollouts = run_rollouts(student, examples, engine, repeats=cfg.group_size, adapters=role_adapters,
                                    sampling=sampling, max_workers=cfg.rollout_workers, seeds=seeds,
                                    stop_roles=frozen if cfg.skip_frozen else ()) if examples else []
            cost = {k: 0 for k in cf_cost}
            for graphs in rollouts:
                for g in graphs:
                    score_rollout(self.metric, g, failure_score=cfg.failure_score,
                                  metric_failure_score=cfg.metric_failure_score)
                    credit(self.metric, g, metric_failure_score=cfg.metric_failure_score)
            if cfg.counterfactual_roles and examples:
                cost = counterfactual_credit(student, examples, rollouts, engine, metric=self.metric,
                                             # "*": every trained role (a frozen role's credit trains nothing)
                                             roles=trained if "*" in cfg.counterfactual_roles
                                             else cfg.counterfactual_roles, adapters=role_adapters,
                                             sampling=sampling, failure_score=cfg.failure_score,
                                             metric_failure_score=cfg.metric_failure_score)
            if distributed.world > 1:  # every rank: the whole draw, in the order of indices
                parts = distributed.gather([(rollouts, cost)])
                rollouts = [graphs for part, _ in parts for graphs in part]
                cost = {k: sum(c[k] for _, c in parts) for k in cost}
            for k in cf_cost:
                cf_cost[k] += cost[k]
            return rollouts

        def collect(step: int) -> tuple[list[list[RolloutGraph]], dict[str, Any]]:
            """The step's rollouts: ``examples_per_step`` examples, or (dynamic sampling) as many examples with
            signal, drawing replacements for flat ones for up to ``max_draw_rounds`` rounds."""
            quota, kept, drawn, flat, rounds, rewards, tokens = cfg.examples_per_step, [], [], 0, 0, [], 0
            cf_cost.update(runs=0, completion_tokens=0)
            while len(kept) < quota and rounds < (cfg.max_draw_rounds if cfg.dynamic_sampling else 1):
                rate = len(kept) / len(drawn) if drawn else 1.0  # oversample by the signal rate seen so far
                want = min(2 * quota, math.ceil((quota - len(kept)) / max(rate, 1 / 3)))
                indices = sampler.draw(want, exclude=drawn)
                if not indices:
                    break
                drawn.extend(indices)
                rollouts = roll_out(indices, step)
                signal = signal_examples(_trained(build_groups(
                    rollouts, mode=cfg.grouping, failure_score=cfg.failure_score,
                    format_failure_score=cfg.format_failure_score, pool_fanout=cfg.pool_fanout,
                    overlong_penalty=cfg.overlong_penalty), role_adapters), len(indices))
                rewards.extend(g.reward for graphs in rollouts for g in graphs)
                tokens += sum(len(c.completion_ids) for graphs in rollouts for g in graphs for c in g.calls)
                for i, graphs, has in zip(indices, rollouts, signal):
                    sampler.observe(i, statistics.fmean(min(max(g.reward, 0.0), 1.0) for g in graphs))
                    if has or not cfg.dynamic_sampling:
                        kept.append(graphs)
                    else:
                        flat += 1
                rounds += 1
            sampler.advance()
            tokens += cf_cost["completion_tokens"]  # the budget counts what counterfactual reruns generated
            return kept, {"reward_mean_drawn": statistics.fmean(rewards) if rewards else None,
                          "completion_tokens": tokens, "counterfactual": dict(cf_cost),
                          "examples_drawn": len(drawn), "examples_kept": len(kept), "examples_flat": flat,
                          "draw_rounds": rounds, "sampler": sampler.summary()}

        revision_files = ckpt.RevisionFiles()

        def checkpoint(step: int) -> None:
            st.step = step
            if not main:  # one writer; every rank holds the same state
                return
            ckpt.save(run_dir, loop=st, policy=policy, adapters=plan.adapters, optimizers=optimizers,
                      sampler=sampler, student=student, fingerprint=fingerprint, plan={"spec": plan.spec, "role_adapters": role_adapters, "reasons": plan.reasons},
                      revision_files=revision_files)

        if resumed is None:
            st.val = validate(0)
            st.best_step, st.best_val = 0, st.val
            checkpoint(0)
        else:
            if main:  # cuts metrics.jsonl back; the other ranks read it after
                log.records = ckpt.restore_log(resumed)
                ckpt.drop_later_revisions(run_dir, resumed.step)
            distributed.barrier()
            if not main:
                log.records = ckpt.restore_log(resumed)
            revision_files = resumed.revision_files()
            st = ckpt.restore(resumed, policy=policy, engine=engine, adapters=plan.adapters, optimizers=optimizers,
                              sampler=sampler, student=student)  # RNGs last: nothing draws before the next step
            handed.update({a: policy.revision(a) for a in plan.adapters})  # restore handed them over
            revisions = st.revisions
            log.append({"kind": "resume", "after_step": st.step, "checkpoint": str(resumed.path)})
            if progress:
                print(f"resumed {run_dir} after step {st.step}")
        bar = tqdm(range(st.step + 1, steps + 1), desc="mmGRPO", disable=not progress, initial=st.step, total=steps)
        for step in bar:
            if cfg.max_rollout_tokens is not None and st.spent >= cfg.max_rollout_tokens:
                steps = step - 1  # the budget is spent: this is the last step (validated below if it was not)
                if steps not in revisions:
                    st.val = validate(steps)
                    if st.val is not None and (st.best_val is None or st.val > st.best_val):
                        st.best_step, st.best_val = steps, st.val
                break
            t0 = time.time()
            rollouts, drawing = collect(step)
            st.spent += drawing["completion_tokens"]
            drawing["completion_tokens_total"] = st.spent
            t_roll = time.time() - t0
            all_groups = build_groups(rollouts, mode=cfg.grouping, failure_score=cfg.failure_score,
                                      format_failure_score=cfg.format_failure_score, pool_fanout=cfg.pool_fanout,
                                      overlong_penalty=cfg.overlong_penalty)
            groups = _trained(all_groups, role_adapters)
            scored = []
            for g in all_groups:  # a frozen role's advantages too: its step stats read them, the update does not
                ga = group_advantages(g.rewards, cfg.advantage)
                g.advantages, g.no_signal = ga.advantages, ga.no_signal
                if g.role in role_adapters:
                    scored.append(ga)  # the step's no-signal rate: of what trains
            scales = role_scales((g.role, g.advantages) for g in groups) if cfg.role_advantage_norm else {}
            for g in groups:
                if scales.get(g.role, 1.0) != 1.0:
                    g.advantages = [a * scales[g.role] for a in g.advantages]
            t1 = time.time()
            lr_mult = lr_multiplier(step, steps, schedule=cfg.lr_schedule, warmup=cfg.warmup_steps,
                                    min_ratio=cfg.min_lr_ratio)
            optimizers.apply_schedule(lr_mult)
            weights = fanout_weights(groups) if cfg.fanout_scaling else {}
            graphs = [g for gs in rollouts for g in gs]
            per_role = _role_stats(graphs, all_groups)  # of the rollouts, so before the update
            # a role whose engine reported no log-probs (a scripted engine) has no measured entropy: no bonus
            bonus = entropy_bonus({r: s["entropy"] for r, s in per_role.items() if s["entropy_measured"]},
                                  floor=cfg.entropy_floor, coef=cfg.entropy_coef)
            upd = update(policy, optimizers, groups, role_adapters, config=cfg, weights=weights,
                         distributed=distributed, entropy_coefs=bonus)
            t_sync = time.time()
            hand_off()  # adapter-only hand-off of what the step changed (a no-op where rollouts share the model)
            t_sync = time.time() - t_sync
            st.current = step
            for role in per_role:
                per_role[role]["entropy_bonus"] = bonus.get(role, 0.0)
                if role in frozen:
                    per_role[role]["frozen"] = True
            _add_guard_stats(per_role, groups, weights, upd, role_adapters, optimizers)
            record = {
                "kind": "step", "step": step,
                # over every rollout drawn (dynamic sampling trains on a subset; this is how the policy does)
                "reward_mean": drawing["reward_mean_drawn"] if drawing["reward_mean_drawn"] is not None else 0.0,
                "rollouts": len(graphs),
                "drawing": drawing,
                "role_advantage_scales": scales,
                "lr_multiplier": round(lr_mult, 6),
                "learning_rates": {a: optimizers.lr(a) for a in plan.adapters},
                "crashes": sum(g.status == "crash" for g in graphs),
                "format_errors": sum(c.status == "format_error" for g in graphs for c in g.calls),
                "format_error_rate": (sum(c.status == "format_error" for g in graphs for c in g.calls)
                                      / max(sum(len(g.calls) for g in graphs), 1)),
                "no_signal_rate": no_signal_rate(scored) if scored else 1.0,
                "logprob_mismatch": merge_mismatch([u.get("logprob_mismatch", {}) for u in upd.values()]),
                "importance_correction": cfg.importance_correction,
                "groups": len(groups),
                "adapters": upd,
                "roles": per_role,
                "guards": {"fanout_scaling": cfg.fanout_scaling,
                           "role_balance": cfg.role_balance and multi_role,
                           "role_share_cap": cfg.role_share_cap, "role_clip": cfg.role_clip,
                           "cliff_guard": cfg.cliff_guard and bool(valset),
                           "entropy_floor": cfg.entropy_floor},
                "seconds_rollout": round(t_roll, 2),
                "seconds_update": round(time.time() - t1 - t_sync, 2),
                "seconds_handoff": round(t_sync, 3),
            }
            log.append(record)
            st.history.append({k: v for k, v in record.items() if k != "adapters"})
            evaluated = (cfg.eval_every and step % cfg.eval_every == 0) or step == steps
            if evaluated:
                st.val = validate(step)
            val = st.val
            if val is not None and (st.best_val is None or val > st.best_val) and step in revisions:
                st.best_step, st.best_val = step, val
            if evaluated and val is not None and cfg.cliff_guard:
                guard_cliff(step)
            checkpoint(step)
            bar.set_postfix(reward=f"{record['reward_mean']:.2f}", val=f"{val:.2f}" if val is not None else "-",
                            fmt=f"{record['format_error_rate']:.2f}", crash=record["crashes"])
        # "last": the revision the adapters hold now (after a final rollback, the best one, not the step's own)
        best_step, best_val = st.best_step, st.best_val
        keep_step = best_step if (cfg.keep == "best" and best_val is not None) else st.current
        for adapter, state in revisions[keep_step].items():
            policy.restore_adapter(adapter, state)
        hand_off()
        log.plot()
        manifest = Manifest(
            name=getattr(program, "name", "") or type(program).__name__,
            base_model=policy.handle.name,
            base_model_checksum=policy.handle.checksum,
            program_import_path=program_import_path,
            program_class=f"{type(program).__module__}:{type(program).__qualname__}",
            roles={r: role_adapters.get(r) for r in role_map},  # a frozen role: None, the base model
            backend=plan.spec,
            backend_reasons=plan.reasons,
            config={"metric": getattr(self.metric, "__name__", repr(self.metric)), **cfg.model_dump()},
            history=st.history,
            best_step=best_step if best_val is not None else None,
            revision_step=keep_step,
            events=st.events,
            sampling={"temperature": 0.0, "max_tokens": eval_tokens},
            package_versions=package_versions(),
        )
        return CompiledProgram(student, engine, manifest, policy=policy, revisions=revisions, run_dir=run_dir)


def _check_frozen(cfg: MMGRPOConfig, role_paths: list[str]) -> list[str]:
    """The config's frozen roles, checked against the program's roles: each must be one, and one role at least must
    be left to train."""
    unknown = [r for r in cfg.frozen_roles if r not in role_paths]
    if unknown:
        raise ValueError(f"frozen_roles names {unknown}, which the program does not have; its roles are {role_paths}")
    if role_paths and set(cfg.frozen_roles) >= set(role_paths):
        raise ValueError(f"frozen_roles freezes every role ({role_paths}): nothing is left to train; for the program "
                         "as it is, run it uncompiled (or use strategy='p' for demonstrations only)")
    return [r for r in role_paths if r in cfg.frozen_roles]  # program order


def _without(plan: BackendPlan, frozen: Sequence[str]) -> BackendPlan:
    """``plan`` less the frozen roles (an ``auto`` plan is traced over every role)."""
    if not frozen:
        return plan
    kept = {r: a for r, a in plan.role_adapters.items() if r not in frozen}
    return BackendPlan(plan.spec, kept, plan.reasons + [f"frozen (base model, not trained): {list(frozen)}"],
                       role_graph=plan.role_graph)


def _trained(groups: list[Group], role_adapters: Mapping[str, str]) -> list[Group]:
    """The groups of trained roles: a frozen role's calls make no rows, and its reward spread is no signal."""
    return [g for g in groups if g.role in role_adapters]


def _check_skippable(graphs: Sequence[RolloutGraph], frozen: Sequence[str], role_map: Mapping[str, Any]) -> None:
    """``skip_frozen`` is exact only when every frozen call comes after every trained call and revises the answer:
    checked on the step-0 validation runs (the whole program, greedy). Raises ``ValueError`` saying which rule broke."""
    for g in graphs:
        calls = sorted(g.calls, key=lambda c: c.started)
        first = next((i for i, c in enumerate(calls) if c.role in frozen), None)
        if first is None:
            continue
        late = sorted({c.role for c in calls[first:] if c.role not in frozen})
        if late:
            raise ValueError(f"skip_frozen: trained role(s) {late} were called after frozen role "
                             f"{calls[first].role!r} in a validation run; skipping would never train those calls. "
                             "Set skip_frozen=False, or freeze only roles that come last")
        if g.outputs:
            fields = set(role_map[calls[first].role].signature.output_fields)
            if not set(g.outputs) <= fields:
                raise ValueError(f"skip_frozen: frozen role {calls[first].role!r} gives {sorted(fields)}, not the "
                                 f"program's answer {sorted(g.outputs)}; a stopped run is scored on the latest "
                                 "answer before it, so only a role that revises the answer can be skipped. Set "
                                 "skip_frozen=False")


def _check_same_compile(distributed: Distributed, fingerprint: Mapping[str, Any]) -> None:
    """Every rank must run the same compile (config, base weights, plan, data, metric, program): else the gathered
    steps would mix different problems. ValueError on every rank, naming what differs from rank 0."""
    import json

    mine = json.dumps(fingerprint, sort_keys=True, default=str)
    ranks = distributed.gather([mine])
    bad = {r: f for r, f in enumerate(ranks) if f != ranks[0]}
    if bad:
        first = json.loads(ranks[0])
        r, theirs = next(iter(bad.items()))
        keys = sorted(k for k, v in json.loads(theirs).items() if first.get(k) != v)
        raise ValueError(f"rank {r} of {distributed.world} compiles something else than rank 0 (differs in {keys}): "
                         "launch every rank with the same program, data, config, seed and base model")


def _policy_and_engine(engine, policy: Policy | None, model: str, cfg: MMGRPOConfig):
    """The (engine, policy) pair of a compile (see ``MMGRPO.compile``). A policy given or taken from an HF engine
    is used where it lives; an explicit ``cfg.device`` that disagrees with it is a ValueError."""
    from wfc.engines.hf import HFEngine
    from wfc.models import ModelHandle

    if policy is None and isinstance(engine, HFEngine):
        if engine.policy.dtype == getattr(torch, cfg.dtype):
            policy = engine.policy
        else:  # a rollout engine in another dtype (bf16): train a policy of its own, in the config's dtype
            policy = Policy(engine.handle.name, device=cfg.device, dtype=cfg.dtype)
    if policy is None:
        handle = getattr(engine, "handle", None)
        base = handle if isinstance(handle, ModelHandle) else model
        policy = Policy(base, device=cfg.device, dtype=cfg.dtype)
    elif cfg.device != "auto" and resolve_device(cfg.device) != policy.device:
        raise ValueError(f"device={cfg.device!r} but the policy lives on {policy.device}: build the policy (or the "
                         f"HF engine) with device={cfg.device!r}, or leave device='auto'")
    if cfg.gradient_checkpointing:  # one place for every policy: built here, taken from the engine, or given
        policy.enable_gradient_checkpointing()
    if engine is None or engine == "hf":
        engine = HFEngine(policy=policy)
    elif isinstance(engine, str):  # "vllm" or "vllm-server": its own copy of the base, adapters handed over
        from wfc.engines import make_engine

        engine = make_engine(engine, policy.handle)  # the loaded base, shared: vLLM reads its path
    return engine, policy


def _resume_dir(resume: str | Path | bool | None, run_dir: str | Path | None) -> Path:
    """The run directory: ``resume`` (a path), else ``run_dir``, else a new ``runs/<time>``."""
    if resume is True:
        if run_dir is None:
            raise ValueError("resume=True resumes run_dir, but no run_dir was given: pass resume=RUN_DIR (the run "
                             "directory of the compile to continue)")
        return Path(run_dir)
    if resume:
        if run_dir is not None and Path(run_dir).resolve() != Path(resume).resolve():
            raise ValueError(f"resume={str(resume)!r} and run_dir={str(run_dir)!r} differ: a resumed compile "
                             "continues in its own run directory; pass one of them")
        return Path(resume)
    return Path(run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
