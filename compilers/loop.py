"""The stages of one mmGRPO compile, in the order :meth:`compilers.mmgrpo.MMGRPO.compile` calls them.

A :class:`CompileRun` holds what the setup stages build (the program copy, the ranks, the policy and the engine, the
backend plan, the sampler, the optimizers, the log) and a :class:`RunState` beside it: what changes from step to
step. ``RunState.loop`` is the checkpointed part (:class:`compilers.state.LoopState`, in its own module beside
this one; the checkpoint writes and reads it); the rest of it is rebuilt by every compile, resumed or not. One
training step is the stages
:meth:`~CompileRun.collect` (roll out, score, credit, dynamic sampling), :meth:`~CompileRun.group`
(groups and advantages), :meth:`~CompileRun.schedule_lr`, :meth:`~CompileRun.update`,
:meth:`~CompileRun.hand_off` and :meth:`~CompileRun.after_step` (log, validation, keep-best, cliff guard,
checkpoint); a :class:`Step` carries one step's data from stage to stage.

Each stage reads its own section of the config (``CompileRun.sections``, :class:`compilers.config.Sections`): the
rollouts ``sampling`` (and ``credit`` for scoring them), the update ``update`` and ``guards`` (plus the sampling
temperature its log-probs are computed under), validation ``evaluation``; the whole config is read only to fingerprint
the run and to record it in the manifest. Variants come from the sections as objects (the credit rule, the advantage
estimator, the strategy), never as names to test.

Signal where the base model is weak (each a config field, off by default; ``compilers.sampling``): the pass-rate
probe (``pass_rate_probe``: a ``probe`` record before the step-0 validation) primes the sampler's running pass rates
and may order the curriculum; ``adaptive_rollouts`` sizes each drawn example's group from its rate (the step record's
``drawing.group_sizes``, beside ``drawing.indices``); every step record says under ``starvation`` how many drawn
examples were flat, the running pass rate and the remedies in force, and a starved step says so on the progress bar.
The warm start (``warm_start_runs``; ``compilers.warm_start``) fine-tunes every trained role's adapter on the
program's own passing calls before the step-0 validation (a ``warm_start`` record).

Invariants (a resumed compile repeats the uninterrupted one: ``tests/compilers/test_resume.py``): the stages draw
random numbers in one fixed order (after ``torch.manual_seed(cfg.seed)``: the ``auto`` trace, LoRA init, the
fine-tune on the student's demos (``student_demos='internalize'``), bootstrap,
the warm start's update, then per step the sampler, the rollouts, counterfactual reruns and the update), and nothing
draws between a resume's restore of the RNGs and the next step. The pass-rate probe and the warm start's runs (a
fresh run's, before the step-0 validation) sample with seeds of their own and draw from no global generator; what the
probe measured is in the sampler's state, what the warm start trained is in the adapters.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import dspy
import torch
from tqdm.auto import tqdm

from compilers import checkpoint as ckpt
from compilers.advantages import group_advantages, no_signal_rate, role_scales
from compilers.auto import plan as auto_plan
from compilers.backends import BackendPlan, fresh_names, resolve_backend
from compilers.config import MMGRPOConfig
from compilers.counterfactual import counterfactual_credit
from compilers.diagnostics import (add_guard_stats, remedies_in_force, role_stats, starvation, starvation_note,
                                   starvation_postfix)
from compilers.distributed import Distributed, from_env
from compilers.group import Group, build_groups
from compilers.guards import adapter_learning_rates, check_role_keys, detect_cliff, entropy_bonus, fanout_weights
from compilers.offpolicy import merge_mismatch
from compilers.prepare import (check_frozen, check_same_compile, check_skippable, policy_and_engine, resume_dir,
                               without_frozen)
from compilers.prompts import apply_demos, bootstrap_demos, retrieval_pools
from compilers.remedies import AUTO_PROBE_EXAMPLES, AUTO_PROBE_RUNS, choose, pass_rates, probe_subset
from compilers.runlog import RunLog
from compilers.sampling import PromptSampler, adaptive_group_sizes, signal_examples
from compilers.schedule import lr_multiplier, partial_step_scale
from compilers.score import score_rollout
from compilers.state import LoopState
from compilers.student_demos import RULES as STUDENT_DEMOS
from compilers.student_demos import DemoCalls, demo_calls, demo_counts, demo_rows, drop_demos
from compilers.update import AdapterOptimizers, adapter_parameters
from compilers.warm_start import Harvest, fine_tune, role_counts, run_counts, sft_rows, successes
from wfc.artifact import CompiledProgram, Manifest, package_versions
from wfc.engines.base import SamplingParams
from wfc.lower import call_adapter, copy_program, derive_seed, roles, run_rollouts
from wfc.policy import Policy
from wfc.retrieve import install as install_retrievers
from wfc.rollout import RolloutGraph


def trained_groups(groups: list[Group], role_adapters: Mapping[str, str]) -> list[Group]:
    """The groups of trained roles: a frozen role's calls make no rows, and its reward spread is no signal."""
    return [g for g in groups if g.role in role_adapters]


@dataclass
class RunState:
    """The compile loop's state: ``loop``, the bookkeeping a checkpoint saves and a resume restores (history,
    evaluations, events, revisions, best, rollback, tokens spent), and what every compile rebuilds."""

    loop: LoopState = field(default_factory=LoopState)
    steps: int = 0  # the last step: the config's, 0 under strategy "p", cut where the token budget runs out
    handed: dict[str, int] = field(default_factory=dict)  # adapter -> the revision the engine holds
    revision_files: ckpt.RevisionFiles = field(default_factory=ckpt.RevisionFiles)  # revisions already on disk
    probed: bool = False  # auto_remedies measured the pass rates already: the probe stage does not again


@dataclass
class Step:
    """One training step's data, filled stage by stage."""

    step: int
    rollouts: list[list[RolloutGraph]] = field(default_factory=list)
    drawing: dict[str, Any] = field(default_factory=dict)
    starvation: dict[str, Any] = field(default_factory=dict)  # flat examples, pass rate, remedies in force
    all_groups: list[Group] = field(default_factory=list)  # every role's, a frozen role's too
    groups: list[Group] = field(default_factory=list)  # the trained roles': what the update trains
    scored: list = field(default_factory=list)  # the trained groups' advantage results (the no-signal rate)
    scales: dict[str, float] = field(default_factory=dict)
    lr_mult: float = 1.0
    partial_scale: float | None = None  # scale_partial_steps: the share of a full step the kept examples make
    weights: dict[tuple, float] = field(default_factory=dict)
    per_role: dict[str, dict[str, Any]] = field(default_factory=dict)
    upd: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # rollout, handoff
    update_started: float = 0.0

    @property
    def graphs(self) -> list[RolloutGraph]:
        return [g for gs in self.rollouts for g in gs]


class CompileRun:
    """One compile: ``MMGRPO.compile`` builds it and calls its stages in order. ``evaluate`` and ``update`` are the
    validation and optimizer-step functions (``compilers.mmgrpo``'s, looked up when compile is called)."""

    def __init__(self, metric: Callable, cfg: MMGRPOConfig, program: dspy.Module, *, trainset: Sequence,
                 valset: Sequence | None, run_dir: str | Path | None, resume: str | Path | bool | None,
                 evaluate: Callable, update: Callable):
        """The inputs, checked: a checkpoint to resume is verified before any model work (a bad one fails fast)."""
        self.metric, self.cfg, self.program = metric, cfg, program
        self.lockstep_timeouts_seen = 0  # the engine's count at the last step record (``lockstep_timeouts``)
        self.sections = cfg.sections()  # what each stage reads: its own section
        self.evaluate, self.update_adapters = evaluate, update
        self.run_dir = resume_dir(resume, run_dir)
        self.resumed = ckpt.load(self.run_dir) if resume else None
        self.role_map = roles(program)
        self.trainset = list(trainset)
        if not self.trainset:
            raise ValueError("trainset is empty: pass the examples to train on (dspy.Examples with inputs set)")
        for i, ex in enumerate(self.trainset[:3] + list(valset or [])[:3]):
            if not isinstance(ex, dspy.Example) or not ex.inputs().keys():
                raise TypeError(f"example {i} must be a dspy.Example with inputs, e.g. "
                                "dspy.Example(question=..., answer=...).with_inputs('question')")
        self.valset = list(valset) if valset else []
        self.student = copy_program(program)
        sampling = self.sections.sampling
        self.state = RunState(steps=self.sections.run.steps)
        self.eval_tokens = self.sections.evaluation.eval_max_tokens or sampling.max_tokens
        self.sampling_params = SamplingParams(temperature=sampling.temperature, max_tokens=sampling.max_tokens)
        self.remedies = remedies_in_force(cfg)

    # ----- setup ----------------------------------------------------------------------------------------------------
    def place(self, engine, policy: Policy | None, model: str, distributed: Distributed | None,
              progress: bool) -> None:
        """The ranks, the frozen and trained roles, the policy and the engine."""
        sec = self.sections
        if distributed is None:  # before the policy is built: a CUDA rank must be on its own GPU first
            distributed = from_env(device=policy.device if policy is not None else sec.engine.device)
        self.distributed, self.main = distributed, distributed.is_main
        self.progress = progress and self.main
        self.frozen = check_frozen(sec.plan, list(self.role_map))
        self.trained = [r for r in self.role_map if r not in self.frozen]
        self.engine, self.policy = policy_and_engine(engine, policy, model, sec.engine)
        check_role_keys("role_learning_rates", sec.guards.role_learning_rates, self.trained)
        check_role_keys("role_max_grad_norm", sec.guards.role_max_grad_norm, self.trained)
        check_role_keys("counterfactual_roles", {r: 1 for r in sec.credit.counterfactual_roles if r != "*"},
                        self.trained)

    def plan_backend(self, backend: Any) -> None:
        """Seed torch, then the role -> adapter plan: a resumed ``auto`` run's own traced choice, a fresh trace, or
        the named backend. ``role_adapters`` (trained roles only) is what rollouts route by (a role it does not
        name, a frozen one, runs on the base model: ``wfc.lower.bind``) and what the update trains."""
        cfg, resumed, seed = self.cfg, self.resumed, self.sections.run.seed
        # LoRA init and unseeded sampling (counterfactual reruns) draw from torch's generator
        torch.manual_seed(seed)
        if resumed is not None and isinstance(backend, str) and backend == "auto":
            plan = BackendPlan(resumed.plan["spec"], dict(resumed.plan["role_adapters"]), list(resumed.plan["reasons"]))
        elif isinstance(backend, str) and backend == "auto":
            plan = self.distributed.broadcast(auto_plan(self.student, self.trainset, self.engine, config=cfg,
                                                        seed=seed)
                                              if self.main else None)  # traced once: every rank trains the same plan
            plan = without_frozen(plan, self.frozen)
            if self.progress:
                print(plan.describe())
        else:
            plan = resolve_backend(backend, self.trained)
        if resumed is None:  # another compile's adapters on this engine stay as they are (a resume keeps its names)
            plan = fresh_names(plan, self.policy.adapters)
        self.plan, self.role_adapters = plan, plan.role_adapters

    def check_same_run(self) -> None:
        """The run's fingerprint: a resumed checkpoint's must match it (``steps`` may grow), and every rank's."""
        cfg, resumed = self.cfg, self.resumed
        self.fingerprint = ckpt.fingerprint(cfg, base_model=self.policy.handle.name,
                                            base_checksum=self.policy.handle.checksum,
                                            role_adapters=self.role_adapters, trainset=self.trainset,
                                            valset=self.valset, metric=self.metric, program=self.program)
        if resumed is not None:
            ckpt.check_fingerprint(resumed.data["fingerprint"], self.fingerprint, where=resumed.path)
            if self.sections.run.steps < resumed.step:
                raise ValueError(f"steps={self.sections.run.steps} but the checkpoint in {self.run_dir} is after step "
                                 f"{resumed.step}: resume with steps >= {resumed.step}")
        if self.distributed.world > 1:
            check_same_compile(self.distributed, self.fingerprint)

    def build_trainer(self) -> None:
        """Learning rates, credit, the prompt sampler, the adapters (LoRA init draws from torch's generator) and
        their optimizers; the new adapters are handed to the engine."""
        sec, plan = self.sections, self.plan
        sampling = sec.sampling
        self.rates = adapter_learning_rates(self.role_adapters, sec.update.learning_rate,
                                            sec.guards.role_learning_rates)
        # balancing applies: an adapter trained by several roles
        self.multi_role = any(list(self.role_adapters.values()).count(a) > 1 for a in plan.adapters)
        key = sampling.curriculum_key
        if key is not None and not all(key in ex for ex in self.trainset):
            raise ValueError(f"curriculum_key={key!r}: every training example needs that field "
                             "(a number, easier is smaller); or leave it None to treat trainset order as easiest first")
        self.sampler = PromptSampler(
            len(self.trainset), seed=sec.run.seed, band=sampling.pass_band, replay_after=sampling.replay_after,
            difficulty=[float(ex[key]) for ex in self.trainset] if key else None,
            curriculum_steps=sampling.curriculum_steps, curriculum_start=sampling.curriculum_start)
        for adapter in plan.adapters:
            self.policy.add_adapter(adapter, sec.plan.lora.peft_config())
            if self.distributed.world > 1:  # seeded alike already; rank 0's initial weights make sure of it
                self.distributed.broadcast_(adapter_parameters(self.policy.model, adapter))
        self.optimizers = AdapterOptimizers(self.policy, plan.adapters, lr=self.rates)
        self.hand_off()

    def open_log(self) -> None:
        """``metrics.jsonl`` (written by the main rank only) and, for a fresh run, its ``plan`` record."""
        run_dir = self.run_dir
        if self.main and self.resumed is None and ckpt.find(run_dir) is not None:
            warnings.warn(f"{run_dir} holds the checkpoint of an earlier compile: this one starts over and replaces "
                          f"it (its metrics.jsonl moves to metrics.previous.jsonl); pass resume={str(run_dir)!r} "
                          f"(CLI --resume) to continue that one instead",
                          stacklevel=3)  # the caller of MMGRPO.compile
        self.log = RunLog(run_dir, write=self.main, fresh=self.resumed is None)
        if self.resumed is None:
            self.log.append({"kind": "plan", "backend": self.plan.spec, "roles": self.role_adapters,
                             "reasons": self.plan.reasons, "learning_rates": self.rates, "frozen_roles": self.frozen,
                             "skip_frozen": self.sections.sampling.skip_frozen})

    def sft_rates(self) -> dict[str, float]:
        """Adapter -> the learning rate of a supervised fine-tune before GRPO (the warm start, internalized demos):
        ``warm_start_lr``, else the adapter's GRPO rate."""
        return {a: self.sections.warm_start.warm_start_lr or r for a, r in self.rates.items()}

    def student_demos(self) -> None:
        """``student_demos`` (``compilers.student_demos``): keep the student's own demos, drop them, or fine-tune each
        trained role on its demos and then drop them. A fresh run logs a ``student_demos`` record (also in the
        manifest's history): ``rule``, ``demos`` (role -> held), ``incomplete``, ``trained``, ``optimizer_steps``,
        ``learning_rates``, ``loss_before`` / ``loss_after`` (as the warm start's), ``seconds``. On a resume the demos
        are dropped again (the checkpoint's program state holds none) and nothing is trained: the adapters are
        restored."""
        rule = STUDENT_DEMOS[self.sections.prompts.student_demos]
        held = demo_counts(self.student)
        if not rule.drop or not held:
            return
        t0 = time.time()
        calls = demo_calls(self.student, self.trained, call_adapter()) if rule.train else DemoCalls()
        drop_demos(self.student)
        if self.resumed is not None:
            return
        record = {"kind": "student_demos", "rule": rule.name, "demos": held, "incomplete": calls.incomplete,
                  "trained": {role: len(c) for role, c in calls.chats.items()}, "optimizer_steps": 0,
                  "learning_rates": None, "loss_before": None, "loss_after": None}
        if calls.chats:
            sec = self.sections
            rates = self.sft_rates()
            record["learning_rates"] = rates
            record.update(fine_tune(self.policy, demo_rows(self.engine, calls, self.role_adapters),
                                    config=sec.warm_start, update=sec.update, guards=sec.guards,
                                    temperature=sec.sampling.temperature, seed=sec.run.seed, rates=rates,
                                    distributed=self.distributed))
            self.hand_off()
        record["seconds"] = round(time.time() - t0, 2)
        self.log.append(record)
        self.state.loop.history.append(record)
        if self.progress:
            trained = f", fine-tuned on {record['trained']}" if calls.chats else ""
            print(f"student demos {rule.name}: dropped {held}{trained} ({record['seconds']:.0f}s)")

    def bootstrap(self) -> None:
        """A strategy with demos (``p``, ``p -> w``): bootstrapped demos per role (on rank 0, broadcast); one
        without weights (``p``) trains no step. A resumed run's demos are in the program state the checkpoint
        restores."""
        sec, st = self.sections, self.state
        strategy, prompts = sec.run.optimizes, sec.prompts
        if self.resumed is not None:
            st.steps = st.steps if strategy.weights else 0
            return
        if not strategy.demos:
            return
        t0 = time.time()
        boot: dict[str, Any] = {}
        demos = None
        if self.main:  # bootstrapped once: every rank trains with the same demos
            demos = bootstrap_demos(self.student, self.trainset, self.engine, metric=self.metric,
                                    k=prompts.demos_per_role, adapters=self.role_adapters,
                                    n_examples=prompts.bootstrap_examples, repeats=prompts.bootstrap_repeats,
                                    temperature=sec.sampling.temperature, max_tokens=sec.sampling.max_tokens,
                                    seed=sec.run.seed, metric_failure_score=sec.credit.metric_failure_score,
                                    labeled=prompts.labeled_demos, stats=boot)
        demos, boot = self.distributed.broadcast((demos, boot))
        counts = apply_demos(self.student, demos)
        st.loop.spent += boot["completion_tokens"]
        record = {"kind": "demos", "strategy": strategy.name, "counts": counts, **boot,
                  "seconds": round(time.time() - t0, 2)}
        self.log.append(record)
        self.state.loop.history.append(record)  # the manifest's history says how the demos were found
        if self.progress:
            print(f"bootstrapped demos per role: {counts} ({time.time() - t0:.0f}s)")
        if not strategy.weights:
            st.steps = 0

    def retrieve_demos(self) -> None:
        """``retrieved_demos``: each labeled role's pool of gold demonstrations, installed in the program; rebuilt on
        a resume too (the pools are a pure function of the trainset and the metric: no tokens)."""
        prompts = self.sections.prompts
        if not prompts.retrieved_demos:
            return
        t0 = time.time()
        pools = retrieval_pools(self.student, self.trainset, metric=self.metric, k=prompts.retrieved_demos,
                                labels=prompts.demo_labels,
                                metric_failure_score=self.sections.credit.metric_failure_score)
        install_retrievers(self.student, pools)
        if self.resumed is None:
            self.log.append({"kind": "retrieval", "k": prompts.retrieved_demos,
                             "pools": {role: len(r.pool) for role, r in pools.items()},
                             "seconds": round(time.time() - t0, 2)})
        if self.progress:
            print(f"retrieved demos: {prompts.retrieved_demos} per run from pools "
                  f"{ {role: len(r.pool) for role, r in pools.items()} } ({time.time() - t0:.0f}s)")

    def warm_start(self) -> None:
        """``warm_start_runs``: fine-tune every trained role's adapter on the program's own successes before GRPO
        (``compilers.warm_start``: what a success is, the loss). Rank 0 samples ``warm_start_runs`` runs of every
        training example (seeded (seed, "warm_start", index): no global generator) and keeps the successes; every
        rank trains on them (``warm_start_lr``, default each adapter's GRPO rate). GRPO's optimizers are untouched;
        the probe (``pass_rate_probe``) after it measures the warmed program, which GRPO starts from.

        A ``warm_start`` record (also in the manifest's history): ``runs_per_example``, ``runs``, ``passing_runs``,
        ``examples_passed``, ``successes`` (role -> calls kept), ``duplicates``, ``capped`` and ``unconcluded`` (left
        out), ``completion_tokens`` (counted in ``max_rollout_tokens``), ``trained``, ``optimizer_steps``,
        ``learning_rates``, ``loss_before`` / ``loss_after`` (token-mean NLL of the successes, ``"all"`` and per
        role; None when not trained), ``skipped`` (why not, or None), ``seconds``. No success: nothing is trained,
        ``skipped`` says so and a warning repeats it. The step-0 validation after it is what the warm start alone
        reaches. Skipped on a resume: the checkpoint after it holds the warmed adapters."""
        warm = self.sections.warm_start
        if not warm.warm_start_runs or self.resumed is not None:
            return
        t0 = time.time()
        harvest, counts = self.distributed.broadcast(self.sample_successes() if self.main else None)
        self.train_on_successes(harvest, counts, warm.warm_start_runs, t0)

    def train_on_successes(self, harvest: Harvest, counts: dict[str, int], runs_per_example: int, t0: float) -> None:
        """The warm start's fine-tune on ``harvest`` (from ``counts`` runs, ``runs_per_example`` per example) and its
        ``warm_start`` record (:meth:`warm_start`); ``t0`` is when its sampling began."""
        sec = self.sections
        warm = sec.warm_start
        self.state.loop.spent += counts["completion_tokens"]
        rates = self.sft_rates()
        record = {"kind": "warm_start", "runs_per_example": runs_per_example, **counts,
                  "successes": role_counts(harvest.kept, self.trained), "duplicates": harvest.duplicates,
                  "capped": harvest.capped, "unconcluded": harvest.unconcluded, "trained": bool(harvest.kept),
                  "optimizer_steps": 0, "learning_rates": rates, "loss_before": None, "loss_after": None,
                  "skipped": None}
        if harvest.kept:
            record.update(fine_tune(self.policy, sft_rows(harvest.kept, self.role_adapters), config=warm,
                                    update=sec.update, guards=sec.guards, temperature=sec.sampling.temperature,
                                    seed=sec.run.seed, rates=rates, distributed=self.distributed))
            self.hand_off()
        else:
            found = (f"no passing run among {counts['runs']} sampled runs" if not counts["passing_runs"] else
                     f"{counts['passing_runs']} of {counts['runs']} sampled runs passed without a call of a trained "
                     "role")
            record["skipped"] = (f"warm start: {found} ({runs_per_example} per training example): 0 successes, "
                                 "nothing to fine-tune on; GRPO starts from the untrained adapters")
            if self.main:
                warnings.warn(record["skipped"], stacklevel=3)
        record["seconds"] = round(time.time() - t0, 2)
        self.log.append(record)
        self.state.loop.history.append(record)
        if self.progress and harvest.kept:
            print(f"warm start: {counts['passing_runs']} of {counts['runs']} runs passed, successes per role "
                  f"{record['successes']}, SFT loss {record['loss_before']['all']:.3f} -> "
                  f"{record['loss_after']['all']:.3f} ({record['seconds']:.0f}s)")

    def sample_successes(self) -> tuple[Harvest, dict[str, int]]:
        """The warm start's sampled, scored runs -> its successes and the runs' counts (``run_counts``)."""
        sec = self.sections
        rollouts = run_rollouts(self.student, self.trainset, self.engine, repeats=sec.warm_start.warm_start_runs,
                                seeds=[derive_seed(sec.run.seed, "warm_start", i) for i in range(len(self.trainset))],
                                **self.rollout_options())
        for graphs in rollouts:
            for g in graphs:
                self.score(g)
        harvest = successes(rollouts, self.trained, max_per_example=sec.warm_start.warm_start_max_per_example)
        return harvest, run_counts(rollouts)

    # ----- start: the step-0 baseline, or a resume ------------------------------------------------------------------
    def baseline(self) -> None:
        """A fresh run: the pass-rate probe (``pass_rate_probe``), validate the adapters before any GRPO step (step 0:
        untrained, or as the warm start left them) and checkpoint."""
        self.probe()
        loop = self.state.loop
        loop.val = self.validate(0)
        loop.best_step, loop.best_val = 0, loop.val
        self.checkpoint(0)

    def probe(self) -> None:
        """``pass_rate_probe``: every training example's pass rate under the untrained program (rank 0 measures,
        every rank gets it), primed into the sampler (with a curriculum and no ``curriculum_key``, as its order
        too); a ``probe`` record (the rates per example in trainset order, their mean, the share of examples passed
        at least once); its tokens count in ``max_rollout_tokens``."""
        sampling = self.sections.sampling
        if not sampling.pass_rate_probe or self.state.steps == 0 or self.state.probed:  # "p": no step to steer
            return
        t0 = time.time()
        rates, tokens = self.distributed.broadcast(self.measure_pass_rates() if self.main else None)
        order = sampling.curriculum_steps > 0 and sampling.curriculum_key is None
        self.sampler.prime(rates, order=order)
        self.state.loop.spent += tokens
        record = {"kind": "probe", "runs_per_example": sampling.pass_rate_probe, "examples": len(rates),
                  "pass_rate": statistics.fmean(rates), "pass_at_k": sum(r > 0 for r in rates) / len(rates),
                  "completion_tokens": tokens, "orders_curriculum": order, "rates": rates,
                  "seconds": round(time.time() - t0, 2)}
        self.log.append(record)
        if self.progress:
            print(f"pass-rate probe: {sampling.pass_rate_probe} runs x {len(rates)} examples, pass rate "
                  f"{record['pass_rate']:.3f}, {sum(r > 0 for r in rates)} examples passed at least once "
                  f"({record['seconds']:.0f}s)")

    def measure_pass_rates(self) -> tuple[list[float], int]:
        """Per training example, the mean reward (clipped to [0, 1]) of ``pass_rate_probe`` sampled runs, seeded
        (seed, "probe", index); and the completion tokens they generated."""
        rollouts = self.probe_runs(self.sections.sampling.pass_rate_probe)
        return pass_rates(rollouts, self.score), sum(len(c.completion_ids) for graphs in rollouts for g in graphs
                                                     for c in g.calls)

    def probe_runs(self, repeats: int, indices: Sequence[int] | None = None) -> list[list[RolloutGraph]]:
        """``repeats`` sampled runs of each training example of ``indices`` (default: all) under the current
        adapters, seeded (seed, "probe", index), as in training (their rewards scored)."""
        seed = self.sections.run.seed
        indices = range(len(self.trainset)) if indices is None else indices
        return run_rollouts(self.student, [self.trainset[i] for i in indices], self.engine, repeats=repeats,
                            seeds=[derive_seed(seed, "probe", i) for i in indices], **self.rollout_options())

    def auto_remedies(self) -> None:
        """``auto_remedies`` (a fresh run; ``compilers.remedies``): probe the untrained program (``pass_rate_probe``
        runs, ``AUTO_PROBE_RUNS`` if unset, on each of ``AUTO_PROBE_EXAMPLES`` training examples), choose, prime the sampler with the rates, switch the chosen
        remedies on in this run's sections (the config stays as given: a resume re-applies the recorded choice), and
        warm-start on the probe's own successes when chosen. A ``remedies`` record (log and manifest history):
        ``chose`` (field -> value), ``kept`` (remedies you set yourself, left as they are), ``starved``, ``reasons``,
        the probe's ``stats``, its ``completion_tokens`` and ``seconds``. The later ``probe`` stage does not measure
        again."""
        sampling = self.sections.sampling
        if not sampling.auto_remedies or self.resumed is not None or self.state.steps == 0:
            return
        t0 = time.time()
        repeats = sampling.pass_rate_probe or AUTO_PROBE_RUNS
        indices = probe_subset(len(self.trainset), AUTO_PROBE_EXAMPLES, seed=derive_seed(self.sections.run.seed,
                                                                                          "probe_subset"))
        rates, harvest, counts = self.distributed.broadcast(self.probe_and_harvest(repeats, indices) if self.main
                                                            else None)
        choice = choose(list(rates.values()), group_size=sampling.group_size, passing_runs=counts["passing_runs"],
                        runs_per_example=repeats)
        if len(rates) == len(self.trainset):  # every example measured: the rates may order the curriculum too
            self.sampler.prime(list(rates.values()),
                               order=sampling.curriculum_steps > 0 and sampling.curriculum_key is None)
        else:
            self.sampler.prime(rates, order=False)
        user_warm = self.sections.warm_start.warm_start_runs > 0
        chose = {"adaptive_rollouts": choice.adaptive_rollouts or sampling.adaptive_rollouts,
                 "warm_start": choice.warm_start and not user_warm}
        record = {"kind": "remedies", "chose": chose, "starved": choice.starved, "reasons": list(choice.reasons),
                  "kept": [k for k, on in (("adaptive_rollouts", sampling.adaptive_rollouts),
                                           ("warm_start_runs", user_warm)) if on],
                  "stats": choice.stats, "completion_tokens": counts["completion_tokens"],
                  "seconds": round(time.time() - t0, 2)}
        self.apply_remedies(record)
        self.log.append(record)
        self.state.loop.history.append(record)
        if self.progress:
            print(f"auto remedies: probe pass rate {choice.stats['pass_rate']:.3f}, "
                  + "; ".join(choice.reasons) + f" ({record['seconds']:.0f}s)")
        self.state.loop.spent += counts["completion_tokens"]
        if chose["warm_start"]:  # the probe's runs are its runs: their tokens are counted once, above
            self.train_on_successes(harvest, {**counts, "completion_tokens": 0}, repeats, time.time())

    def probe_and_harvest(self, repeats: int, indices: Sequence[int]) -> tuple[dict[int, float], Harvest,
                                                                                 dict[str, int]]:
        """The probe's runs of the examples ``indices`` -> their pass rates (index -> rate, in order), the warm
        start's successes among the runs, the runs' counts."""
        rollouts = self.probe_runs(repeats, indices)
        rates = dict(zip(indices, pass_rates(rollouts, self.score)))
        harvest = successes(rollouts, self.trained,
                            max_per_example=self.sections.warm_start.warm_start_max_per_example)
        return rates, harvest, run_counts(rollouts)

    def apply_remedies(self, record: dict[str, Any]) -> None:
        """Switch on, for this run, the sampling remedies a ``remedies`` record chose (its warm start is a stage
        of its own, done once)."""
        update = {"adaptive_rollouts": record["chose"]["adaptive_rollouts"]}
        sampling = self.sections.sampling  # validated again: adaptive groups have rules of their own
        self.sections = replace(self.sections, sampling=type(sampling).model_validate({**sampling.model_dump(),
                                                                                       **update}))
        self.remedies = remedies_in_force(self.cfg.model_copy(update=update))
        self.state.probed = True

    def resume(self) -> None:
        """A resumed run: cut the log back, restore the checkpointed state (RNGs last: nothing draws before the next
        step), re-apply what ``auto_remedies`` chose, and log where it continues."""
        resumed, st, log = self.resumed, self.state, self.log
        if self.main:  # cuts metrics.jsonl back; the other ranks read it after
            log.records = ckpt.restore_log(resumed)
            ckpt.drop_later_revisions(self.run_dir, resumed.step)
        self.distributed.barrier()
        if not self.main:
            log.records = ckpt.restore_log(resumed)
        st.revision_files = resumed.revision_files()
        st.loop = ckpt.restore(resumed, policy=self.policy, engine=self.engine, adapters=self.plan.adapters,
                               optimizers=self.optimizers, sampler=self.sampler, student=self.student)
        st.handed.update({a: self.policy.revision(a) for a in self.plan.adapters})  # restore handed them over
        chosen = [r for r in st.loop.history if r.get("kind") == "remedies"]
        if chosen:  # auto_remedies chose before step 1: the same remedies go on (the sampler's rates are restored)
            self.apply_remedies(chosen[-1])
        log.append({"kind": "resume", "after_step": st.loop.step, "checkpoint": str(resumed.path)})
        if self.progress:
            print(f"resumed {self.run_dir} after step {st.loop.step}")

    # ----- the loop -------------------------------------------------------------------------------------------------
    def train(self) -> None:
        """The steps after the last finished one, until ``steps`` or the token budget."""
        st = self.state
        bar = tqdm(range(st.loop.step + 1, st.steps + 1), desc="mmGRPO", disable=not self.progress,
                   initial=st.loop.step, total=st.steps)
        starved_before = False
        for step in bar:
            if self.budget_spent(step):
                break
            s = Step(step)
            t0 = time.time()
            self.collect(s)  # roll out, score, credit; dynamic sampling
            s.seconds["rollout"] = time.time() - t0
            self.group(s)  # groups and their advantages
            s.update_started = time.time()
            self.schedule_lr(s)
            self.update(s)
            t0 = time.time()
            self.hand_off()  # adapter-only hand-off of what the step changed (a no-op where rollouts share the model)
            s.seconds["handoff"] = time.time() - t0
            st.loop.current = step
            record = self.step_record(s)
            self.after_step(s, record)
            bar.set_postfix(reward=f"{record['reward_mean']:.2f}",
                            val=f"{st.loop.val:.2f}" if st.loop.val is not None else "-",
                            fmt=f"{record['format_error_rate']:.2f}", crash=record["crashes"],
                            **starvation_postfix(s.starvation))
            if self.progress and s.starvation["starved"] and not starved_before:  # once per starved stretch
                bar.write(starvation_note(step, s.starvation))
            starved_before = s.starvation["starved"]

    def budget_spent(self, step: int) -> bool:
        """``max_rollout_tokens`` spent before ``step``: the previous step is the last (validated here if it was
        not)."""
        budget, st = self.sections.sampling.max_rollout_tokens, self.state
        if budget is None or st.loop.spent < budget:
            return False
        st.steps = step - 1
        if st.steps not in st.loop.revisions:
            loop = st.loop
            loop.val = self.validate(st.steps)
            if loop.val is not None and (loop.best_val is None or loop.val > loop.best_val):
                loop.best_step, loop.best_val = st.steps, loop.val
        return True

    def rollout_options(self) -> dict[str, Any]:
        """``run_rollouts``' options of every sampled run of training (steps, probe, warm start)."""
        sampling = self.sections.sampling
        return dict(adapters=self.role_adapters, sampling=self.sampling_params, max_workers=sampling.rollout_workers,
                    stop_roles=self.frozen if sampling.skip_frozen else ())

    def score(self, graph: RolloutGraph) -> float:
        """Score a sampled run with the metric (its failure scores from the credit section); its reward."""
        credit = self.sections.credit
        return score_rollout(self.metric, graph, failure_score=credit.failure_score,
                             metric_failure_score=credit.metric_failure_score)

    def roll_out(self, indices: list[int], step: int, *,
                 sizes: list[int] | None = None) -> tuple[list[list[RolloutGraph]], dict[str, int]]:
        """The scored, credited rollouts of ``indices`` (``group_size`` each, or ``sizes[k]`` for ``indices[k]``;
        this rank's shard run here, the rest gathered) and what counterfactual credit's reruns cost."""
        credit, distributed, metric = self.sections.credit, self.distributed, self.metric
        mine = distributed.shard(list(zip(indices, sizes or [self.sections.sampling.group_size] * len(indices))))
        examples = [self.trainset[i] for i, _ in mine]
        rollouts = self.run_groups(mine, step, adaptive=sizes is not None) if examples else []
        cost = {"runs": 0, "completion_tokens": 0}
        rule = credit.rule
        for graphs in rollouts:
            for g in graphs:
                self.score(g)
                rule(metric, g, metric_failure_score=credit.metric_failure_score)
        if credit.counterfactual_roles and examples:
            cost = counterfactual_credit(self.student, examples, rollouts, self.engine, metric=metric,
                                         # "*": every trained role (a frozen role's credit trains nothing)
                                         roles=self.trained if "*" in credit.counterfactual_roles
                                         else credit.counterfactual_roles, adapters=self.role_adapters,
                                         sampling=self.sampling_params, failure_score=credit.failure_score,
                                         metric_failure_score=credit.metric_failure_score)
        if distributed.world > 1:  # every rank: the whole draw, in the order of indices
            parts = distributed.gather([(rollouts, cost)])
            rollouts = [graphs for part, _ in parts for graphs in part]
            cost = {k: sum(c[k] for _, c in parts) for k in cost}
        return rollouts, cost

    def run_groups(self, mine: list[tuple[int, int]], step: int, *, adaptive: bool) -> list[list[RolloutGraph]]:
        """The unscored rollouts of ``(example index, group size)`` pairs, every one in flight together. An
        example's rollouts at a step sample with seeds of their own, so the draw repeats whatever the thread timing
        and whichever rank runs it: fixed groups trace rollout r of example i with ``derive_seed(derive_seed(seed,
        "rollout", step, i), r)`` (``run_rollouts``' rule); adaptive ones from ``derive_seed(seed, "rollout", step,
        i, r)``, so an example's first n rollouts are the same whatever its group size."""
        seed, common = self.sections.run.seed, self.rollout_options()
        if not adaptive:
            return run_rollouts(self.student, [self.trainset[i] for i, _ in mine], self.engine,
                                repeats=self.sections.sampling.group_size,
                                seeds=[derive_seed(seed, "rollout", step, i) for i, _ in mine], **common)
        jobs = [(k, i, r) for k, (i, n) in enumerate(mine) for r in range(n)]
        single = run_rollouts(self.student, [self.trainset[i] for _, i, _ in jobs], self.engine, repeats=1,
                              seeds=[derive_seed(seed, "rollout", step, i, r) for _, i, r in jobs], **common)
        out: list[list[RolloutGraph]] = [[] for _ in mine]
        for (k, _, _), graphs in zip(jobs, single):
            out[k].extend(graphs)
        return out

    def group_sizes(self, indices: list[int]) -> list[int] | None:
        """``adaptive_rollouts``: each drawn example's group size from its running pass rate, within
        ``adaptive_budget`` x ``group_size`` rollouts per drawn example; None: fixed groups of ``group_size``."""
        sampling = self.sections.sampling
        if not sampling.adaptive_rollouts:
            return None
        budget = math.floor(sampling.adaptive_budget * sampling.group_size * len(indices) + 1e-9)
        return adaptive_group_sizes([self.sampler.rates.get(i) for i in indices], base=sampling.group_size,
                                    max_size=sampling.max_group_size, budget=budget, target=sampling.adaptive_target)

    def collect(self, s: Step) -> None:
        """The step's rollouts: ``examples_per_step`` examples, or (dynamic sampling) as many examples with signal,
        drawing replacements for flat ones for up to ``max_draw_rounds`` rounds; group sizes (``adaptive_rollouts``)
        from the running pass rates before each round; counts the tokens spent and the flat examples."""
        sampling, sampler = self.sections.sampling, self.sampler
        quota, kept, drawn, dropped, flat, rounds, rewards, tokens = sampling.examples_per_step, [], [], 0, 0, 0, [], 0
        sizes_drawn: list[int] = []
        cf_cost = {"runs": 0, "completion_tokens": 0}  # counterfactual credit's cost in this step
        while len(kept) < quota and rounds < (sampling.max_draw_rounds if sampling.dynamic_sampling else 1):
            rate = len(kept) / len(drawn) if drawn else 1.0  # oversample by the signal rate seen so far
            want = min(2 * quota, math.ceil((quota - len(kept)) / max(rate, 1 / 3)))
            indices = sampler.draw(want, exclude=drawn)
            if not indices:
                break
            drawn.extend(indices)
            sizes = self.group_sizes(indices)
            sizes_drawn.extend(sizes or [])
            rollouts, cost = self.roll_out(indices, s.step, sizes=sizes)
            for k in cf_cost:
                cf_cost[k] += cost[k]
            signal = signal_examples(trained_groups(self.build_groups(rollouts), self.role_adapters), len(indices))
            rewards.extend(g.reward for graphs in rollouts for g in graphs)
            tokens += sum(len(c.completion_ids) for graphs in rollouts for g in graphs for c in g.calls)
            for i, graphs, has in zip(indices, rollouts, signal):
                sampler.observe(i, statistics.fmean(min(max(g.reward, 0.0), 1.0) for g in graphs))
                flat += not has
                if has or not sampling.dynamic_sampling:
                    kept.append(graphs)
                else:
                    dropped += 1
            rounds += 1
        sampler.advance()
        tokens += cf_cost["completion_tokens"]  # the budget counts what counterfactual reruns generated
        self.state.loop.spent += tokens
        s.rollouts = kept
        summary = sampler.summary()
        s.drawing = {"reward_mean_drawn": statistics.fmean(rewards) if rewards else None,
                     "completion_tokens": tokens, "counterfactual": dict(cf_cost),
                     "examples_drawn": len(drawn), "examples_kept": len(kept), "examples_flat": dropped,
                     "indices": drawn,
                     "draw_rounds": rounds, "sampler": summary, "rollouts_drawn": len(rewards),
                     "group_sizes": sizes_drawn if sampling.adaptive_rollouts else None,
                     "completion_tokens_total": self.state.loop.spent}
        s.starvation = starvation(flat, len(drawn), pass_rate=summary.get("mean_pass_rate"),
                                  step_pass_rate=(statistics.fmean(min(max(r, 0.0), 1.0) for r in rewards)
                                                  if rewards else None), remedies=self.remedies)

    def build_groups(self, rollouts: list[list[RolloutGraph]]) -> list[Group]:
        credit = self.sections.credit
        return build_groups(rollouts, mode=credit.grouping, failure_score=credit.failure_score,
                            format_failure_score=credit.format_failure_score, pool_fanout=credit.pool_fanout,
                            overlong_penalty=credit.overlong_penalty)

    def group(self, s: Step) -> None:
        """Groups per (example, role, invocation) and their advantages (a frozen role's too: its step stats read
        them, the update does not), scaled per role under ``role_advantage_norm``."""
        credit = self.sections.credit
        estimator = credit.estimator
        s.all_groups = self.build_groups(s.rollouts)
        s.groups = trained_groups(s.all_groups, self.role_adapters)
        for g in s.all_groups:
            ga = group_advantages(g.rewards, estimator)
            g.advantages, g.no_signal = ga.advantages, ga.no_signal
            if g.role in self.role_adapters:
                s.scored.append(ga)  # the step's no-signal rate: of what trains
        s.scales = role_scales((g.role, g.advantages) for g in s.groups) if credit.role_advantage_norm else {}
        for g in s.groups:
            if s.scales.get(g.role, 1.0) != 1.0:
                g.advantages = [a * s.scales[g.role] for a in g.advantages]

    def schedule_lr(self, s: Step) -> None:
        """Every adapter's base rate times the schedule's multiplier for this step, and (``scale_partial_steps``)
        the share of a full step that the examples dynamic sampling kept make."""
        update = self.sections.update
        s.lr_mult = lr_multiplier(s.step, self.state.steps, schedule=update.lr_schedule, warmup=update.warmup_steps,
                                  min_ratio=update.min_lr_ratio)
        sampling = self.sections.sampling
        if sampling.dynamic_sampling and sampling.scale_partial_steps:
            s.partial_scale = partial_step_scale(len(s.rollouts), sampling.examples_per_step)
            s.lr_mult *= s.partial_scale
        self.optimizers.apply_schedule(s.lr_mult)

    def update(self, s: Step) -> None:
        """One optimizer step per adapter on the trained groups, with the fan-out weights and the entropy bonus of
        roles below the floor; per-role stats of the rollouts (read before the update) and of the update."""
        sec = self.sections
        guards = sec.guards
        s.weights = fanout_weights(s.groups) if guards.fanout_scaling else {}
        s.per_role = role_stats(s.graphs, s.all_groups)  # of the rollouts, so before the update
        # a role whose engine reported no log-probs (a scripted engine) has no measured entropy: no bonus
        bonus = entropy_bonus({r: x["entropy"] for r, x in s.per_role.items() if x["entropy_measured"]},
                              floor=guards.entropy_floor, coef=guards.entropy_coef)
        s.upd = self.update_adapters(self.policy, self.optimizers, s.groups, self.role_adapters, config=sec.update,
                                     guards=guards, temperature=sec.sampling.temperature, weights=s.weights,
                                     distributed=self.distributed, entropy_coefs=bonus)
        for role in s.per_role:
            s.per_role[role]["entropy_bonus"] = bonus.get(role, 0.0)
            if role in self.frozen:
                s.per_role[role]["frozen"] = True

    def hand_off(self, names: Sequence[str] | None = None) -> None:
        """Give the engine every adapter (of ``names``) whose revision it does not hold yet."""
        handed = self.state.handed
        changed = [a for a in (self.plan.adapters if names is None else names)
                   if handed.get(a) != self.policy.revision(a)]
        if changed:
            revs = self.policy.export(changed)
            self.engine.load_adapters(revs)
            handed.update({r.name: r.revision for r in revs})

    def step_record(self, s: Step) -> dict[str, Any]:
        """The step's ``metrics.jsonl`` record."""
        sec, graphs, drawing = self.sections, s.graphs, s.drawing
        guards = sec.guards
        add_guard_stats(s.per_role, s.groups, s.weights, s.upd, self.role_adapters, self.optimizers)
        # Batches a cohort's timeout let go since the last step: > 0 means this step's batches followed thread
        # timing (a member blocked outside the engine), so a seeded rerun may differ from here (wfc.engines.cohort).
        timeouts = getattr(self.engine, "batching_stats", {}).get("lockstep_timeouts", 0)
        timeouts, self.lockstep_timeouts_seen = timeouts - self.lockstep_timeouts_seen, timeouts
        return {
            "kind": "step", "step": s.step,
            # over every rollout drawn (dynamic sampling trains on a subset; this is how the policy does)
            "reward_mean": drawing["reward_mean_drawn"] if drawing["reward_mean_drawn"] is not None else 0.0,
            "rollouts": len(graphs),
            "drawing": drawing,
            "starvation": s.starvation,
            "role_advantage_scales": s.scales,
            "lr_multiplier": round(s.lr_mult, 6),
            "partial_scale": s.partial_scale,
            "learning_rates": {a: self.optimizers.lr(a) for a in self.plan.adapters},
            "crashes": sum(g.status == "crash" for g in graphs),
            "format_errors": sum(c.status == "format_error" for g in graphs for c in g.calls),
            "format_error_rate": (sum(c.status == "format_error" for g in graphs for c in g.calls)
                                  / max(sum(len(g.calls) for g in graphs), 1)),
            "no_signal_rate": no_signal_rate(s.scored) if s.scored else 1.0,
            "logprob_mismatch": merge_mismatch([u.get("logprob_mismatch", {}) for u in s.upd.values()]),
            "importance_correction": sec.update.importance_correction,
            "groups": len(s.groups),
            "lockstep_timeouts": timeouts,
            "adapters": s.upd,
            "roles": s.per_role,
            "guards": {"fanout_scaling": guards.fanout_scaling,
                       "role_balance": guards.role_balance and self.multi_role,
                       "role_share_cap": guards.role_share_cap, "role_clip": guards.role_clip,
                       "cliff_guard": guards.cliff_guard and bool(self.valset),
                       "entropy_floor": guards.entropy_floor},
            "seconds_rollout": round(s.seconds["rollout"], 2),
            "seconds_update": round(time.time() - s.update_started - s.seconds["handoff"], 2),
            "seconds_handoff": round(s.seconds["handoff"], 3),
        }

    def after_step(self, s: Step, record: dict[str, Any]) -> None:
        """Log the step; validate when due, keep the best evaluated revision, guard against a cliff; checkpoint."""
        every, loop, step = self.sections.evaluation.eval_every, self.state.loop, s.step
        self.log.append(record)
        loop.history.append({k: v for k, v in record.items() if k != "adapters"})
        evaluated = (every and step % every == 0) or step == self.state.steps
        if evaluated:
            loop.val = self.validate(step)
        val = loop.val
        if val is not None and (loop.best_val is None or val > loop.best_val) and step in loop.revisions:
            loop.best_step, loop.best_val = step, val
        if evaluated and val is not None and self.sections.guards.cliff_guard:
            self.guard_cliff(step)
        self.checkpoint(step)

    # ----- validation, guard, checkpoint ----------------------------------------------------------------------------
    def validate(self, step: int) -> float | None:
        """Keep the adapters' revision at ``step``; with a valset, its greedy accuracy (logged)."""
        credit, loop, adapters = self.sections.credit, self.state.loop, self.plan.adapters
        if not self.valset:
            loop.revisions[step] = {a: self.policy.adapter_state(a) for a in adapters}
            return None
        t0 = time.time()
        res = self.evaluate(self.student, self.valset, self.engine, metric=self.metric, adapters=self.role_adapters,
                            max_tokens=self.eval_tokens, failure_score=credit.failure_score,
                            progress=self.progress and "validate",
                            metric_failure_score=credit.validation_failure_score, distributed=self.distributed)
        loop.revisions[step] = {a: self.policy.adapter_state(a) for a in adapters}
        if self.sections.sampling.skip_frozen and step == 0:
            check_skippable(res["graphs"], self.frozen, roles(self.student))
        record = {"kind": "eval", "step": step, "val_accuracy": res["accuracy"], "n": res["n"],
                  "interval": [round(x, 4) for x in res["interval"]],
                  "format_error_rate": res["format_error_rate"], "crash_rate": res["crash_rate"],
                  "seconds": round(time.time() - t0, 2)}
        self.log.append(record)
        loop.history.append(record)
        loop.evals.append((step, res["accuracy"]))
        return res["accuracy"]

    def guard_cliff(self, step: int) -> None:
        """A cliff (``cliff_patience`` evaluations more than ``cliff_drop`` below the best): every adapter that moved
        since the best revision goes back to it, its learning rate cut by ``cliff_lr_factor``; an event."""
        guards, loop, optimizers = self.sections.guards, self.state.loop, self.optimizers
        cliff = detect_cliff(loop.evals, drop=guards.cliff_drop, patience=guards.cliff_patience,
                             after_step=loop.last_rollback)
        if cliff is None:
            return
        best = loop.revisions[cliff.best_step]
        moved = [a for a in self.plan.adapters
                 if any(not torch.equal(v, best[a][k]) for k, v in loop.revisions[step][a].items())]
        for adapter in moved:
            self.policy.restore_adapter(adapter, best[adapter])
            optimizers.scale_lr(adapter, guards.cliff_lr_factor)
        self.hand_off(moved)
        event = {"kind": "cliff", "action": "rollback", "step": step, "from_step": step, "to_step": cliff.best_step,
                 "best_accuracy": cliff.best_accuracy, "fell_at": list(cliff.steps),
                 "accuracies": list(cliff.accuracies), "drop": guards.cliff_drop, "patience": guards.cliff_patience,
                 "adapters": moved, "lr_factor": guards.cliff_lr_factor,
                 "learning_rates": {a: optimizers.lr(a) for a in moved}}
        self.log.append({"kind": "event", **{k: v for k, v in event.items() if k != "kind"}, "event": event["kind"]})
        loop.events.append(event)
        loop.history.append({"kind": "event", "step": step, "event": event["kind"], "to_step": cliff.best_step})
        loop.last_rollback, loop.current = step, cliff.best_step

    def checkpoint(self, step: int) -> None:
        """The whole training state after ``step`` in ``run_dir/checkpoint/`` (one writer: every rank holds the
        same state)."""
        st = self.state
        st.loop.step = step
        if not self.main:
            return
        plan = self.plan
        ckpt.save(self.run_dir, loop=st.loop, policy=self.policy, adapters=plan.adapters, optimizers=self.optimizers,
                  sampler=self.sampler, student=self.student, fingerprint=self.fingerprint,
                  plan={"spec": plan.spec, "role_adapters": self.role_adapters, "reasons": plan.reasons},
                  revision_files=st.revision_files)

    # ----- export ---------------------------------------------------------------------------------------------------
    def export(self, program_import_path: str | None) -> CompiledProgram:
        """Put the kept revision back (the best evaluated one, or with ``keep='last'`` the one the adapters hold
        now: after a final rollback, the best one, not the step's own), plot the log, and package the artifact."""
        cfg, loop, policy = self.cfg, self.state.loop, self.policy
        best_step, best_val = loop.best_step, loop.best_val
        keep_step = best_step if (self.sections.evaluation.keep == "best" and best_val is not None) else loop.current
        for adapter, state in loop.revisions[keep_step].items():
            policy.restore_adapter(adapter, state)
        self.hand_off()
        self.log.plot()
        program = self.program
        manifest = Manifest(
            name=getattr(program, "name", "") or type(program).__name__,
            base_model=policy.handle.name,
            base_model_checksum=policy.handle.checksum,
            program_import_path=program_import_path,
            program_class=f"{type(program).__module__}:{type(program).__qualname__}",
            roles={r: self.role_adapters.get(r) for r in self.role_map},  # a frozen role: None, the base model
            backend=self.plan.spec,
            backend_reasons=self.plan.reasons,
            config={"metric": getattr(self.metric, "__name__", repr(self.metric)), **cfg.model_dump()},
            history=loop.history,
            best_step=best_step if best_val is not None else None,
            revision_step=keep_step,
            events=loop.events,
            sampling={"temperature": 0.0, "max_tokens": self.eval_tokens},
            package_versions=package_versions(),
        )
        return CompiledProgram(self.student, self.engine, manifest, policy=policy, revisions=loop.revisions,
                               run_dir=self.run_dir)
