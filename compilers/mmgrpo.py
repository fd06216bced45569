"""mmGRPO: multi-module GRPO over a workflow program's roles, on LoRA adapters of one resident base model.

One step: sample ``examples_per_step`` examples -> ``group_size`` rollouts of the whole program on each, all in flight
together (the engine batches them) -> score every rollout with the metric -> group calls per (example, role path,
invocation) -> group-relative advantages -> one optimizer step per adapter -> the engine's next rollouts use the
updated adapters in place (no reload). Validation runs before training, every ``eval_every`` steps and at the end;
every evaluated revision is kept, and the artifact holds the best one (or the last, on request).

Backends map roles to adapters (``backends.resolve_backend``): ``shared`` (one adapter for all roles), ``isolated``
(one per role), or a dict partition.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import dspy
import torch

from compilers.advantages import group_advantages, no_signal_rate
from compilers.backends import resolve_backend
from compilers.config import MMGRPOConfig
from compilers.group import Group, build_groups
from compilers.runlog import RunLog
from compilers.score import score_rollout
from compilers.update import AdapterOptimizers, update
from wfc.artifact import CompiledProgram, Manifest, adapter_state, package_versions, restore_adapter
from wfc.engines.base import SamplingParams
from wfc.lower import copy_program, roles, run_rollouts
from wfc.rollout import RolloutGraph


def evaluate(program: dspy.Module, examples: Sequence, engine, *, metric: Callable, adapters: Mapping[str, Any],
             max_tokens: int, failure_score: float = 0.0, metric_failure_score: float | None = 0.0) -> dict[str, Any]:
    """Greedy accuracy (mean metric) of ``program`` on ``examples`` with the given role -> adapter map."""
    graphs = [g for gs in run_rollouts(program, list(examples), engine, adapters=adapters,
                                       sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens)) for g in gs]
    scores = [score_rollout(metric, g, failure_score=failure_score, metric_failure_score=metric_failure_score)
              for g in graphs]
    calls = [c for g in graphs for c in g.calls]
    return {
        "accuracy": sum(scores) / max(len(scores), 1),
        "n": len(scores),
        "format_error_rate": sum(c.status == "format_error" for c in calls) / max(len(calls), 1),
        "crash_rate": sum(g.status == "crash" for g in graphs) / max(len(graphs), 1),
        "graphs": graphs,
    }


def _role_stats(graphs: list[RolloutGraph], groups: list[Group]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    calls = [c for g in graphs for c in g.calls]
    total_tokens = sum(len(c.completion_ids) for c in calls) or 1
    for role in dict.fromkeys(c.role for c in calls):
        mine = [c for c in calls if c.role == role]
        role_groups = [g for g in groups if g.role == role]
        rewards = [r for g in role_groups for r in g.rewards]
        sampled = [lp for c in mine for lp in c.logprobs]
        out[role] = {
            "calls": len(mine),
            "tokens": sum(len(c.completion_ids) for c in mine),
            "token_share": sum(len(c.completion_ids) for c in mine) / total_tokens,
            "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
            "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
            "no_signal_rate": sum(bool(g.no_signal) for g in role_groups) / max(len(role_groups), 1),
            "format_error_rate": sum(c.status == "format_error" for c in mine) / max(len(mine), 1),
            # Monte-Carlo estimate of the sampling entropy: mean negative log-prob of the sampled tokens.
            "entropy": -statistics.fmean(sampled) if sampled else 0.0,
        }
    return out


class MMGRPO:
    """``MMGRPO(metric=..., steps=..., ...).compile(program, trainset=..., valset=..., model=..., backend=...)``."""

    def __init__(self, metric: Callable, *, config: MMGRPOConfig | None = None, **overrides):
        if not callable(metric):
            raise TypeError("metric must be callable: metric(example, prediction, trace=None) -> float | bool")
        self.metric = metric
        base = config.model_dump() if config is not None else {}
        self.config = MMGRPOConfig(**{**base, **overrides})

    def compile(self, program: dspy.Module, *, trainset: Sequence, valset: Sequence | None = None,
                model: str = "smollm2-135m", backend: Any = "shared", engine=None,
                run_dir: str | Path | None = None, program_import_path: str | None = None,
                progress: bool = True) -> CompiledProgram:
        """Train ``program``'s roles and return a :class:`CompiledProgram`. The input program is never mutated."""
        cfg = self.config
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
        if engine is None:
            from wfc.engines.hf import HFEngine

            engine = HFEngine(model)
        plan = resolve_backend(backend, list(role_map))
        role_adapters = plan.role_adapters
        torch.manual_seed(cfg.seed)  # HF sampling draws from torch's global generator; seed it for reproducibility
        rng = random.Random(cfg.seed)
        for adapter in plan.adapters:
            engine.add_adapter(adapter, cfg.lora.peft_config())
        optimizers = AdapterOptimizers(engine.model, plan.adapters, lr=cfg.learning_rate)
        run_dir = Path(run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
        log = RunLog(run_dir)
        revisions: dict[int, dict[str, dict]] = {}
        history: list[dict[str, Any]] = []
        eval_tokens = cfg.eval_max_tokens or cfg.max_tokens
        sampling = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens)

        def validate(step: int) -> float | None:
            if not valset:
                revisions[step] = {a: adapter_state(engine.model, a) for a in plan.adapters}
                return None
            t0 = time.time()
            res = evaluate(student, valset, engine, metric=self.metric, adapters=role_adapters,
                           max_tokens=eval_tokens, failure_score=cfg.failure_score,
                           metric_failure_score=cfg.metric_failure_score if cfg.metric_failure_score is not None
                           else cfg.failure_score)
            revisions[step] = {a: adapter_state(engine.model, a) for a in plan.adapters}
            record = {"kind": "eval", "step": step, "val_accuracy": res["accuracy"], "n": res["n"],
                      "format_error_rate": res["format_error_rate"], "crash_rate": res["crash_rate"],
                      "seconds": round(time.time() - t0, 2)}
            log.append(record)
            history.append(record)
            return res["accuracy"]

        from tqdm.auto import tqdm

        val = validate(0)
        best_step, best_val = 0, val
        bar = tqdm(range(1, cfg.steps + 1), desc="mmGRPO", disable=not progress)
        for step in bar:
            t0 = time.time()
            batch = rng.sample(trainset, min(cfg.examples_per_step, len(trainset)))
            rollouts = run_rollouts(student, batch, engine, repeats=cfg.group_size, adapters=role_adapters,
                                    sampling=sampling)
            for graphs in rollouts:
                for g in graphs:
                    score_rollout(self.metric, g, failure_score=cfg.failure_score,
                                  metric_failure_score=cfg.metric_failure_score)
            t_roll = time.time() - t0
            groups = build_groups(rollouts, mode=cfg.grouping, failure_score=cfg.failure_score,
                                  format_failure_score=cfg.format_failure_score)
            scored = []
            for g in groups:
                ga = group_advantages(g.rewards, cfg.advantage)
                g.advantages, g.no_signal = ga.advantages, ga.no_signal
                scored.append(ga)
            t1 = time.time()
            upd = update(engine, optimizers, groups, role_adapters, config=cfg)
            graphs = [g for gs in rollouts for g in gs]
            rewards = [g.reward for g in graphs]
            per_role = _role_stats(graphs, groups)
            for role, adapter in role_adapters.items():
                if role in per_role and adapter in upd:
                    per_role[role]["grad_norm"] = upd[adapter]["grad_norm"]
            record = {
                "kind": "step", "step": step,
                "reward_mean": statistics.fmean(rewards),
                "rollouts": len(graphs),
                "crashes": sum(g.status == "crash" for g in graphs),
                "format_errors": sum(c.status == "format_error" for g in graphs for c in g.calls),
                "format_error_rate": (sum(c.status == "format_error" for g in graphs for c in g.calls)
                                      / max(sum(len(g.calls) for g in graphs), 1)),
                "no_signal_rate": no_signal_rate(scored) if scored else 1.0,
                "groups": len(groups),
                "adapters": upd,
                "roles": per_role,
                "seconds_rollout": round(t_roll, 2),
                "seconds_update": round(time.time() - t1, 2),
            }
            log.append(record)
            history.append({k: v for k, v in record.items() if k != "adapters"})
            if cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.steps:
                val = validate(step)
            elif step == cfg.steps:
                val = validate(step)
            if val is not None and (best_val is None or val > best_val) and step in revisions:
                best_step, best_val = step, val
            bar.set_postfix(reward=f"{record['reward_mean']:.2f}", val=f"{val:.2f}" if val is not None else "-",
                            fmt=f"{record['format_error_rate']:.2f}", crash=record["crashes"])
        last_step = max(revisions)
        keep_step = best_step if (cfg.keep == "best" and best_val is not None) else last_step
        for adapter, state in revisions[keep_step].items():
            restore_adapter(engine.model, adapter, state)
        log.plot()
        manifest = Manifest(
            name=getattr(program, "name", "") or type(program).__name__,
            base_model=engine.handle.name,
            base_model_checksum=engine.handle.checksum,
            program_import_path=program_import_path,
            program_class=f"{type(program).__module__}:{type(program).__qualname__}",
            roles=role_adapters,
            backend=plan.spec,
            backend_reasons=plan.reasons,
            config={"metric": getattr(self.metric, "__name__", repr(self.metric)), **cfg.model_dump()},
            history=history,
            best_step=best_step if best_val is not None else None,
            revision_step=keep_step,
            sampling={"temperature": 0.0, "max_tokens": eval_tokens},
            package_versions=package_versions(),
        )
        return CompiledProgram(student, engine, manifest, revisions=revisions, run_dir=run_dir)
