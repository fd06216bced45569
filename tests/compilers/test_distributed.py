"""Data-parallel training (compilers.distributed): the sharding rule, the single-process identity, the same-compile
check, and 2 gloo ranks on the CPU ending with the adapters of 1 process (same seed, same global batch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ddp_compile  # tests/compilers is on the path, as for tiny_setup
from compilers.distributed import SingleProcess, TorchDistributed, from_env, shard_bounds
from compilers.mmgrpo import _check_same_compile

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.mark.parametrize("n, world, bounds", [
    (4, 2, [(0, 2), (2, 4)]),
    (5, 2, [(0, 3), (3, 5)]),     # the larger share first
    (1, 2, [(0, 1), (1, 1)]),     # a rank may hold nothing
    (0, 3, [(0, 0)] * 3),
    (7, 3, [(0, 3), (3, 5), (5, 7)]),
    (3, 1, [(0, 3)]),
])
def test_shard_bounds_table(n, world, bounds):
    assert [shard_bounds(n, r, world) for r in range(world)] == bounds


def test_shards_are_contiguous_and_concatenate_to_the_sequence():
    for world in range(1, 6):
        for n in range(0, 13):
            seq = list(range(n))
            parts = [seq[slice(*shard_bounds(n, r, world))] for r in range(world)]
            assert [x for p in parts for x in p] == seq  # gather(shard(seq)) == seq
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_bad_rank_says_what_is_needed():
    with pytest.raises(ValueError, match="0 <= rank < world"):
        shard_bounds(4, 2, 2)


def test_single_process_is_the_identity(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    one = from_env(device="cpu")
    assert isinstance(one, SingleProcess) and one.is_main and (one.rank, one.world) == (0, 1)
    t = torch.ones(3)
    one.all_reduce_([t])
    one.broadcast_([t])
    assert torch.equal(t, torch.ones(3)) and one.sum(2.5) == 2.5 and one.broadcast({"a": 1}) == {"a": 1}
    assert one.gather(one.shard([1, 2, 3])) == [1, 2, 3]
    if not torch.distributed.is_initialized():
        with pytest.raises(ValueError, match="launch with torchrun"):
            TorchDistributed()


class _TwoRanks(SingleProcess):
    """A stand-in for 2 ranks whose other rank reports ``other`` (for the same-compile check)."""

    world = 2

    def __init__(self, other: str):
        self.other = other

    def gather(self, objs):
        return [*objs, self.other]


def test_ranks_running_different_compiles_are_refused():
    fp = {"config": {"steps": 2}, "trainset": "abc", "roles": {"solver": "shared"}}
    _check_same_compile(_TwoRanks(json.dumps(fp, sort_keys=True)), fp)  # the same: fine
    other = json.dumps({**fp, "trainset": "xyz"}, sort_keys=True)
    with pytest.raises(ValueError, match=r"rank 1 of 2 .*\['trainset'\].*same program, data"):
        _check_same_compile(_TwoRanks(other), fp)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_two_gloo_ranks_end_with_the_adapters_of_one_process(tmp_path):
    """Same seed, same global batch (2 examples per step: one per rank): 2 ranks step exactly like 1 process, up to
    the gradients' summation order; both ranks hold the same adapters; only rank 0 writes the run directory."""
    one = ddp_compile.train(tmp_path / "one", tmp_path / "one" / "run", distributed=SingleProcess())
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(HERE / "ddp_compile.py"), str(tmp_path / "two"), str(tmp_path / "two" / "run")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / "two" / f"rank{r}.pt") for r in (0, 1))
    assert r0["prompts"] and r1["prompts"] and not set(r0["prompts"]) & set(r1["prompts"])  # each its own share
    assert sorted(r0["prompts"] + r1["prompts"]) == one["prompts"]  # ... of the same global batch
    diff = 0.0
    for adapter, state in one["final"].items():
        assert any(not torch.equal(v, one["initial"][adapter][k]) for k, v in state.items()), "training must move it"
        assert all(torch.equal(r0["initial"][adapter][k], v) for k, v in one["initial"][adapter].items())
        for k, v in state.items():
            assert torch.equal(r0["final"][adapter][k], r1["final"][adapter][k]), f"ranks differ in {k}"
            assert torch.allclose(r0["final"][adapter][k], v, atol=1e-5, rtol=0), f"{k}: 2 ranks != 1 process"
            diff = max(diff, float((r0["final"][adapter][k] - v).abs().max()))
    print(f"max |2 ranks - 1 process| = {diff:.3g}")
    # rank 0 alone wrote the log: the same records as one process, not twice; the stats are global
    a, b = _metrics(tmp_path / "one" / "run"), _metrics(tmp_path / "two" / "run")
    assert [r["kind"] for r in a] == [r["kind"] for r in b]
    for x, y in zip(a, b):
        if x["kind"] == "eval":
            assert (x["val_accuracy"], x["n"]) == (y["val_accuracy"], y["n"])
        if x["kind"] == "step":
            assert (x["rollouts"], x["groups"], x["reward_mean"]) == (y["rollouts"], y["groups"], y["reward_mean"])
            ux, uy = x["adapters"]["shared"], y["adapters"]["shared"]
            assert (ux["rows"], ux["trained_rows"]) == (uy["rows"], uy["trained_rows"])
            assert uy["grad_norm"] > 0 and uy["grad_norm"] == pytest.approx(ux["grad_norm"], rel=1e-5)
            assert uy["loss"] == pytest.approx(ux["loss"], abs=1e-6)
            assert uy["logprob_mismatch"]["tokens"] == ux["logprob_mismatch"]["tokens"]
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["rank0.pt", "rank1.pt", "run"]
