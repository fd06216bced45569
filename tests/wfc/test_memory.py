"""``wfc.memory.release_freed_memory``: freed heap pages go back to the OS (glibc), a no-op elsewhere."""

import subprocess
import sys
import textwrap

import pytest

import wfc.memory
from wfc.memory import release_freed_memory

# In a fresh process: raise glibc's dynamic mmap threshold (free one 16 MiB block), so 1 MiB blocks come from the
# heap as a torch batch's tensors do; touch and free 300 of them while the last stays allocated (the heap's top
# cannot shrink), then release. Prints resident MiB after the frees and after the release.
CHILD = textwrap.dedent("""
    import ctypes, importlib.util, os, sys
    spec = importlib.util.spec_from_file_location("memory", sys.argv[1])  # the module alone: no torch in the heap
    memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(memory)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    libc.free(libc.malloc(16 << 20))
    blocks = [libc.malloc(1 << 20) for _ in range(300)]
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    for b in blocks[:-1]:
        libc.free(b)
    held = rss()
    assert memory.release_freed_memory()
    print(held, rss())
""")


def test_release_returns_freed_heap_pages():
    if not sys.platform.startswith("linux"):
        pytest.skip("malloc_trim is glibc's")
    if not release_freed_memory():
        pytest.skip("this C library has no malloc_trim")
    out = subprocess.run([sys.executable, "-c", CHILD, wfc.memory.__file__], capture_output=True, text=True, check=True)
    held, released = map(float, out.stdout.split())
    assert held - released > 200, (held, released)  # ~299 MiB of freed blocks went back
