"""Data-parallel training: the ranks of a ``torchrun`` launch share each step's rollouts and its backward passes.

Data model: a compile runs as ``world`` processes (ranks ``0 .. world-1``), each with its own engine and its own copy
of the policy. Every rank runs the same compile (same program, data, config, seed): the sampler draws the same
example indices on every rank, each rank rolls out and scores only its :meth:`shard` of them, and :meth:`gather`
gives every rank the whole step again, in the order one process would have had it. So groups, advantages, dynamic
sampling, validation decisions and guards are identical on every rank without any further communication. In the
update each rank runs the forward/backward of its shard of the packed rows, with the loss normalised by the step's
global token/row counts; :meth:`all_reduce_` sums the gradients before any clip, so every rank takes the identical
optimizer step and the adapters stay equal.

Invariants (tested in ``tests/compilers/test_distributed.py``):
- shards are **contiguous** and balanced: rank ``r`` holds ``seq[start:stop]`` of :func:`shard_bounds`; the first
  ``len(seq) % world`` ranks hold one item more; a rank may hold none;
- ``gather(shard(seq)) == seq`` on every rank (per-rank lists are concatenated in rank order);
- with one process every method is the identity (:class:`SingleProcess`): no ``torch.distributed`` needed.

Variants: :class:`SingleProcess` and :class:`TorchDistributed` (gloo on the CPU, NCCL on CUDA). :func:`from_env`
picks one: an already initialised ``torch.distributed`` group, or ``WORLD_SIZE > 1`` (set by ``torchrun``), else a
single process. Only the main rank (0) writes into the run directory and prints.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch


def shard_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """``[start, stop)`` of rank ``rank``'s contiguous share of ``n`` items over ``world`` ranks: sizes differ by at
    most one, the larger shares first; concatenated in rank order the shares are ``0 .. n-1`` exactly."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of world {world}: need world >= 1 and 0 <= rank < world")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


class SingleProcess:
    """One process: every collective is the identity."""

    rank, world, is_main = 0, 1, True

    def shard(self, seq: Sequence) -> list:
        return list(seq)

    def gather(self, objs: Sequence) -> list:
        return list(objs)

    def all_reduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        pass

    def sum(self, value: float) -> float:
        return value

    def broadcast(self, obj: Any) -> Any:
        return obj

    def broadcast_(self, tensors: Sequence[torch.Tensor]) -> None:
        pass

    def barrier(self) -> None:
        pass


class TorchDistributed:
    """The ranks of an initialised ``torch.distributed`` process group (gloo or NCCL). ``device``: where tensors
    travel for the collectives (the policy's device under NCCL, the CPU under gloo)."""

    def __init__(self, *, device: torch.device | str = "cpu"):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ValueError("torch.distributed is not initialised: launch with torchrun (or call "
                             "torch.distributed.init_process_group first), or use SingleProcess()")
        self._dist = dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.device = torch.device(device)

    def __repr__(self) -> str:
        return f"TorchDistributed(rank={self.rank}, world={self.world}, backend={self._dist.get_backend()!r})"

    def shard(self, seq: Sequence) -> list:
        """This rank's contiguous share of ``seq`` (see :func:`shard_bounds`)."""
        start, stop = shard_bounds(len(seq), self.rank, self.world)
        return list(seq[start:stop])

    def gather(self, objs: Sequence) -> list:
        """Every rank's ``objs`` (picklable), concatenated in rank order, on every rank."""
        parts: list[Any] = [None] * self.world
        self._dist.all_gather_object(parts, list(objs))
        return [o for part in parts for o in part]

    def all_reduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Sum ``tensors`` over the ranks, in place (one flat buffer per dtype: one collective each)."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for ts in by_dtype.values():
            flat = torch.cat([t.detach().reshape(-1).to(self.device) for t in ts])
            self._dist.all_reduce(flat)
            offset = 0
            for t in ts:
                t.copy_(flat[offset: offset + t.numel()].view_as(t))
                offset += t.numel()

    def sum(self, value: float) -> float:
        """``value`` summed over the ranks (float64)."""
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        self._dist.all_reduce(t)
        return float(t.item())

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` (picklable) on every rank; what the others pass is ignored."""
        box = [obj if self.is_main else None]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Overwrite ``tensors`` with rank 0's values, in place."""
        with torch.no_grad():
            for t in tensors:
                buf = t.detach().to(self.device)
                self._dist.broadcast(buf, src=0)
                if buf.data_ptr() != t.data_ptr():
                    t.copy_(buf)

    def barrier(self) -> None:
        self._dist.barrier()


Distributed = SingleProcess | TorchDistributed


def from_env(*, device: str | torch.device = "auto") -> Distributed:
    """The ranks this process belongs to: an initialised ``torch.distributed`` group of two or more; else, where
    ``torchrun`` set ``WORLD_SIZE > 1``, a new group (``nccl`` when ``device`` may be CUDA and CUDA is available,
    with this process on ``cuda:LOCAL_RANK``; ``gloo`` otherwise); else :class:`SingleProcess`. Call it before the
    policy is built, so ``device="auto"``/``"cuda"`` resolve to this rank's GPU."""
    import torch.distributed as dist

    cuda = str(device) != "cpu" and torch.cuda.is_available()
    # A group of one (vLLM initialises one in process for its own use) has nothing to share: single process.
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        nccl = dist.get_backend() == "nccl"
        return TorchDistributed(device=torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SingleProcess()
    if not dist.is_available():
        raise ValueError(f"WORLD_SIZE={world} but this torch build has no torch.distributed: run one process")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    return TorchDistributed(device=torch.device("cuda", torch.cuda.current_device()) if cuda else "cpu")
