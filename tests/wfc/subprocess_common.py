"""Running a user's script in a fresh Python process, as a user would: one thread, no PYTHONPATH, in ``cwd``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_python(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python ARGS`` in ``cwd``; asserts it exited 0 (showing its stderr's end) and returns it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
