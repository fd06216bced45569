"""Fixtures for the tasks tests. Data-set tests read ``WFC_DATA_DIR`` (CI points it at ../shared/data) and skip
cleanly when it is unset; nothing else here needs files outside the repository."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def data_dir() -> Path:
    value = os.environ.get("WFC_DATA_DIR")
    if not value:
        pytest.skip("WFC_DATA_DIR is not set (point it at a folder holding gsm8k/ and svamp/)")
    if not Path(value).is_dir():
        pytest.skip(f"WFC_DATA_DIR={value} is not a directory (point it at a folder holding gsm8k/ and svamp/)")
    return Path(value)


@pytest.fixture
def sandbox_parent():
    """A parent dir for sandbox working dirs that ``nobody`` can traverse; asserted empty (cleaned up) afterwards."""
    parent = tempfile.mkdtemp(prefix="wfc-sandbox-test-")
    os.chmod(parent, 0o711)
    yield parent
    leftovers = os.listdir(parent)
    shutil.rmtree(parent, ignore_errors=True)
    assert leftovers == [], f"the sandbox left {leftovers} behind"
