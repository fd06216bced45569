"""The ``wfc`` command line: one function pair per subcommand (``_<name>_args`` adds its options, ``cmd_<name>``
runs it), registered in ``COMMANDS``. To add a subcommand, write the pair and add one line to ``COMMANDS``.

Subcommands:
- ``wfc inspect PROGRAM``: run a few traced rollouts of a program and print its calls and role graph.
- ``wfc compile PROGRAM --task T --out DIR``: train with mmGRPO and save an artifact (``--resume RUN_DIR``: continue
  a killed compile from its last checkpoint). Data parallel: ``torchrun --nproc_per_node N -m wfc.cli compile ...``
  (``compilers.distributed``: gloo on the CPU, NCCL on CUDA, one GPU per rank); rank 0 writes the run directory,
  saves the artifact and prints, the other ranks exit 0.
- ``wfc run DIR --input field=value``: run an artifact (``--trust-code`` lets the artifact's own code run,
  ``--program SPEC`` builds the program from yours; likewise for ``serve``).
- ``wfc plan PROGRAM``: the backend decision and its reasons, without training.
- ``wfc rollback DIR --step N``: restore an earlier evaluated adapter revision.
- ``wfc serve DIR``: serve an artifact over HTTP (workflow runs, OpenAI-compatible chat per role).

Exit codes: 0 success; 2 a user mistake (unknown model, bad import spec, program without predictors, bad option),
reported as one line ``wfc: error: ...`` on stderr with no traceback (``--debug`` re-raises it instead).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

import dspy
from pydantic import ValidationError

from compilers import MMGRPO, MMGRPOConfig
from compilers.auto import plan
from compilers.checkpoint import load as load_checkpoint
from compilers.distributed import from_env
from compilers.experiment import run_matrix
from compilers.recipes import get_recipe
from wfc.artifact import load, read_manifest, rollback
from wfc.engines import make_engine
from wfc.engines.base import SamplingParams
from wfc.flags import apply_overrides, parse_set
from wfc.imports import load_object, load_program
from wfc.lower import run_rollouts
from wfc.rolegraph import RoleGraph
from wfc.serve import serve
from wfc.serve_limits import ServeLimits
from wfc.tasks import get_task


class UsageError(ValueError):
    """A mistake on the command line that ``main`` reports in one line with exit code 2."""


# ----- wfc inspect --------------------------------------------------------------------------------------------------
def _inspect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", metavar="PROGRAM",
                   help="import spec of the program: 'path/to/file.py:name' or 'package.module:name'; the object "
                        "is a dspy.Module or a zero-argument callable returning one")
    p.add_argument("--model", default="tiny", help="model name (tiny, smollm2-135m) or a local model dir [tiny]")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="inference engine [hf]")
    p.add_argument("--task", default="arithmetic", help="task whose validation examples to run on [arithmetic]")
    p.add_argument("--n", type=_positive_int, default=3, help="number of rollouts, one per example [3]")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of every role [0.7]")
    p.add_argument("--max-tokens", type=_positive_int, default=64, help="completion token limit per call [64]")
    p.add_argument("--dot", metavar="FILE", help="write the role graph as Graphviz DOT")
    p.add_argument("--mermaid", metavar="FILE", help="write the role graph as a Mermaid flowchart")
    p.add_argument("--json", metavar="FILE", help="write the role graph and every rollout graph as JSON")


def cmd_inspect(args: argparse.Namespace) -> int:
    if args.temperature < 0:
        raise UsageError(f"--temperature must be >= 0, got {args.temperature}")
    program = load_program(args.program)  # before the model loads: a bad spec fails in a second, not ten
    examples = task_examples(args.task, args.n)
    _quiet_libraries(debug=args.debug)
    engine = make_engine(args.engine, args.model)
    try:
        sampling = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
        graphs = [g for gs in run_rollouts(program, examples, engine, sampling=sampling) for g in gs]
    finally:
        engine.close()
    for i, g in enumerate(graphs):
        print(format_rollout(i, g))
        print()
    role_graph = RoleGraph.from_rollouts(graphs)
    print(role_graph.table())
    if args.dot:
        _write(args.dot, role_graph.to_dot())
    if args.mermaid:
        _write(args.mermaid, role_graph.to_mermaid())
    if args.json:
        payload = {"program": args.program, "model": args.model, "task": args.task,
                   "role_graph": role_graph.to_dict(), "rollouts": [g.to_dict() for g in graphs]}
        _write(args.json, json.dumps(payload, indent=2, default=str))
    return 0


def task_examples(task: str, n: int) -> list:
    """``n`` examples of ``task``'s validation set (its test set for evaluation-only tasks), cycled when it has
    fewer (``wfc.tasks.get_task``)."""
    try:
        found = get_task(task)
    except KeyError as exc:
        raise UsageError(f"unknown task {task!r}: {exc}") from exc
    # evaluation-only tasks (svamp, humaneval) have no valset: inspect on their test problems
    pool = list(found.valset if found.valset is not None else (getattr(found, "testset", None) or []))
    if not pool:
        raise UsageError(f"task {task!r} has no examples to inspect on")
    return [pool[i % len(pool)] for i in range(n)]


def format_rollout(index: int, graph) -> str:
    """A rollout as text: a header with status and inputs, one line per call, then outputs or the error."""
    inputs = ", ".join(f"{k}: {_short(v, 70)}" for k, v in graph.example.items())
    lines = [f"rollout {index} [{graph.status}] {inputs}"]
    width = max((len(f"{c.role}[{c.invocation}]") for c in graph.calls), default=0)
    for c in graph.calls:
        who = f"{c.role}[{c.invocation}]".ljust(width)
        tokens = f"{len(c.prompt_ids)}+{len(c.completion_ids)} tok"
        detail = _short(c.text, 60) if c.status != "crash" else _short(c.error or "", 60)
        lines.append(f"  #{c.id:<3} {who}  {c.status:<12} {tokens:>12}  {detail}")
    if graph.outputs is not None:
        lines.append("  -> " + ", ".join(f"{k}={_short(v, 50)}" for k, v in graph.outputs.items()))
    if graph.error:
        lines.append(f"  error: {_short(graph.error, 200)}")
    return "\n".join(lines)


# ----- wfc compile --------------------------------------------------------------------------------------------------
def _compile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", metavar="PROGRAM", help="import spec of the program (see `wfc inspect -h`)")
    p.add_argument("--task", default="arithmetic", help="task giving trainset, valset and metric [arithmetic]")
    p.add_argument("--train", help="JSONL file of training examples (overrides the task's trainset)")
    p.add_argument("--val", help="JSONL file of validation examples (overrides the task's valset)")
    p.add_argument("--inputs", default=None, help="comma-separated input field names for --train/--val "
                                                   "[the task signature's inputs]")
    p.add_argument("--metric", help="import spec of a metric function (overrides the task's metric)")
    p.add_argument("--val-size", type=_positive_int, default=None, help="use only the first N validation examples")
    p.add_argument("--recipe", default=None,
                   help="named recipe from compilers/recipes.py (e.g. fast, what `make demo` runs) as the starting "
                        "config; --config, --set and the flags below override it")
    p.add_argument("--config", help="JSON file with MMGRPOConfig fields; flags below override it")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override one config field (JSON value), e.g. --set group_size=8 --set lora.r=8")
    for flag, field in (("--steps", "steps"), ("--group-size", "group_size"),
                        ("--examples-per-step", "examples_per_step"), ("--max-tokens", "max_tokens"),
                        ("--eval-every", "eval_every")):
        p.add_argument(flag, dest=field, type=int, default=None)
    for flag, field in (("--lr", "learning_rate"), ("--temperature", "temperature")):
        p.add_argument(flag, dest=field, type=float, default=None)
    p.add_argument("--model", default="smollm2-135m", help="base model [smollm2-135m]")
    p.add_argument("--device", dest="device", default=None,
                   help="where the trained policy lives: auto (CUDA when available) | cpu | cuda | cuda:N [auto]")
    p.add_argument("--backend", default="shared",
                   help="shared | isolated | auto | JSON dict role -> adapter group [shared]")
    _engine_args(p, help="rollout engine: hf, vllm (the vllm extra; adapter-only hand-off each step), or "
                         "vllm-server (running vLLM servers: --server / --launch-servers) [hf]")
    p.add_argument("--engine-dtype", default="float32", choices=["float32", "bfloat16"],
                   help="hf engine: the dtype of the rollout engine's weights; bfloat16 generates on a copy of its "
                        "own (about 1.4x faster on CPUs with AVX-512 BF16) while the policy trains in float32 "
                        "[float32]")
    p.add_argument("--out", required=True, help="artifact directory to write")
    p.add_argument("--run-dir", default=None, help="where metrics.jsonl, curves and checkpoints go [runs/<time>]")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue a killed compile from the checkpoint in its run directory (same program, task, "
                        "model, backend and config; only --steps may change)")
    p.epilog = ("data-parallel training: torchrun --nproc_per_node N -m wfc.cli compile ... (each rank rolls out "
                "and backpropagates its share of every step; gradients are summed; only rank 0 writes --out "
                "and --run-dir and prints; gloo on the CPU, NCCL and one GPU per rank on CUDA)")


def _engine_args(p: argparse.ArgumentParser, *, help: str) -> None:
    """``--engine`` and the vllm-server engine's options (shared by compile and plan)."""
    p.add_argument("--engine", default="hf", choices=["hf", "vllm", "vllm-server"], help=help)
    p.add_argument("--server", action="append", default=[], metavar="URL",
                   help="vllm-server engine: a running `vllm serve BASE --enable-lora --logprobs-mode "
                        "processed_logprobs` with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, on this machine or one "
                        "sharing a filesystem; repeat for several (requests are spread, dead servers skipped)")
    p.add_argument("--launch-servers", type=_positive_int, default=None, metavar="N",
                   help="vllm-server engine: start N local vLLM servers on the model, stopped at the end "
                        "[1 when no --server is given]")


def _engine_kwargs(args: argparse.Namespace) -> dict:
    if args.engine != "vllm-server":
        if args.server or args.launch_servers:
            raise UsageError("--server and --launch-servers need --engine vllm-server")
        return {}
    return {"servers": args.server, "launch": args.launch_servers}


def _read_jsonl(path: str, inputs: list[str]) -> list:
    examples = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{n}: not JSON ({exc})") from None
        missing = [k for k in inputs if k not in row]
        if missing:
            raise UsageError(f"{path}:{n}: missing input field(s) {missing}; pass --inputs to name them")
        examples.append(dspy.Example(**row).with_inputs(*inputs))
    if not examples:
        raise UsageError(f"{path} holds no examples")
    return examples


def _config_overrides(args: argparse.Namespace) -> dict:
    cfg: dict[str, Any] = {}
    if getattr(args, "recipe", None):
        try:
            cfg = get_recipe(args.recipe)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.config:
        cfg.update(json.loads(Path(args.config).read_text()))
    try:
        cfg = apply_overrides(cfg, parse_set(args.set))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for field in ("steps", "group_size", "examples_per_step", "max_tokens", "eval_every", "learning_rate",
                  "temperature", "device"):
        if getattr(args, field, None) is not None:
            cfg[field] = getattr(args, field)
    return cfg


def cmd_compile(args: argparse.Namespace) -> int:
    _quiet_libraries(debug=args.debug)
    program = load_program(args.program)
    task = get_task(args.task)
    inputs = args.inputs.split(",") if args.inputs else list(task.signature.input_fields)
    trainset = _read_jsonl(args.train, inputs) if args.train else task.trainset
    valset = _read_jsonl(args.val, inputs) if args.val else (task.valset or [])
    if args.val_size:
        valset = valset[: args.val_size]
    metric = load_object(args.metric) if args.metric else task.metric
    try:
        config = MMGRPOConfig(**_config_overrides(args))
    except ValidationError as exc:
        raise UsageError(f"bad config: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
    backend = args.backend
    if backend.startswith("{"):
        backend = json.loads(backend)
    distributed = from_env(device=config.device)  # torchrun's ranks (else one process), before any model loads
    if args.resume:  # a missing or corrupted checkpoint is reported before the model loads
        load_checkpoint(args.resume)
    # hf: compile builds the policy (on --device) and a colocated engine on it; others: their own copy of the base
    engine_kwargs = _engine_kwargs(args)  # checks the flags first, whatever the engine
    if args.engine_dtype != "float32":
        if args.engine != "hf":
            raise UsageError("--engine-dtype is the hf engine's option; vLLM engines take their dtype from the model")
        engine_kwargs = {"dtype": args.engine_dtype, "device": config.device}  # a bf16 copy; compile trains apart
    engine = make_engine(args.engine, args.model, **engine_kwargs) if engine_kwargs or args.engine != "hf" else None
    compiled = None
    try:
        compiled = MMGRPO(metric, config=config).compile(program, trainset=trainset, valset=valset, engine=engine,
                                                         model=args.model, backend=backend, run_dir=args.run_dir,
                                                         program_import_path=args.program, resume=args.resume,
                                                         distributed=distributed)
        if not distributed.is_main:  # every rank holds the same result: rank 0 saves it and reports
            return 0
        path = compiled.save(args.out)
    finally:
        if engine is not None:
            engine.close()
        elif compiled is not None:
            compiled.engine.close()
    evals = [r for r in compiled.manifest.history if r["kind"] == "eval"]
    if evals:
        print(f"validation accuracy: {evals[0]['val_accuracy']:.3f} (step 0) -> "
              f"{max(r['val_accuracy'] for r in evals):.3f} (best, step {compiled.manifest.best_step})")
    print(f"wrote artifact {path}")
    return 0


# ----- wfc run ------------------------------------------------------------------------------------------------------
def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", metavar="DIR", help="artifact directory written by compile")
    p.add_argument("--input", action="append", default=[], metavar="FIELD=VALUE", help="one program input")
    p.add_argument("--model", default=None, help="where to load the base model from [the manifest's]")
    p.add_argument("--trace", action="store_true", help="also print the rollout graph of the run")
    _load_args(p)


def _load_args(p: argparse.ArgumentParser) -> None:
    """How an artifact's program is restored (see wfc.artifact.load): options of run and serve."""
    p.add_argument("--trust-code", action="store_true",
                   help="allow running code shipped in the artifact (its copied program source, its pickle); only "
                        "for artifacts from someone you trust [off: only code this environment can import]")
    p.add_argument("--program", default=None, metavar="SPEC",
                   help="build the program from your own code instead: 'file.py:factory' (a zero-argument "
                        "function or class returning it); its trained state is loaded from the artifact")


def cmd_run(args: argparse.Namespace) -> int:
    _quiet_libraries(debug=args.debug)
    inputs = {}
    for item in args.input:
        if "=" not in item:
            raise UsageError(f"--input expects FIELD=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        inputs[key] = value
    if not inputs:
        raise UsageError("give the program's inputs with --input FIELD=VALUE")
    compiled = load(args.artifact, model=args.model, trust_code=args.trust_code, program_import_path=args.program)
    graph = compiled.trace(inputs)
    if graph.status != "ok":
        raise UsageError(f"the run ended with {graph.status}: {graph.error}")
    for key, value in (graph.outputs or {}).items():
        print(f"{key}: {value}")
    if args.trace:
        print(format_rollout(0, graph))
    return 0


# ----- wfc plan -----------------------------------------------------------------------------------------------------
def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", metavar="PROGRAM", help="import spec of the program")
    p.add_argument("--model", default="tiny", help="model to trace with [tiny]")
    p.add_argument("--task", default="arithmetic", help="task whose examples to trace [arithmetic]")
    p.add_argument("--n", type=_positive_int, default=4, help="examples to trace [4]")
    p.add_argument("--config", help="JSON file with MMGRPOConfig fields (the trace uses its temperature, "
                                    "max_tokens, auto_* settings), as for compile")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override one config field (JSON value), e.g. --set auto_trace_repeats=2")
    _engine_args(p, help="engine to trace on: hf, vllm or vllm-server (see `wfc compile -h`) [hf]")


def cmd_plan(args: argparse.Namespace) -> int:
    _quiet_libraries(debug=args.debug)
    program = load_program(args.program)
    try:
        config = MMGRPOConfig(**_config_overrides(args))
    except ValidationError as exc:
        raise UsageError(f"bad config: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
    examples = task_examples(args.task, args.n)
    engine = make_engine(args.engine, args.model, **_engine_kwargs(args))
    try:
        decision = plan(program, examples, engine, config=config, seed=config.seed)
    finally:
        engine.close()
    print(decision.describe())
    return 0


# ----- wfc rollback -------------------------------------------------------------------------------------------------
def _rollback_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", metavar="DIR", help="artifact directory")
    p.add_argument("--step", type=int, required=True, help="evaluated revision to restore (see manifest.revisions)")


def cmd_rollback(args: argparse.Namespace) -> int:
    manifest = rollback(args.artifact, step=args.step)
    print(f"{args.artifact}: adapters now hold the revision of step {manifest.revision_step}")
    return 0


# ----- wfc serve ----------------------------------------------------------------------------------------------------
def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", metavar="DIR", help="artifact directory written by compile")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="inference engine [hf]")
    p.add_argument("--model", default=None, help="where to load the base model from [the manifest's]")
    _load_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on [127.0.0.1]")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free port) [8000]")
    p.add_argument("--max-tokens-limit", type=_positive_int, default=1024,
                   help="largest max_tokens a chat request may ask for [1024]")
    p.add_argument("--max-concurrent", "--max-concurrency", dest="max_concurrent", type=_positive_int, default=64,
                   help="requests (chat or workflow runs) worked on at once [64]")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests waiting for a slot; beyond them clients get 429 with Retry-After [256]")
    p.add_argument("--request-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="a request not answered within this is cancelled and answered 504 [300]")
    p.add_argument("--max-body-bytes", type=_positive_int, default=1 << 20,
                   help="largest request body; more is a 413, refused before it is read [1048576]")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="a body not fully received within this is a 408 (slow clients) [30]")
    p.add_argument("--max-prompt-tokens", type=_positive_int, default=None,
                   help="largest prompt in tokens; more is a 400 [the model's context length]")
    p.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="environment variable holding the API key clients send as 'Authorization: Bearer KEY' "
                        "[WFC_API_KEY; no key when it is unset]")


def cmd_serve(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    name = args.api_key_env or "WFC_API_KEY"
    api_key = os.environ.get(name) or None
    if args.api_key_env and api_key is None:
        raise UsageError(f"--api-key-env {name}: that environment variable is unset or empty; export the key in it")
    try:
        limits = ServeLimits(max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
                             max_concurrent=args.max_concurrent, max_queue=args.max_queue,
                             request_timeout_s=args.request_timeout, body_timeout_s=args.body_timeout)
    except ValueError as exc:
        raise UsageError(f"serve limits: {exc}") from None
    read_manifest(args.artifact)  # a wrong directory fails first, before any output and before the model loads
    _quiet_libraries(debug=args.debug)
    print(f"wfc serve: {'API key from $' + name if api_key else 'no API key: every client is served'}",
          file=sys.stderr)
    serve(args.artifact, engine=args.engine, model=args.model, host=args.host, port=args.port, api_key=api_key,
          max_tokens_limit=args.max_tokens_limit, limits=limits, log_level="debug" if args.debug else "info",
          trust_code=args.trust_code, program_import_path=args.program)
    return 0


# ----- wfc experiment -----------------------------------------------------------------------------------------------
def _experiment_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workflows", default="evalopt,voting,orchworkers", help="comma-separated [evalopt,voting,orchworkers]")
    p.add_argument("--backends", default="shared,isolated,auto", help="comma-separated [shared,isolated,auto]")
    p.add_argument("--tasks", default="arithmetic", help="comma-separated task names [arithmetic]")
    p.add_argument("--seeds", default="0", help="comma-separated seeds [0]")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--config", help="JSON file with MMGRPOConfig fields shared by every cell")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override one config field")
    p.add_argument("--val-size", type=_positive_int, default=30)
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="rollout engine of every cell [hf]")
    p.add_argument("--out", required=True, help="directory for results.jsonl, results.md, curves.png")


def cmd_experiment(args: argparse.Namespace) -> int:
    _quiet_libraries(debug=args.debug)
    for field in ("steps", "group_size", "examples_per_step", "max_tokens", "eval_every", "learning_rate",
                  "temperature", "device"):
        setattr(args, field, None)
    results = run_matrix(workflows=args.workflows.split(","), backends=args.backends.split(","),
                         tasks=args.tasks.split(","), seeds=[int(s) for s in args.seeds.split(",")],
                         model=args.model, out_dir=args.out, config=_config_overrides(args), val_size=args.val_size,
                         engine=args.engine)
    print(Path(args.out, "results.md").read_text())
    return 0 if all("error" not in r for r in results) else 1


# name -> (help, add-arguments, run). One line per subcommand.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "inspect": ("run a few traced rollouts and print the program's role graph", _inspect_args, cmd_inspect),
    "compile": ("train a program's roles with mmGRPO and save an artifact", _compile_args, cmd_compile),
    "run": ("run a compiled artifact on inputs", _run_args, cmd_run),
    "plan": ("show the backend decision (shared / isolated / grouped) without training", _plan_args, cmd_plan),
    "experiment": ("run the workflows x backends x tasks x seeds matrix", _experiment_args, cmd_experiment),
    "rollback": ("restore an artifact's adapters to an earlier evaluated revision", _rollback_args, cmd_rollback),
    "serve": ("serve an artifact over HTTP: workflow runs and OpenAI-compatible chat per role", _serve_args,
              cmd_serve),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wfc", description="Compile multi-agent LLM workflow programs.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and library logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, add_args, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_args(p)
        p.set_defaults(func=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``wfc`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args) or 0
    except (ValueError, TypeError, ImportError, OSError) as exc:  # user mistakes; ModelNotFoundError is a ValueError
        if args.debug:
            raise
        print(f"wfc: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("wfc: interrupted", file=sys.stderr)
        return 130


# ----- helpers ------------------------------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _short(value: Any, width: int) -> str:
    text = " ".join(str(value).split())
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _write(path: str, text: str) -> None:
    Path(path).write_text(text)
    print(f"wrote {path}")


def _quiet_libraries(*, debug: bool) -> None:
    """Keep the printed rollouts readable: no per-call truncation warnings from DSPy, no load progress bars."""
    if debug:
        return
    logging.getLogger("dspy").setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


if __name__ == "__main__":
    sys.exit(main())
