"""Fixtures for the example scripts: ``load_example(name)`` imports ``examples/<name>.py`` afresh as a module (the
scripts are not a package), so each test gets its own module state."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture()
def load_example():
    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"{name}_under_test", EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
