"""The model registry: the tiny model loads and is the same everywhere; unknown names fail with a helpful message."""

from __future__ import annotations

import re

import pytest
import torch

from wfc import models
from wfc.models import ModelNotFoundError, load_model


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tiny_loads(tiny_handle):
    model, tok = tiny_handle.model, tiny_handle.tokenizer
    assert tiny_handle.name == "tiny" and tiny_handle.path is not None
    assert re.fullmatch(r"[0-9a-f]{64}", tiny_handle.checksum)
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == len(tok)
    assert tok.padding_side == "left" and tok.pad_token is not None


def test_tiny_is_deterministic(tiny_handle):
    again = load_model("tiny")
    assert again.checksum == tiny_handle.checksum
    assert _same_weights(again.model, tiny_handle.model)


def test_tiny_rebuilds_bit_identical_from_its_seed(tmp_path, monkeypatch, tiny_handle):
    """A fresh cache builds the same weights (fixed seed) and leaves the caller's RNG alone."""
    tokenizer_source = models.smollm2_dir()  # reuse the converted SmolLM2 (tokenizer source) instead of re-converting
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "smollm2-135m").symlink_to(tokenizer_source, target_is_directory=True)
    monkeypatch.setenv("WFC_CACHE_DIR", str(tmp_path))
    rng_before = torch.get_rng_state()
    fresh = load_model("tiny")
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert fresh.path == str(tmp_path / "models" / f"tiny-v{models.TINY_VERSION}")
    assert _same_weights(fresh.model, tiny_handle.model)


def test_unknown_model_names_the_builtins():
    with pytest.raises(ModelNotFoundError) as info:
        load_model("no-such-model")
    message = str(info.value)
    assert "no-such-model" in message and "tiny" in message and "smollm2-135m" in message
    assert isinstance(info.value, ValueError)  # callers that catch ValueError catch it too


def test_bad_model_arguments(tmp_path):
    with pytest.raises(ModelNotFoundError, match="non-empty string"):
        load_model("")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_model(str(tmp_path))
