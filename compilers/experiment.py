"""The experiment matrix: workflows x backends x tasks x seeds, each cell one mmGRPO compile.

Writes ``results.jsonl`` (one line per cell), ``results.md`` (peak accuracy, final accuracy, step of peak, cliff
events, wall time) and ``curves.png`` (validation accuracy per cell, one panel per workflow) into ``out_dir``.
Cells run one after another on one resident base model per cell (a fresh engine per cell, so adapters never leak
between cells). A failing cell is recorded with its error and the matrix goes on.
"""

from __future__ import annotations

import itertools
import json
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

from compilers.config import MMGRPOConfig
from compilers.mmgrpo import MMGRPO
from programs import EvalOpt, OrchWorkers, Single, Voting
from wfc.engines import make_engine
from wfc.tasks import get_task

WORKFLOWS = {
    "evalopt": lambda sig: EvalOpt(sig, rounds=1),
    "voting": lambda sig: Voting(sig, n=3),
    "orchworkers": lambda sig: OrchWorkers(sig, max_subtasks=2),
    "single": lambda sig: Single(sig),
}


def summarize(history: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Peak / final validation accuracy and the step of the peak, from a compile's history (pure)."""
    evals = [r for r in history if r.get("kind") == "eval"]
    if not evals:
        return {"peak_accuracy": None, "final_accuracy": None, "peak_step": None, "cliff_events": len(events)}
    peak = max(evals, key=lambda r: (r["val_accuracy"], -r["step"]))
    return {
        "initial_accuracy": evals[0]["val_accuracy"],
        "peak_accuracy": peak["val_accuracy"],
        "peak_step": peak["step"],
        "final_accuracy": evals[-1]["val_accuracy"],
        "cliff_events": sum(1 for e in events if e.get("kind") == "cliff"),
        "curve": [(r["step"], r["val_accuracy"]) for r in evals],
    }


def run_matrix(*, workflows: Sequence[str], backends: Sequence[Any], tasks: Sequence[str], seeds: Sequence[int],
               model: str, out_dir: str | Path, config: dict[str, Any] | None = None,
               val_size: int = 30, engine: str = "hf") -> list[dict[str, Any]]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    unknown = [w for w in workflows if w not in WORKFLOWS]
    if unknown:
        raise ValueError(f"unknown workflow(s) {unknown}: choose from {sorted(WORKFLOWS)}")
    MMGRPOConfig(**(config or {}))  # validate once, before hours of work
    results = []
    for task_name, workflow, backend, seed in itertools.product(tasks, workflows, backends, seeds):
        task = get_task(task_name)
        cell = {"task": task_name, "workflow": workflow, "backend": backend, "seed": seed, "model": model}
        run_dir = out / "runs" / f"{task_name}-{workflow}-{backend}-{seed}"
        t0 = time.time()
        cell_engine = make_engine(engine, model)
        try:
            compiled = MMGRPO(task.metric, **{**(config or {}), "seed": seed}).compile(
                WORKFLOWS[workflow](task.signature), trainset=task.trainset, valset=(task.valset or [])[:val_size],
                engine=cell_engine, backend=backend, run_dir=run_dir, progress=False)
            cell.update(summarize(compiled.manifest.history, compiled.manifest.events))
            cell["backend_resolved"] = compiled.manifest.backend
            cell["backend_reasons"] = compiled.manifest.backend_reasons
        except Exception as exc:  # one failing cell must not cost the rest of the matrix
            cell["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        finally:
            cell_engine.close()
        cell["seconds"] = round(time.time() - t0, 1)
        results.append(cell)
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps(cell, default=str) + "\n")
    (out / "results.md").write_text(markdown_table(results))
    plot_curves(results, out / "curves.png")
    return results


def markdown_table(results: list[dict[str, Any]]) -> str:
    head = "| task | workflow | backend | seed | initial | peak (step) | final | cliffs | seconds |\n"
    head += "|---|---|---|---|---|---|---|---|---|\n"
    rows = []
    for r in results:
        if "error" in r:
            rows.append(f"| {r['task']} | {r['workflow']} | {r['backend']} | {r['seed']} | error: "
                        f"{r['error'][:60]} | | | | {r['seconds']} |")
            continue
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        rows.append(f"| {r['task']} | {r['workflow']} | {r['backend']} | {r['seed']} | {fmt(r.get('initial_accuracy'))} "
                    f"| {fmt(r['peak_accuracy'])} ({r['peak_step']}) | {fmt(r['final_accuracy'])} "
                    f"| {r['cliff_events']} | {r['seconds']} |")
    return head + "\n".join(rows) + "\n"


def plot_curves(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workflows = sorted({r["workflow"] for r in results if r.get("curve")})
    if not workflows:
        return
    fig, axes = plt.subplots(1, len(workflows), figsize=(5 * len(workflows), 3.5), squeeze=False)
    for ax, wf in zip(axes[0], workflows):
        for r in results:
            if r["workflow"] == wf and r.get("curve"):
                xs, ys = zip(*r["curve"])
                ax.plot(xs, ys, "o-", label=f"{r['backend']} s{r['seed']}")
        ax.set_title(wf)
        ax.set_xlabel("step")
        ax.set_ylabel("val accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
