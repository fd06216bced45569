"""What the suite measured, read back and put in a table: per-role pass rates from a run's step records, intervals
over seeds, and the markdown table of ``benchmarks/suite.py`` (pure functions over rows; nothing here runs a model).

A row (one task, one compile seed) is a dict: ``task``, ``seed``, ``shape``, ``base`` and ``compiled`` (greedy
held-out ``accuracy`` with its 95% ``interval``), ``sampled`` (the base program's ``pass@1`` and ``pass@k`` with its
``k``), ``constant`` (optional: ``compilers.baselines.constant_answer``, the bar a program that ignores its input
sets), ``gain`` (compiled minus base accuracy), ``roles`` (:func:`role_pass_rates`), ``minutes`` (``compile``) and
``rollout_tokens``. A row with ``skipped`` or ``error`` (a message) holds no figures and is listed under the table.
Accuracies and gains are fractions in rows and percentage points in the table.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
MIN_PASS_AT_K = 0.10  # the bar: tasks whose base pass@k reaches this must gain TASK_GAIN
TASK_GAIN = 0.10
SUITE_GAIN = 0.20


def role_pass_rates(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per role, its mean call reward in the training steps (``roles[<role>].reward_mean`` of the ``step``
    records; a pass rate where the metric is 0/1 and every call parsed): ``first`` and ``last`` (the first and last
    step the role trained in), ``mean`` (over those steps, weighted by calls) and ``steps``. Roles in no step are
    absent."""
    seen: dict[str, list[tuple[float, int]]] = {}
    for record in records:
        if record.get("kind") != "step":
            continue
        for role, stats in (record.get("roles") or {}).items():
            seen.setdefault(role, []).append((stats["reward_mean"], stats.get("calls", 1)))
    return {role: {"first": got[0][0], "last": got[-1][0], "steps": len(got),
                   "mean": sum(r * c for r, c in got) / max(sum(c for _, c in got), 1)}
            for role, got in seen.items()}


def seed_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, low, high)``: the 95% Student-t interval of the mean over seeds; one value gives ``(v, v, v)``."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def _measured(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rows if "skipped" not in r and "error" not in r]


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task (in first-seen order), over its measured rows: ``base``, ``pass_at_k``, ``compiled``, ``minutes``,
    ``rollout_tokens`` (means), ``gain`` (:func:`seed_interval`), ``seeds``, ``k``, ``shape``, and the issue's
    checks: ``weak`` (mean pass@k below :data:`MIN_PASS_AT_K`: the gain bar does not apply) and ``meets``
    (the mean gain is at least :data:`TASK_GAIN`)."""
    out: dict[str, dict[str, Any]] = {}
    for task in dict.fromkeys(r["task"] for r in _measured(rows)):
        mine = sorted((r for r in _measured(rows) if r["task"] == task), key=lambda r: r["seed"])
        mean = lambda get: statistics.fmean(get(r) for r in mine)  # noqa: E731
        gain = seed_interval([r["gain"] for r in mine])
        pass_k = mean(lambda r: r["sampled"]["pass@k"])
        out[task] = {"shape": mine[0].get("shape", ""), "seeds": [r["seed"] for r in mine],
                     "k": mine[0]["sampled"]["k"], "base": mean(lambda r: r["base"]["accuracy"]),
                     "pass_at_k": pass_k, "compiled": mean(lambda r: r["compiled"]["accuracy"]), "gain": gain,
                     "minutes": mean(lambda r: r["minutes"]["compile"]),
                     "rollout_tokens": mean(lambda r: r["rollout_tokens"]),
                     "weak": pass_k < MIN_PASS_AT_K, "meets": gain[0] >= TASK_GAIN}
    return out


def suite_gain(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float, float] | None:
    """The suite average gain: per seed, the mean gain over the tasks measured at that seed, then
    :func:`seed_interval` over seeds. None when nothing was measured."""
    by_seed: dict[int, list[float]] = {}
    for r in _measured(rows):
        by_seed.setdefault(r["seed"], []).append(r["gain"])
    return seed_interval([statistics.fmean(g) for g in by_seed.values()]) if by_seed else None


def _pts(x: float, sign: bool = False) -> str:
    return f"{100 * x:+.1f}" if sign else f"{100 * x:.1f}"


def _interval(mean_low_high: Sequence[float]) -> str:
    mean, low, high = mean_low_high
    return f"{_pts(mean, True)} [{_pts(low, True)}, {_pts(high, True)}]"


def _task_line(task: str, s: Mapping[str, Any]) -> str:
    bar = "n/a (weak base)" if s["weak"] else ("yes" if s["meets"] else "no")
    return (f"| {task} | {s['shape']} | {_pts(s['base'])} | {_pts(s['pass_at_k'])} | {_pts(s['compiled'])} | "
            f"{_interval(s['gain'])} | {','.join(map(str, s['seeds']))} | {bar} | {s['minutes']:.1f} | "
            f"{s['rollout_tokens']:,.0f} |")


def _roles(roles: Mapping[str, Mapping[str, float]]) -> str:
    return "; ".join(f"{role} {_pts(v['first'])}->{_pts(v['last'])}" for role, v in roles.items()) or "-"


def _constant(r: Mapping[str, Any]) -> str:
    """The constant-answer bar (``compilers.baselines``); rows written before it was measured show '-'."""
    return _pts(r["constant"]["accuracy"]) if "constant" in r else "-"


def _seed_line(r: Mapping[str, Any]) -> str:
    base, compiled, sampled = r["base"], r["compiled"], r["sampled"]
    return (f"| {r['task']} | {r['seed']} | {_pts(base['accuracy'])} [{_pts(base['interval'][0])}, "
            f"{_pts(base['interval'][1])}] | {_constant(r)} | {_pts(sampled['pass@1'])} | "
            f"{_pts(sampled['pass@k'])} | "
            f"{_pts(compiled['accuracy'])} [{_pts(compiled['interval'][0])}, {_pts(compiled['interval'][1])}] | "
            f"{_pts(r['gain'], True)} | {_roles(r.get('roles', {}))} | {r['minutes']['compile']:.1f} | "
            f"{r['rollout_tokens']:,} |")


def markdown_table(rows: Sequence[Mapping[str, Any]], tasks: Sequence[str] = ()) -> str:
    """The suite's table: one line per task (means over seeds; the gain's 95% t-interval over seeds; whether it
    meets the +10-point bar, which applies where the base's pass@k reaches 10%), the suite average, then one line
    per (task, seed) with per-role mean call rewards in training (first step -> last), then skipped and failed
    rows, then the tasks of ``tasks`` (the suite's own list) with no row at all, so the table says what it left
    out."""
    summary = summarize(rows)
    k = next(iter(summary.values()))["k"] if summary else 16
    lines = [f"| task | program | base | pass@{k} | compiled | gain [95% CI] | seeds | +10 bar | min | "
             f"rollout tokens |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_task_line(task, s) for task, s in summary.items()]
    overall = suite_gain(rows)
    if overall is not None:
        bar = "meets" if overall[0] >= SUITE_GAIN else "below"
        lines += ["", f"Suite average gain: {_interval(overall)} points over {len(summary)} tasks ({bar} the "
                      f"+{100 * SUITE_GAIN:.0f} bar). Accuracies in %, greedy on held-out tests; base pass@{k} "
                      f"sampled at the compile's temperature."]
    lines += ["", f"| task | seed | base [95% CI] | constant | pass@1 | pass@{k} | compiled [95% CI] | gain | "
                  f"role reward first->last | min | rollout tokens |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {task: i for i, task in enumerate(summary)}
    lines += [_seed_line(r) for r in sorted(_measured(rows), key=lambda r: (order[r["task"]], r["seed"]))]
    notes = [f"- {r['task']} seed {r['seed']}: {'skipped' if 'skipped' in r else 'failed'}: "
             f"{r.get('skipped') or r.get('error')}" for r in rows if r not in _measured(rows)]
    notes += [f"- {task}: not run" for task in tasks if task not in {r["task"] for r in rows}]
    return "\n".join(lines + ([""] + notes if notes else []))


def remedy_figures(row: Mapping[str, Any], log: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One remedy arm's run (a suite ``row`` and its run's step-log records ``log``): held-out ``compiled``
    accuracy and ``interval``, ``gain``, ``steps`` run, ``signal_steps`` (steps where at least one drawn example
    had two different rewards), ``rollout_tokens`` (the budgeted figure, warm start and probe included),
    ``warm_passing`` (the warm start's passing runs out of its runs, ``"1/300"``; None without a warm start),
    ``probe_pass_rate`` (None without a probe), ``best_step`` and compile ``minutes``."""
    steps = [r for r in log if r.get("kind") == "step"]
    warm = [r for r in log if r.get("kind") == "warm_start"]
    probe = [r for r in log if r.get("kind") == "probe"]
    return {"compiled": row["compiled"]["accuracy"], "interval": tuple(row["compiled"]["interval"]),
            "gain": row["gain"], "steps": len(steps),
            "signal_steps": sum(r["starvation"]["flat"] < r["starvation"]["drawn"] for r in steps),
            "rollout_tokens": row["rollout_tokens"],
            "warm_passing": f"{warm[-1]['passing_runs']}/{warm[-1]['runs']}" if warm else None,
            "probe_pass_rate": probe[-1]["pass_rate"] if probe else None,
            "best_step": row.get("best_step"), "minutes": row["minutes"]["compile"]}


def remedy_table(arms: Mapping[str, tuple[str, Sequence[Mapping[str, Any]]]]) -> str:
    """The remedy table: per arm (name -> (its settings, its per-seed :func:`remedy_figures`), in the given order)
    the mean held-out accuracy, the gain's 95% t-interval over seeds, then per seed: signal steps / steps, rollout
    tokens, warm-start passing runs, probe pass rate, best step, minutes. Arms with no measured seed are listed as
    not run."""
    lines = ["| arm | settings | seeds | compiled | gain [95% CI] | signal steps | rollout tokens | warm-start "
             "passing runs | probe pass rate | best step | min |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (settings, figs) in arms.items():
        if not figs:
            lines.append(f"| {name} | {settings} | - | not run | | | | | | | |")
            continue
        per = lambda key, fmt: " / ".join("-" if f[key] is None else fmt(f[key]) for f in figs)  # noqa: E731
        signal = " / ".join(f"{f['signal_steps']}/{f['steps']}" for f in figs)
        lines.append(
            f"| {name} | {settings} | {len(figs)} | {_pts(statistics.fmean(f['compiled'] for f in figs))} | "
            f"{_interval(seed_interval([f['gain'] for f in figs]))} | {signal} | "
            f"{per('rollout_tokens', '{:,}'.format)} | {per('warm_passing', str)} | "
            f"{per('probe_pass_rate', '{:.3f}'.format)} | {per('best_step', str)} | "
            f"{per('minutes', '{:.1f}'.format)} |")
    return "\n".join(lines)
