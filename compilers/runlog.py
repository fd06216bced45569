"""The run log: one JSON line per step (and per validation) in ``metrics.jsonl``, and PNG curves at the end.

``write=False`` keeps the records in memory only (no directory, no file, no plot): the log of a data-parallel rank
other than the main one, so only one process writes the run directory. ``fresh=True`` (a compile that starts over in
a used run directory) moves an earlier ``metrics.jsonl`` to ``metrics.previous.jsonl`` first, so one file never mixes
two runs' records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class RunLog:
    def __init__(self, run_dir: str | Path, *, write: bool = True, fresh: bool = False):
        self.dir = Path(run_dir)
        self.write = write
        self.path = self.dir / "metrics.jsonl"
        if write:
            self.dir.mkdir(parents=True, exist_ok=True)
            if fresh and self.path.exists():
                self.path.replace(self.dir / "metrics.previous.jsonl")
        self.records: list[dict[str, Any]] = []

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if not self.write:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record, default=float) + "\n")

    def plot(self) -> Path | None:
        """reward and validation accuracy over steps -> curves.png; per-role reward -> roles.png."""
        if not self.write:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps = [r for r in self.records if r.get("kind") == "step"]
        evals = [r for r in self.records if r.get("kind") == "eval"]
        if not steps and not evals:
            return None
        fig, ax = plt.subplots(figsize=(7, 4))
        if steps:
            ax.plot([r["step"] for r in steps], [r["reward_mean"] for r in steps], label="train reward (mean)")
        if evals:
            ax.plot([r["step"] for r in evals], [r["val_accuracy"] for r in evals], "o-", label="validation accuracy")
        ax.set_xlabel("step")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        out = self.dir / "curves.png"
        fig.savefig(out, dpi=100)
        plt.close(fig)
        roles = sorted({role for r in steps for role in r.get("roles", {})})
        if roles:
            keys = ["reward_mean", "grad_norm", "token_share", "no_signal_rate", "format_error_rate", "entropy"]
            fig, axes = plt.subplots(2, 3, figsize=(12, 6))
            for ax, key in zip(axes.flat, keys):
                for role in roles:
                    xs = [r["step"] for r in steps if key in r["roles"].get(role, {})]
                    ys = [r["roles"][role][key] for r in steps if key in r["roles"].get(role, {})]
                    if xs:
                        ax.plot(xs, ys, label=role)
                ax.set_title(key)
                ax.grid(alpha=0.3)
            axes.flat[0].legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(self.dir / "roles.png", dpi=90)
            plt.close(fig)
        return out
