"""The policy: the trainer's side of a compile. One base model, its tokenizer, and named LoRA adapters on it.

Data model:
- ``handle``: the :class:`wfc.models.ModelHandle` of the base (its ``name`` and ``checksum`` identify the weights);
- ``model``: the base wrapped by peft once the first adapter exists (the base itself before that); adapters are keyed
  by name (the role path's adapter, see ``compilers.backends``); LoRA dropout stays 0 and the model stays in eval
  mode except inside :meth:`Policy.training`;
- ``lock``: an ``RLock`` held while weights change (and by a colocated engine while it generates), so no reader
  ever sees a half-updated adapter;
- ``revision(name)``: an int per adapter, 1 when it is created or loaded, bumped by every change of its weights
  (an optimizer step, a rollback, a restore, a load). Engines receive adapters as :class:`AdapterRevision`\\ s
  (:meth:`Policy.export`), so a revision number names one exact set of tensors;
- ``device`` / ``dtype``: where the weights live. ``device="auto"`` is CUDA when ``torch.cuda.is_available()``, else
  the CPU; on CUDA, :meth:`Policy.autocast` runs training under bf16 autocast (a no-op on the CPU).

Engines only generate (``wfc.engines``): an in-process :class:`~wfc.engines.hf.HFEngine` may share this policy's
model (colocated); every other engine holds its own copy of the base and gets adapter weights only, through
``Engine.load_adapters(policy.export(names))``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterable, Mapping

import torch

from wfc.attention import use_gqa_sdpa
from wfc.constrain import GrammarMasks
from wfc.engines.base import AdapterRevision
from wfc.models import ModelHandle, load_model

DTYPES = ("float32", "bfloat16", "float16")


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> ``cuda`` when available, else ``cpu``; ``"cpu"``, ``"cuda"``, ``"cuda:N"`` as given.
    ValueError (saying what to pass) for anything else or for CUDA on a machine without it."""
    text = str(device)
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    ok = text == "cpu" or text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit())
    if not ok:
        raise ValueError(f"device={text!r} is not a device: pass 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if text.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={text!r} but CUDA is not available here: pass device='cpu' (or 'auto')")
        if ":" in text and int(text[5:]) >= torch.cuda.device_count():
            raise ValueError(f"device={text!r} but this machine has {torch.cuda.device_count()} CUDA device(s): "
                             f"pass cuda:0 .. cuda:{torch.cuda.device_count() - 1}")
    if text == "cuda":  # one spelling per device: "cuda" and "cuda:0" compare equal after this
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(text)


def _resolve_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported for the policy's weights: use one of {DTYPES}")
    return getattr(torch, dtype)


def peft_adapter_state(model, name: str) -> dict[str, torch.Tensor]:
    """A CPU copy of one adapter's weights of a peft ``model`` (peft's own keying, adapter name stripped)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(model, adapter_name=name).items()}


def peft_restore_adapter(model, name: str, state: Mapping[str, torch.Tensor]) -> None:
    """Write ``state`` (from :func:`peft_adapter_state`) back into adapter ``name`` of ``model`` exactly."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, dict(state), adapter_name=name)
    unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if unexpected:
        raise ValueError(f"adapter {name!r}: unexpected weights {unexpected[:3]}: the state belongs to another "
                         "adapter configuration (other rank or target modules)")


class Policy:
    """``Policy(model="smollm2-135m", *, device="auto", dtype="float32", gradient_checkpointing=False)``.

    ``model``: a name for :func:`wfc.models.load_model` or a loaded :class:`~wfc.models.ModelHandle` (used as it is:
    moved to ``device`` and cast to ``dtype``; adapters are added to that very model)."""

    def __init__(self, model: str | ModelHandle = "smollm2-135m", *, device: str = "auto", dtype: str = "float32",
                 gradient_checkpointing: bool = False):
        self.device = resolve_device(device)
        self.dtype = _resolve_dtype(dtype)
        self.handle = model if isinstance(model, ModelHandle) else load_model(model, dtype=dtype)
        self.tokenizer = self.handle.tokenizer
        self.model: Any = self.handle.model
        if any(p.device != self.device or p.dtype != self.dtype for p in self.model.parameters()):
            self.model.to(device=self.device, dtype=self.dtype)
        # on the CPU, grouped key/value heads broadcast inside SDPA rather than copied per layer: same outputs,
        # faster decode (wfc/attention.py)
        use_gqa_sdpa(self.model, self.device)
        self.gradient_checkpointing = False
        if gradient_checkpointing:
            self.enable_gradient_checkpointing()
        self.lock = threading.RLock()
        self._revisions: dict[str, int] = {}
        self._grammar_masks: GrammarMasks | None = None

    @property
    def grammar_masks(self) -> GrammarMasks:
        """Grammar masks over this policy's tokenizer (``wfc.constrain``), built on first use: the one set the
        colocated engine samples under and the trainer replays."""
        with self.lock:
            if self._grammar_masks is None:
                self._grammar_masks = GrammarMasks(self.tokenizer)
            return self._grammar_masks

    def __repr__(self) -> str:
        return f"Policy({self.handle.name!r}, device={str(self.device)!r}, adapters={self.adapters})"

    # ----- adapters -------------------------------------------------------------------------------------------
    @property
    def is_peft(self) -> bool:
        return hasattr(self.model, "peft_config")

    @property
    def base_model(self):
        """The underlying transformers model (without the peft wrapper)."""
        return self.model.get_base_model() if self.is_peft else self.model

    @property
    def adapters(self) -> list[str]:
        return list(self.model.peft_config) if self.is_peft else []

    def _check(self, name: str) -> None:
        if name not in self.adapters:
            raise ValueError(f"unknown adapter {name!r}; this policy has {self.adapters or 'none'}: add it first")

    def add_adapter(self, name: str, lora_config) -> None:
        """Create a fresh LoRA adapter ``name`` (revision 1) on the base model."""
        from peft import get_peft_model

        with self.lock:
            if name in self.adapters:
                raise ValueError(f"adapter {name!r} already exists; pick another name or delete it first")
            if self.is_peft:
                self.model.add_adapter(name, lora_config)
            else:
                self.model = get_peft_model(self.model, lora_config, adapter_name=name)
            self.model.to(self.device)
            self.model.eval()  # mixed-adapter batches refuse training mode; LoRA dropout stays 0
            self._revisions[name] = 1

    def load_adapter(self, name: str, path: str) -> None:
        """Load a saved PEFT adapter directory as adapter ``name`` (replacing one of that name; a new revision)."""
        from peft import PeftModel

        with self.lock:
            if self.is_peft:
                if name in self.adapters:
                    self.model.delete_adapter(name)
                self.model.load_adapter(path, adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
            self.model.to(self.device)
            self.model.eval()
            self._revisions[name] = self._revisions.get(name, 0) + 1

    def delete_adapter(self, name: str) -> None:
        with self.lock:
            self._check(name)
            self.model.delete_adapter(name)
            self._revisions.pop(name, None)

    def lora_config(self, name: str):
        """The peft ``LoraConfig`` of adapter ``name``."""
        self._check(name)
        return self.model.peft_config[name]

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """CPU clones of adapter ``name``'s tensors (peft state-dict keys, as ``get_peft_model_state_dict``)."""
        self._check(name)
        with self.lock:
            return peft_adapter_state(self.model, name)

    def restore_adapter(self, name: str, state: Mapping[str, torch.Tensor]) -> None:
        """Write ``state`` (from :meth:`adapter_state`) back into adapter ``name`` exactly; a new revision."""
        self._check(name)
        with self.lock:
            peft_restore_adapter(self.model, name, state)
            self.mark_changed(name)

    def mark_changed(self, name: str) -> int:
        """Record that adapter ``name``'s weights changed (the optimizer stepped): bump and return its revision."""
        with self.lock:
            self._check(name)
            self._revisions[name] = self._revisions.get(name, 0) + 1
            return self._revisions[name]

    def revision(self, name: str) -> int:
        self._check(name)
        return self._revisions.get(name, 1)

    def export(self, names: Iterable[str] | None = None) -> list[AdapterRevision]:
        """The current revision of each adapter in ``names`` (default all): name, revision, config, CPU tensors.
        Read under the lock: a revision is never half-updated."""
        with self.lock:
            return [AdapterRevision(name=n, revision=self.revision(n), config=self.lora_config(n),
                                    tensors=peft_adapter_state(self.model, n))
                    for n in (self.adapters if names is None else list(names))]

    # ----- training -------------------------------------------------------------------------------------------
    def autocast(self):
        """bf16 autocast on CUDA; a no-op context on the CPU (fp32 there)."""
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def enable_gradient_checkpointing(self) -> None:
        """Recompute each layer's activations in backward instead of keeping them (less memory, slower update).
        Active only in training mode (see :meth:`training`), so rollouts and evaluation are unchanged; non-reentrant,
        so the inputs need no gradients."""
        if not self.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.gradient_checkpointing = True

    @contextlib.contextmanager
    def training(self):
        """Hold the lock and autocast while weights change; with gradient checkpointing, training mode (which is
        what makes transformers checkpoint), eval mode again after."""
        with self.lock, self.autocast():
            if self.gradient_checkpointing:
                self.model.train()
            try:
                yield self.model
            finally:
                self.model.eval()
