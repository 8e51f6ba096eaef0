"""The problems the benchmark measures: config files of configs/, and which entries dispatch runs.

The library is imported inside the functions: a worker's first import of it is part of what the
warm-start section times.
"""

from __future__ import annotations

from typing import Any, Sequence

from tools.bench.common import ROOT


def load_file(stem: str) -> Any:
    """configs/<stem>.yaml as a fusedattn_select ConfigFile."""
    from fusedattn_select.config_files import load_config_file

    return load_config_file(ROOT / "configs" / f"{stem}.yaml")


def dispatch_format(qkv_layout: str) -> str | None:
    """The dim order ("bshd", "sbhd", "bhsd") of q, k and v for a layout of three separate tensors
    in one format, the ones the benchmark hands attention() and torch SDPA; None for the others."""
    from fusedattn_select.layouts import LAYOUTS, SEPARATE_LAYOUTS

    layout = LAYOUTS.get(qkv_layout)
    if qkv_layout not in SEPARATE_LAYOUTS or layout.q_format != layout.kv_format:
        return None
    return layout.q_format


def dispatch_eligible(cfg: Any) -> bool:
    """F16 training problems attention() and torch SDPA both take as plain tensors."""
    return (
        getattr(cfg, "is_training", False)
        and cfg.qkv_dtype in ("fp16", "bf16")
        and dispatch_format(cfg.qkv_layout) is not None
        and cfg.mask in ("no_mask", "causal")
        and not cfg.dropout
        and not cfg.deterministic
        and cfg.bias == "no_bias"
        and cfg.softmax == "vanilla"
        and not getattr(cfg, "return_max_logit", False)
    )


def pick_dispatch_entries(entries: Sequence[Any], per_file: int) -> list[Any]:
    """The first `per_file` eligible training entries (NamedConfig-like: .name, .config)."""
    return [e for e in entries if dispatch_eligible(e.config)][:per_file]


def attention_kwargs(cfg: Any, layout: str) -> dict:
    """The keyword arguments of attention() for `cfg` with tensors in `layout`'s dim order."""
    kwargs: dict[str, Any] = {"layout": layout, "mask": cfg.mask}
    if tuple(cfg.window_size) != (-1, -1):
        kwargs["window_size"] = tuple(cfg.window_size)
    if cfg.attn_scale is not None:
        kwargs["attn_scale"] = cfg.attn_scale
    return kwargs
