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

Warm start (``warm_start_runs``; ``compilers.warm_start``): before the step-0 validation, sample runs of every
training example, keep the trained roles' calls of the passing ones, and fine-tune each role's adapter on them
(rejection-sampling fine-tuning); the step-0 validation then measures what the warm start alone reaches.

Log records (``metrics.jsonl``): ``plan`` (backend, role -> adapter, reasons), ``warm_start``, ``eval``, ``step``
(with per-role diagnostics under ``roles``, the guards in force under ``guards``, and the engine/trainer
``logprob_mismatch`` that ``importance_correction`` acts on), ``event``, ``resume`` (a resumed compile: the step it
continued after).

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

Config: :class:`~compilers.config.MMGRPOConfig` takes flat field names and is made of one section per stage
(``compilers.config.SECTIONS``: run, engine, plan, prompts, warm_start, sampling, credit, update, guards, evaluation);
each stage is given only its own.

Code: :meth:`MMGRPO.compile` is the list of the compile's stages, the methods of :class:`compilers.loop.CompileRun`
(setup, the step-0 baseline or the resume, the steps, the export); what they check before training is in
``compilers.prepare``, a step's per-role diagnostics in ``compilers.diagnostics``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import dspy
from dspy.teleprompt import Teleprompter

from compilers.config import MMGRPOConfig
from compilers.distributed import Distributed, SingleProcess
from compilers.loop import CompileRun
from compilers.score import mean_interval, score_rollout
from compilers.update import update
from wfc.artifact import CompiledProgram
from wfc.engines.base import SamplingParams
from wfc.lm import LocalLM, engine_of, set_role_lms
from wfc.lower import run_rollouts
from wfc.policy import Policy

# helpers of the compile that lived here before compilers.loop; tests import them from this module
from compilers.diagnostics import role_stats as _role_stats  # noqa: F401
from compilers.prepare import check_same_compile as _check_same_compile  # noqa: F401
from compilers.prepare import check_skippable as _check_skippable, policy_and_engine as _policy_and_engine  # noqa: F401


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


class MMGRPO(Teleprompter):
    """``MMGRPO(metric=..., steps=..., ...).compile(student, trainset=..., valset=..., model=..., backend=...)``.

    A DSPy ``Teleprompter``: it is one step of ``dspy.BetterTogether(metric, p=dspy.MIPROv2(...), w=MMGRPO(...))``
    in either order. The student's instructions (a prompt optimizer's) are kept, trained on and saved; its demos too,
    unless ``student_demos`` drops them (``'drop'``) or fine-tunes them into the adapters first (``'internalize'``);
    a student whose predictors hold :class:`wfc.lm.LocalLM` handles is trained on their engine."""

    def __init__(self, metric: Callable, *, config: MMGRPOConfig | None = None, **overrides):
        if not callable(metric):
            raise TypeError("metric must be callable: metric(example, prediction, trace=None) -> float | bool")
        self.metric = metric
        base = config.model_dump() if config is not None else {}
        self.config = MMGRPOConfig(**{**base, **overrides})

    def compile(self, student: dspy.Module, *, trainset: Sequence, valset: Sequence | None = None,
                teacher: dspy.Module | None = None,
                model: str = "smollm2-135m", backend: Any = "shared", engine=None, policy: Policy | None = None,
                run_dir: str | Path | None = None, program_import_path: str | None = None,
                progress: bool = True, resume: str | Path | bool | None = None,
                distributed: Distributed | None = None) -> CompiledProgram:
        """Train ``student``'s roles and return a :class:`CompiledProgram`. The input program is never mutated.
        ``teacher`` (DSPy's argument) is not used: GRPO learns from the student's own rollouts.

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
        program = student
        if engine is None and policy is None:
            engine = engine_of(program)  # a DSPy user's LocalLM handles: train on their engine, not a second model
        run = CompileRun(self.metric, self.config, program, trainset=trainset, valset=valset, run_dir=run_dir,
                         resume=resume, evaluate=evaluate, update=update)  # the inputs checked, a checkpoint verified
        run.place(engine, policy, model, distributed, progress)  # ranks, frozen roles, the policy and the engine
        run.plan_backend(backend)  # seeds torch; role -> adapter
        run.check_same_run()  # the fingerprint: against the checkpoint and across ranks
        run.build_trainer()  # sampler, adapters, optimizers
        run.open_log()
        run.student_demos()  # student_demos: keep, drop or internalize the demos the student came with
        run.bootstrap()  # strategy p / p -> w: demos
        run.retrieve_demos()  # retrieved_demos: pools
        run.auto_remedies()  # auto_remedies: probe the untrained program, choose and switch on remedies
        run.warm_start()  # warm_start_runs: fine-tune on the program's own successes (a fresh run only)
        if run.resumed is None:
            run.baseline()  # step-0 validation, first checkpoint
        else:
            run.resume()
        run.train()  # per step: collect, group, schedule_lr, update, hand_off, after_step (validate, guard, checkpoint)
        compiled = run.export(program_import_path)
        handles = [p.lm for _, p in student.named_predictors() if isinstance(getattr(p, "lm", None), LocalLM)]
        if handles and handles[0].wfc_engine is compiled.engine:  # DSPy sees each role's LM name its adapter
            set_role_lms(compiled.program, handles[0], compiled.roles)
        return compiled
