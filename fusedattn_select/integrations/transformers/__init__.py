"""Hugging Face transformers integration: `attn_implementation="fusedattn"`, and per-layer reports.

Use::

    from fusedattn_select.integrations.transformers import register
    register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fusedattn")
    register(model=model)  # optional: build its bucket plans ahead, in the background

`register()` adds two functions to transformers under the name "fusedattn":

- a mask function (`fusedattn_mask`, mask_interface.py) that describes the model's mask the way
  cuDNN does, as a `CudnnMask` (masks.py: mask kind, window, per-sequence lengths), instead of
  materialising a dense (B, 1, Sq, Skv) tensor, whenever it can show that description is exact;
  where transformers asks for a tensor (models that edit their mask) it returns the "sdpa" mask
  tagged with that description; otherwise it returns what transformers' "sdpa" mask function
  returns, and logs why once;
- an attention function (`fusedattn_attention`, attention.py) that runs
  `fusedattn_select.runtime.api.attention` for a `CudnnMask`, a tagged tensor the model did not
  change, or a decode step's dense mask (its one row as an additive bias) and, for any other dense
  mask, does what attn_implementation="sdpa" does.

What falls back to the dense "sdpa" mask and torch SDPA, logged once with the reason: packed
sequences, chunked attention over a chunk of keys or more (below that it is plain causal),
image-token overlays, holes in the 2D mask, a 2D mask under torch.compile, a mask the model made or
changed.

`report()` / `format_report()` (report.py) and `configs_from_hf()` / `layer_problems()`
(problems.py) read a model config with one JSON reader (model_reading.py) that needs neither torch
nor transformers; a transformers config or model is read through its to_dict().
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fusedattn_select.errors import ConfigError

if TYPE_CHECKING:
    from fusedattn_select.integrations.transformers.attention import fusedattn_attention
    from fusedattn_select.integrations.transformers.mask_interface import fusedattn_mask
    from fusedattn_select.integrations.transformers.masks import CudnnMask, MaskNotExpressible, cudnn_mask
    from fusedattn_select.integrations.transformers.problems import (
        ATTENTION_LAYER_TYPES,
        DEFAULT_REPORT_SEQLEN,
        SINK_MODEL_TYPES,
        configs_from_hf,
        layer_problems,
    )

# report.py's names are bound here at import: its function `report` shares the module's name, which
# importing the submodule (cli/problem_input does) would otherwise bind on this package instead.
from fusedattn_select.integrations.transformers.report import LayerReport, format_report, report

# The other public names and the module each lives in, imported on first use: reading a config.json
# (`why --hf-config`) needs problems.py and its reader only, not the attention and mask functions.
_LAZY = {
    "fusedattn_attention": "attention", "fusedattn_mask": "mask_interface", "CudnnMask": "masks",
    "MaskNotExpressible": "masks", "cudnn_mask": "masks", "ATTENTION_LAYER_TYPES": "problems",
    "DEFAULT_REPORT_SEQLEN": "problems", "SINK_MODEL_TYPES": "problems", "configs_from_hf": "problems",
    "layer_problems": "problems",
}


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


ATTN_IMPLEMENTATION = "fusedattn"

__all__ = [
    "ATTENTION_LAYER_TYPES",
    "ATTN_IMPLEMENTATION",
    "CudnnMask",
    "DEFAULT_REPORT_SEQLEN",
    "LayerReport",
    "MaskNotExpressible",
    "SINK_MODEL_TYPES",
    "configs_from_hf",
    "cudnn_mask",
    "format_report",
    "fusedattn_attention",
    "fusedattn_mask",
    "layer_problems",
    "register",
    "report",
]


def _start_early() -> None:
    """Let the runtime make its selector in the background while the caller loads its model (see
    runtime/tiers.start_early), on a machine with a GPU."""
    import torch

    if torch.cuda.is_available():
        from fusedattn_select.runtime import tiers

        tiers.start_early()


def _builtin_names() -> list[str]:
    """The attention implementations transformers ships: "eager" and every name its attention and
    mask interfaces map to one of its own functions (a name registered earlier by anyone else is not
    one of them)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    # "eager" has no entry in the attention interface: the models' own code runs it, and
    # transformers checks attn_implementation against "eager" plus the interface's keys.
    names = {"eager"}
    for interface in (AttentionInterface(), AttentionMaskInterface()):
        names.update(key for key, function in interface.items()
                     if str(getattr(function, "__module__", "")).startswith("transformers."))
    return sorted(names)


# Parts of a name that make transformers read it as something other than a registered function
# (modeling_utils, transformers 5.24): "paged|x" is x with a deprecated prefix, "org/repo" a kernel
# from the Hub, and a name holding "flash", "sdpa" or "flex_attention" is checked as that
# implementation (a "flash" name also has flash-attention kernels loaded for it).
_READ_AS = (("paged|", "a deprecated prefix, which it removes"), ("/", "a kernel to load from the Hub"),
            ("flash", "a flash attention implementation, whose kernels it loads"),
            ("sdpa", "a request for sdpa, which it checks the model supports"),
            ("flex_attention", "a request for flex attention, which it checks the model supports"))


def _check_name(name: Any) -> None:
    """ConfigError unless `name` can be registered: a non-empty string that names none of
    transformers' own implementations and that transformers does not read as something else."""
    if not isinstance(name, str) or not name:
        raise ConfigError("name", name, f"must be a non-empty string (the attn_implementation to register; "
                                        f"default {ATTN_IMPLEMENTATION!r})")
    builtin = _builtin_names()
    if name in builtin:
        raise ConfigError("name", name, "is one of transformers' own attention implementations, which registering "
                                        "would replace for every model in this process; choose another name "
                                        f"(default {ATTN_IMPLEMENTATION!r}), not one of "
                                        + ", ".join(repr(b) for b in builtin))
    for part, reading in _READ_AS:
        if part in name:
            raise ConfigError("name", name, f"transformers reads a name holding {part!r} as {reading}; "
                                            f"choose another name (default {ATTN_IMPLEMENTATION!r})")


def register(name: str = ATTN_IMPLEMENTATION, *, model: Any = None, max_batch: int | None = None,
             max_length: int | None = None, training: bool | None = None) -> str:
    """Register the "fusedattn" attention and mask functions with transformers; returns the name.

    Idempotent. Afterwards `attn_implementation=name` works in `from_pretrained` / `from_config` /
    `model.set_attn_implementation`. It also imports, once, everything the two functions call:
    nothing may be imported inside a model that torch.compile traces. On a machine with a GPU it
    starts making the runtime's selector in the background (runtime/tiers.start_early). `name` is a
    non-empty string that is none of transformers' own implementations ("eager", "sdpa", ...).

    With `model` (a model, its config, or a config.json source) it also queues the model's bucket
    plans to be built ahead in the background worker (build_ahead.py: batch sizes up to `max_batch`,
    default 1, lengths up to `max_length`, default the model's max_position_embeddings; `training`
    default: the model's own mode, inference for a config), and returns without waiting for them.
    `max_batch`, `max_length` and `training` apply only with `model`: given without it, they are a
    ConfigError. Every argument is checked before anything is registered.
    """
    from transformers import AttentionInterface  # optional dependency
    from transformers.masking_utils import AttentionMaskInterface

    from fusedattn_select.integrations.transformers.attention import fusedattn_attention
    from fusedattn_select.integrations.transformers.build_ahead import check_arguments, queue_model
    from fusedattn_select.integrations.transformers.config_json import config_data
    from fusedattn_select.integrations.transformers.dependencies import load
    from fusedattn_select.integrations.transformers.mask_interface import fusedattn_mask

    _check_name(name)
    given = {"max_batch": max_batch, "max_length": max_length, "training": training}
    max_batch = 1 if max_batch is None else max_batch
    check_arguments(max_batch, max_length, training)
    if model is None:
        for field, value in given.items():
            if value is not None:
                raise ConfigError(field, value, "applies only with model= (the model whose bucket plans "
                                                "register builds ahead); give model=, or leave it out")
    else:
        config_data(model)
    load()
    AttentionInterface.register(name, fusedattn_attention)
    AttentionMaskInterface.register(name, fusedattn_mask)
    _start_early()
    if model is not None:
        queue_model(model, max_batch=max_batch, max_length=max_length, training=training)
    return name
