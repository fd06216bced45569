"""Fixtures for the compiler tests: a fresh tiny-model engine per test (compiles add adapters to it)."""

import pytest


@pytest.fixture
def engine(tiny_handle):
    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    eng = HFEngine(load_model("tiny"), batch_wait_s=0.02)
    yield eng
    eng.close()
