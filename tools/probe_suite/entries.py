"""Suite entries: the key order of an emitted entry, the base problem, descriptive names, and the
ordered, de-duplicated collection the families add to."""

from __future__ import annotations

import dataclasses
from typing import Any

from fusedattn_select.config import AttnConfig
from fusedattn_select.dtypes import FP8_DTYPES
from tools.probe_suite.checks import ConfigProblem

# Key order of an emitted entry: the suite's reading order, not AttnConfig's field order. It
# must name every AttnConfig field (asserted below).
FIELDS = (
    "batch_size", "num_heads_q", "num_heads_kv", "seqlen_q", "seqlen_kv", "head_dim_qk",
    "head_dim_v", "qkv_dtype", "o_dtype", "do_dtype", "dqkv_dtype", "scaling_mode",
    "qkv_layout", "o_format", "do_format", "dqkv_layout", "page_size", "num_pages", "mask",
    "window_size", "bottom_right_diagonal", "bias", "bias_shape", "softmax", "dropout",
    "attn_scale", "is_training", "deterministic", "cuda_graph", "return_max_logit",
)
_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(AttnConfig)}
REQUIRED = tuple(name for name, default in _FIELD_DEFAULTS.items() if default is dataclasses.MISSING)
# AttnConfig defaults of the optional fields (an entry may leave these out), as YAML data:
# tuple defaults (window_size) as lists.
OPTIONAL_DEFAULTS: dict[str, Any] = {
    name: list(default) if isinstance(default, tuple) else default
    for name, default in _FIELD_DEFAULTS.items() if default is not dataclasses.MISSING
}
assert set(FIELDS) == set(_FIELD_DEFAULTS), "FIELDS must list every AttnConfig field"


BASE: dict[str, Any] = {
    "batch_size": 2, "num_heads_q": 16, "num_heads_kv": 16, "seqlen_q": 512, "seqlen_kv": 512,
    "head_dim_qk": 128, "qkv_dtype": "bf16", "qkv_layout": "bshd_bshd_bshd", "mask": "causal",
    "is_training": True,
}

DTYPE_TAG = {"fp16": "fp16", "bf16": "bf16", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}
MASK_TAG = {
    "no_mask": "nomask", "padding": "pad", "causal": "causal", "padding_causal": "padcausal",
    "causal_bottom_right": "causalbr", "padding_causal_bottom_right": "padcausalbr",
}
LAYOUT_TAG = {
    "bshd_bshd_bshd": None, "sbhd_sbhd_sbhd": "sbhd", "bhsd_bhsd_bhsd": "bhsd",
    "thd_thd_thd": "thd",
}


def _layout_tag(layout: str) -> str:
    if layout in LAYOUT_TAG:
        return LAYOUT_TAG[layout] or "bshd"
    if layout.startswith("paged_kv_"):
        rest = layout[len("paged_kv_"):]
        return "paged-" + ("bshd" if rest == "bshd_bshd_bshd" else rest.replace("_", "-"))
    return layout.replace("_", "-")


def _window_tag(window: list[int]) -> str:
    return "win" + "-".join("inf" if w < 0 else str(w) for w in window)


def _num(value: float) -> str:
    return format(value, "g")


def describe(cfg: dict[str, Any]) -> str:
    """A descriptive name that encodes every field differing from BASE (so names are unique)."""
    parts: list[str] = []
    dtype = cfg["qkv_dtype"]
    parts.append(("fp8" + DTYPE_TAG[dtype]) if dtype in FP8_DTYPES else dtype)
    if "scaling_mode" in cfg:
        parts.append(cfg["scaling_mode"])
    for key, tag in (("o_dtype", "o"), ("do_dtype", "do"), ("dqkv_dtype", "dqkv")):
        if key in cfg:
            parts.append(tag + DTYPE_TAG[cfg[key]])
    qk, v = cfg["head_dim_qk"], cfg.get("head_dim_v", cfg["head_dim_qk"])
    parts.append(f"d{qk}" if v == qk else f"d{qk}v{v}")
    parts.append(MASK_TAG[cfg["mask"]])
    if "window_size" in cfg:
        parts.append(_window_tag(cfg["window_size"]))
    if "bottom_right_diagonal" in cfg:
        parts.append("brdiag" if cfg["bottom_right_diagonal"] else "tldiag")
    hq, hkv = cfg["num_heads_q"], cfg["num_heads_kv"]
    if hq != BASE["num_heads_q"]:
        parts.append(f"h{hq}")
    parts.append("mha" if hq == hkv else "mqa" if hkv == 1 else f"gqa{hq // hkv}")
    if cfg["qkv_layout"] != BASE["qkv_layout"]:
        parts.append(_layout_tag(cfg["qkv_layout"]))
    if "page_size" in cfg:
        parts.append(f"pg{cfg['page_size']}x{cfg['num_pages']}")
    for key, tag in (("o_format", "o"), ("do_format", "do")):
        if key in cfg:
            parts.append(tag + cfg[key])
    if "dqkv_layout" in cfg:
        parts.append("dqkv-" + _layout_tag(cfg["dqkv_layout"]))
    sq, skv = cfg["seqlen_q"], cfg["seqlen_kv"]
    if sq != skv:
        parts.append(f"q{sq}-kv{skv}")
    elif sq != BASE["seqlen_q"]:
        parts.append(f"s{sq}")
    if cfg["batch_size"] != BASE["batch_size"]:
        parts.append(f"b{cfg['batch_size']}")
    bias = cfg.get("bias", "no_bias")
    if bias == "post_scale_bias":
        parts.append("postbias-" + cfg["bias_shape"])
    elif bias == "pre_scale_bias":
        parts.append("prebias")
    elif bias == "alibi":
        parts.append("alibi")
    softmax = cfg.get("softmax", "vanilla")
    if softmax != "vanilla":
        parts.append({"off_by_one": "offbyone", "learnable": "learnsink"}[softmax])
    if "dropout" in cfg:
        parts.append("drop" + _num(cfg["dropout"]))
    if "attn_scale" in cfg:
        parts.append("scale" + _num(cfg["attn_scale"]))
    if cfg.get("deterministic"):
        parts.append("det")
    if cfg.get("cuda_graph"):
        parts.append("cudagraph")
    if cfg.get("return_max_logit"):
        parts.append("maxlogit")
    parts.append("train" if cfg["is_training"] else "infer")
    return "-".join(parts)


def make(**changes: Any) -> dict[str, Any]:
    """BASE with ``changes``; optional fields equal to their AttnConfig default are left out."""
    cfg = {**BASE, **changes}
    out: dict[str, Any] = {}
    for key in FIELDS:
        if key not in cfg:
            continue
        value = cfg[key]
        if key in ("window_size",) and value is not None:
            value = list(value)
        if key == "head_dim_v":
            out[key] = value  # always explicit when given
            continue
        if key not in REQUIRED and key not in BASE and value == OPTIONAL_DEFAULTS[key]:
            continue
        out[key] = value
    out.setdefault("head_dim_v", out["head_dim_qk"])
    # keep canonical order after setdefault
    return {key: out[key] for key in FIELDS if key in out}


def paged(batch: int, seqlen_kv: int, page_size: int = 64) -> dict[str, int]:
    """page_size and a num_pages that holds every sequence's KV cache."""
    return {"page_size": page_size, "num_pages": batch * -(-seqlen_kv // page_size)}


class Suite:
    """Ordered, de-duplicated configs; each config is tagged with the section that added it."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self.section_of: dict[str, str] = {}
        self.section = ""
        self.duplicates = 0

    def add(self, **changes: Any) -> None:
        cfg = make(**changes)
        name = describe(cfg)
        if name in self.entries:
            if self.entries[name] != cfg:
                raise ConfigProblem(f"name {name!r} describes two different configs")
            self.duplicates += 1
            return
        self.entries[name] = cfg
        self.section_of[name] = self.section
