"""Handing freed host memory back to the OS between batches (:func:`release_freed_memory`).

Why: on the CPU, torch takes activations and key/value caches from ``malloc``. glibc serves a block from ``mmap``
(returned to the OS on free) only above its mmap threshold, and it raises that threshold (up to 32 MiB) each time
such a block is freed, so after the first batches the large tensors come from the heap, and heap pages freed below
its top stay with the process. A compile alternates batches of different shapes (rollouts, updates, evaluations),
so the heap fragments and resident memory ratchets up to the largest mix ever seen: a ChainOfThought compile with
demos grew to 12-15 GB over 14 steps, and three beside each other were OOM-killed on a 24 GiB machine. Measured on
its bootstrap (64-row batches, SmolLM2-135M): resident memory held at 6.7 GiB between batches without a release,
1.1-1.3 GiB with one after each batch; the peak inside a batch (its working set) is the same.

``malloc_trim(0)`` gives back the free pages of every arena (not just the heap's top, since glibc 2.8). It is a
no-op where the C library has none (macOS, musl): memory then behaves as before.
"""

from __future__ import annotations

import ctypes
import functools
import sys


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim`` from the process's own C library, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # a C library without it (musl)
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_freed_memory() -> bool:
    """Return the allocator's free pages to the OS; True if the C library could (glibc), False where it has no way
    (nothing is done then). Cheap (milliseconds); call it after a batch's tensors are freed, not inside one."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
