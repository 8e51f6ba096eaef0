#!/usr/bin/env python3
"""Generate the Hopper cuDNN fused-attention probe suite.

Writes ``probes/hopper-suite.yaml`` (every config) and ``probes/hopper-suite-sample.yaml``
(every 10th config, for quick GPU agreement tests) in the config-file format of ``configs/``:
``name``/``description``/``source``/``configs``. Each entry is complete (no ``defaults``), so a
suite entry can be copied anywhere on its own.

The generator is deterministic: no randomness, no clock, no environment; running it twice writes
byte-identical files. It needs PyYAML and the ``fusedattn_select`` package of this checkout (its
AttnConfig vocabulary and validation). Before writing, every entry is built with
``AttnConfig.from_dict`` and checked against the few suite rules the library does not make
(``check_suite_rules``), and names and configs are checked to be unique; a violation aborts
without writing anything.

Usage::

    python3 tools/gen_probe_suite.py                 # write probes/hopper-suite*.yaml
    python3 tools/gen_probe_suite.py --check         # generate + check, write nothing
    python3 tools/gen_probe_suite.py --check-configs configs/*.yaml
                                                     # check hand-written model files too

Sizes are kept modest (batch 2, 8-16 heads, sequence lengths 128-2048, decode seqlen_q 1) because
every config is probed on a GPU (a few ms each).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

ROOT = Path(__file__).resolve().parent.parent
# Run as `python3 tools/gen_probe_suite.py`, Python puts tools/ on sys.path, not the repo root: where
# fusedattn_select is not installed, the package beside tools/ would not be found. The generator
# needs it (the AttnConfig vocabulary and validation), so it falls back to this checkout's copy.
if importlib.util.find_spec("fusedattn_select") is None:
    sys.path.insert(0, str(ROOT))

from fusedattn_select.config import BIAS_SHAPES, MASKS, AttnConfig  # noqa: E402 - after the sys.path fallback above
from fusedattn_select.config_files import (  # noqa: E402
    ConfigFile,
    NamedConfig,
    load_config_file,
    parse_config_file,
)
from fusedattn_select.dtypes import FP8_DTYPES  # noqa: E402
from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.layouts import LAYOUTS  # noqa: E402

SUITE_PATH = ROOT / "probes" / "hopper-suite.yaml"
SAMPLE_PATH = ROOT / "probes" / "hopper-suite-sample.yaml"
SAMPLE_EVERY = 10
MIN_CONFIGS = 320

# ----- the AttnConfig vocabulary (fusedattn_select.config) ---------------------------------
NON_PAGED_LAYOUTS = tuple(name for name, layout in LAYOUTS.items() if not layout.paged)
PAGED_LAYOUTS = tuple(name for name, layout in LAYOUTS.items() if layout.paged)

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


# ----- constraint check ---------------------------------------------------------------------
# AttnConfig.from_dict (and parse_config_file for whole files) makes every AttnConfig check;
# this section adds only the rules the library does not make.
class ConfigProblem(ValueError):
    pass


def _fail(where: str, message: str) -> None:
    raise ConfigProblem(f"{where}: {message}")


def check_suite_rules(cfg: AttnConfig, where: str) -> None:
    """Raise ConfigProblem where a valid AttnConfig breaks a rule of this suite."""
    if cfg.layout.paged:
        needed = cfg.batch_size * -(-cfg.seqlen_kv // cfg.page_size)
        if cfg.num_pages < needed:
            _fail(where, f"num_pages={cfg.num_pages} < batch * ceil(seqlen_kv / page_size) = {needed}")
    if cfg.do_format is not None and (cfg.do_format == "thd") != (cfg.q_format == "thd"):
        _fail(where, f"do_format={cfg.do_format} must be thd exactly when Q is THD")
    if cfg.is_fp8 and cfg.scaling_mode is None:
        # This suite always names the FP8 recipe explicitly.
        _fail(where, "FP8 configs in this suite name their scaling_mode")


def check_entry(name: str, fields: Mapping[str, Any]) -> AttnConfig:
    """The AttnConfig of one generated entry (``fields`` without ``name``); ConfigProblem naming
    the entry unless it is valid and keeps the suite rules."""
    try:
        cfg = AttnConfig.from_dict(fields)
    except ConfigError as err:
        raise ConfigProblem(f"{name}: {err}") from None
    check_suite_rules(cfg, name)
    return cfg


def check_unique(entries: Iterable[NamedConfig], where: str) -> None:
    """Names are unique, and no two entries are the same problem (equal cache keys)."""
    names: set[str] = set()
    keys: dict[str, str] = {}
    for entry in entries:
        if entry.name in names:
            _fail(where, f"duplicate entry name {entry.name!r}")
        names.add(entry.name)
        key = entry.config.cache_key()
        if key in keys:
            _fail(where, f"entries {keys[key]!r} and {entry.name!r} are the same config")
        keys[key] = entry.name


def check_file(config_file: ConfigFile) -> None:
    """The checks a parsed config file needs beyond parse_config_file's."""
    where = config_file.path
    for key in ("description", "source"):
        if not getattr(config_file, key):
            _fail(where, f"top-level {key!r} must be a non-empty string")
    for entry in config_file.entries:
        check_suite_rules(entry.config, f"{where}: {entry.name}")
    check_unique(config_file.entries, where)


def check_config_file(path: Path) -> int:
    """Check a configs/*.yaml (or probes/*.yaml) file; return its number of entries."""
    try:
        config_file = load_config_file(path)
    except ConfigError as err:
        raise ConfigProblem(str(err)) from None
    check_file(config_file)
    return len(config_file.entries)


# ----- config construction ------------------------------------------------------------------
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


TRAIN_INFER = (True, False)
HEAD_DIMS_EQUAL = (32, 48, 60, 64, 72, 80, 96, 128, 160, 192, 256)
# (head_dim_qk, head_dim_v) pairs with head_dim_v != head_dim_qk, or beyond 256.
HEAD_DIMS_MIXED = (
    (192, 128),  # DeepSeek MLA (nope 128 + rope 64, v 128)
    (160, 128), (96, 128), (64, 128), (128, 64), (128, 256), (256, 128),
    (320, 320), (256, 320), (512, 512), (576, 512),  # 576/512: MLA absorbed (latent 512 + rope 64)
)


def build() -> Suite:
    s = Suite()

    # --- head dims (bf16 and fp16; causal and no_mask; training and inference) ----------------
    s.section = "head_dims"
    for d in HEAD_DIMS_EQUAL:
        for train in TRAIN_INFER:
            s.add(head_dim_qk=d, head_dim_v=d, is_training=train)
        s.add(head_dim_qk=d, head_dim_v=d, mask="no_mask", is_training=True)
        s.add(head_dim_qk=d, head_dim_v=d, qkv_dtype="fp16", is_training=True)
    for qk, v in HEAD_DIMS_MIXED:
        for train in TRAIN_INFER:
            s.add(head_dim_qk=qk, head_dim_v=v, is_training=train)
        s.add(head_dim_qk=qk, head_dim_v=v, mask="no_mask", is_training=True)
        s.add(head_dim_qk=qk, head_dim_v=v, qkv_dtype="fp16", is_training=True)

    # --- GQA / MQA ratios ----------------------------------------------------------------------
    s.section = "gqa"
    for hkv in (16, 8, 4, 2, 1):
        for train in TRAIN_INFER:
            s.add(num_heads_kv=hkv, is_training=train)
        for d in (64, 256):
            s.add(num_heads_kv=hkv, head_dim_qk=d, head_dim_v=d, is_training=True)
    for hq, hkvs in ((8, (8, 4, 1)), (12, (12, 4, 3, 1))):
        for hkv in hkvs:
            for train in TRAIN_INFER:
                s.add(num_heads_q=hq, num_heads_kv=hkv, head_dim_qk=64, head_dim_v=64, is_training=train)
    for hkv in (4, 1):
        s.add(num_heads_kv=hkv, qkv_dtype="fp16", is_training=True)
        s.add(num_heads_kv=hkv, mask="no_mask", is_training=True)
        s.add(num_heads_kv=hkv, mask="padding_causal", is_training=False)
    s.add(num_heads_kv=8, head_dim_qk=192, head_dim_v=128, is_training=True)

    # --- every mask ----------------------------------------------------------------------------
    s.section = "masks"
    for mask in MASKS:
        for train in TRAIN_INFER:
            s.add(mask=mask, is_training=train)
        s.add(mask=mask, head_dim_qk=64, head_dim_v=64, is_training=True)
        s.add(mask=mask, qkv_dtype="fp16", is_training=True)
        s.add(mask=mask, qkv_dtype="fp16", head_dim_qk=64, head_dim_v=64, is_training=False)
        s.add(mask=mask, num_heads_kv=4, is_training=True)
        s.add(mask=mask, head_dim_qk=256, head_dim_v=256, is_training=True)

    # --- seqlen_q != seqlen_kv (top-left vs bottom-right diagonals), decode --------------------
    s.section = "seqlens"
    for sq, skv, modes in ((128, 1024, TRAIN_INFER), (512, 2048, (True,)), (1024, 256, (False,))):
        for mask in MASKS:
            for train in modes:
                s.add(seqlen_q=sq, seqlen_kv=skv, mask=mask, num_heads_kv=4, is_training=train)
    for mask in ("causal_bottom_right", "padding_causal_bottom_right", "no_mask", "padding"):
        s.add(seqlen_q=1, seqlen_kv=2048, mask=mask, num_heads_kv=4, is_training=False)
    for skv in (1024, 129):
        for mask in ("causal_bottom_right", "padding_causal_bottom_right"):
            s.add(seqlen_q=1, seqlen_kv=skv, mask=mask, num_heads_kv=4, is_training=False)
    s.add(seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right", head_dim_qk=64, head_dim_v=64, is_training=False)
    s.add(seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right", head_dim_qk=256, head_dim_v=256, num_heads_kv=8, is_training=False)
    s.add(seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right", num_heads_kv=1, qkv_dtype="fp16", is_training=False)
    for train in TRAIN_INFER:
        s.add(seqlen_q=128, seqlen_kv=1024, mask="causal", bottom_right_diagonal=True, is_training=train)
        s.add(seqlen_q=128, seqlen_kv=1024, mask="causal_bottom_right", bottom_right_diagonal=True, is_training=train)
        s.add(seqlen_q=128, seqlen_kv=1024, mask="causal_bottom_right", qkv_dtype="fp16", is_training=train)
    for sq, skv in ((200, 1000), (1000, 1000), (2048, 2048), (128, 128), (333, 777)):
        for train in TRAIN_INFER:
            mask = "causal" if sq == skv else "causal_bottom_right"
            s.add(seqlen_q=sq, seqlen_kv=skv, mask=mask, is_training=train)
    s.add(batch_size=1, seqlen_q=2048, seqlen_kv=2048, is_training=True)
    s.add(batch_size=4, seqlen_q=1024, seqlen_kv=1024, num_heads_kv=4, is_training=True)

    # --- sliding windows -----------------------------------------------------------------------
    s.section = "windows"
    for left in (63, 127, 255, 511, 1023):
        for train in TRAIN_INFER:
            s.add(window_size=[left, 0], is_training=train)
    for train in TRAIN_INFER:
        s.add(window_size=[255, -1], is_training=train)
        s.add(window_size=[127, 0], head_dim_qk=64, head_dim_v=64, num_heads_kv=4, is_training=train)
        s.add(window_size=[255, 0], head_dim_qk=256, head_dim_v=256, num_heads_kv=8, is_training=train)
        s.add(window_size=[255, 0], seqlen_q=128, seqlen_kv=1024, mask="causal_bottom_right", is_training=train)
        s.add(window_size=[255, 0], mask="padding_causal", is_training=train)
        s.add(window_size=[255, 0], seqlen_q=256, seqlen_kv=1024, mask="padding_causal_bottom_right", is_training=train)
        s.add(window_size=[1023, 0], seqlen_q=2048, seqlen_kv=2048, num_heads_kv=4, is_training=train)
        for window in ([128, 128], [128, -1], [-1, 128], [255, 0]):
            s.add(window_size=window, mask="no_mask", is_training=train)
        s.add(window_size=[128, 128], mask="padding", is_training=train)
        s.add(window_size=[128, 128], mask="no_mask", seqlen_q=128, seqlen_kv=1024, bottom_right_diagonal=True, is_training=train)
        s.add(window_size=[128, 128], mask="no_mask", seqlen_q=128, seqlen_kv=1024, bottom_right_diagonal=False, is_training=train)
    for window in ([64, 64], [256, 256], [0, 255]):
        s.add(window_size=window, mask="no_mask", is_training=True)
    s.add(window_size=[1023, 0], seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right", num_heads_kv=4, is_training=False)
    s.add(window_size=[511, 0], qkv_dtype="fp16", is_training=True)
    s.add(window_size=[128, 128], mask="no_mask", qkv_dtype="fp16", is_training=True)

    # --- layouts -------------------------------------------------------------------------------
    s.section = "layouts"
    main_layouts = (
        "sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd", "bs3hd", "sb3hd", "bshd_bs2hd", "sbhd_bshd_bshd",
        "thd_thd_thd",
    )
    for layout in NON_PAGED_LAYOUTS:
        ragged = LAYOUTS[layout].ragged
        packing = LAYOUTS[layout].packing
        mask = "padding_causal" if ragged else "causal"
        for train in TRAIN_INFER:
            s.add(qkv_layout=layout, mask=mask, is_training=train)
        if ragged:
            s.add(qkv_layout=layout, mask="padding", is_training=True)
        if packing not in ("3hd", "h3d"):
            s.add(qkv_layout=layout, mask=mask, num_heads_kv=4, is_training=True)
            s.add(qkv_layout=layout, seqlen_q=256, seqlen_kv=1024,
                  mask="padding_causal_bottom_right" if ragged else "causal_bottom_right", is_training=False)
        if layout in main_layouts:
            s.add(qkv_layout=layout, mask=mask, qkv_dtype="fp16", head_dim_qk=64, head_dim_v=64, is_training=True)
            s.add(qkv_layout=layout, mask="padding" if ragged else "no_mask", is_training=True)
    s.add(qkv_layout="thd_thd_thd", mask="padding_causal_bottom_right", seqlen_q=512, seqlen_kv=512, is_training=True)
    s.add(qkv_layout="thd_thd_thd", mask="padding_causal", window_size=[255, 0], is_training=True)
    s.add(qkv_layout="thd_thd_thd", mask="padding_causal", head_dim_qk=192, head_dim_v=128, is_training=True)
    # separate output / gradient formats and dQKV layouts
    s.add(qkv_layout="bshd_bshd_bshd", o_format="sbhd", is_training=True)
    s.add(qkv_layout="sbhd_sbhd_sbhd", o_format="bshd", do_format="bshd", is_training=True)
    s.add(qkv_layout="bhsd_bhsd_bhsd", o_format="bshd", is_training=False)
    s.add(qkv_layout="sbhd_bshd_bshd", o_format="bshd", is_training=True)
    s.add(qkv_layout="bshd_bshd_bshd", dqkv_layout="sbhd_sbhd_sbhd", is_training=True)
    s.add(qkv_layout="bs3hd", dqkv_layout="bshd_bshd_bshd", is_training=True)
    s.add(qkv_layout="thd_thd_thd", mask="padding_causal", o_format="thd", dqkv_layout="t3hd", is_training=True)
    # paged KV caches: inference only, padding masks
    for layout in PAGED_LAYOUTS:
        s.add(qkv_layout=layout, mask="padding_causal", num_heads_kv=4, is_training=False, **paged(2, 512))
        s.add(qkv_layout=layout, mask="padding_causal_bottom_right", seqlen_q=1, seqlen_kv=2048,
              num_heads_kv=4, is_training=False, **paged(2, 2048))
    for page_size in (16, 32, 128, 256):
        s.add(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding_causal_bottom_right", seqlen_q=1,
              seqlen_kv=2048, num_heads_kv=4, is_training=False, **paged(2, 2048, page_size))
    paged_decode = dict(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding_causal_bottom_right",
                        seqlen_q=1, seqlen_kv=2048, is_training=False, **paged(2, 2048))
    s.add(**paged_decode, head_dim_qk=64, head_dim_v=64)
    s.add(**paged_decode, head_dim_qk=256, head_dim_v=256, num_heads_kv=8)
    s.add(**paged_decode, num_heads_kv=1, qkv_dtype="fp16")
    s.add(**paged_decode, num_heads_kv=4, window_size=[1023, 0])
    s.add(**{**paged_decode, "mask": "padding"}, num_heads_kv=4)
    s.add(**{**paged_decode, "seqlen_q": 128}, num_heads_kv=4)  # chunked prefill
    s.add(**{**paged_decode, "num_pages": 128}, num_heads_kv=4)  # pool larger than needed
    s.add(**paged_decode, num_heads_kv=4, cuda_graph=True)

    # --- FP8 -----------------------------------------------------------------------------------
    s.section = "fp8"
    e4m3 = dict(qkv_dtype="fp8_e4m3")
    for mode in ("delayed", "current"):
        for d in (64, 128, 192, 256):
            for train in TRAIN_INFER:
                s.add(**e4m3, scaling_mode=mode, head_dim_qk=d, head_dim_v=d, is_training=train)
        for train in TRAIN_INFER:
            s.add(**e4m3, scaling_mode=mode, mask="no_mask", is_training=train)
            s.add(**e4m3, scaling_mode=mode, mask="padding_causal", is_training=train)
            s.add(**e4m3, scaling_mode=mode, num_heads_kv=4, is_training=train)
            s.add(qkv_dtype="fp8_e5m2", scaling_mode=mode, is_training=train)
        s.add(**e4m3, scaling_mode=mode, num_heads_kv=1, is_training=False)
        s.add(**e4m3, scaling_mode=mode, deterministic=True, is_training=True)
        s.add(**e4m3, scaling_mode=mode, head_dim_qk=192, head_dim_v=128, is_training=True)
        s.add(**e4m3, scaling_mode=mode, seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right",
              num_heads_kv=4, is_training=False)
    for train in TRAIN_INFER:
        s.add(**e4m3, scaling_mode="mxfp8", is_training=train)
        s.add(**e4m3, scaling_mode="current", window_size=[255, 0], is_training=train)
        s.add(**e4m3, scaling_mode="current", qkv_layout="thd_thd_thd", mask="padding_causal", is_training=train)
    s.add(**e4m3, scaling_mode="current", head_dim_qk=48, head_dim_v=48, is_training=True)
    s.add(**e4m3, scaling_mode="current", head_dim_qk=80, head_dim_v=80, is_training=True)
    # output and gradient dtypes
    s.add(**e4m3, scaling_mode="current", o_dtype="fp8_e4m3", is_training=True)  # FP8 MHA (fp8 O)
    s.add(**e4m3, scaling_mode="current", o_dtype="bf16", do_dtype="bf16", dqkv_dtype="bf16", is_training=True)
    s.add(**e4m3, scaling_mode="delayed", o_dtype="bf16", is_training=True)
    s.add(**e4m3, scaling_mode="delayed", dqkv_dtype="bf16", is_training=True)
    s.add(**e4m3, scaling_mode="delayed", o_dtype="fp16", is_training=False)
    s.add(**e4m3, scaling_mode="delayed", do_dtype="fp8_e4m3", is_training=True)
    # layouts, seqlens, features
    s.add(**e4m3, scaling_mode="delayed", qkv_layout="sbhd_sbhd_sbhd", is_training=True)
    s.add(**e4m3, scaling_mode="delayed", qkv_layout="bs3hd", is_training=True)
    s.add(**e4m3, scaling_mode="delayed", seqlen_q=256, seqlen_kv=1024, mask="causal_bottom_right", is_training=False)
    s.add(**e4m3, scaling_mode="delayed", seqlen_q=2048, seqlen_kv=2048, num_heads_kv=4, is_training=True)
    s.add(**e4m3, scaling_mode="current", dropout=0.1, is_training=True)
    s.add(**e4m3, scaling_mode="current", return_max_logit=True, is_training=True)
    s.add(**e4m3, scaling_mode="current", softmax="off_by_one", is_training=True)
    s.add(**e4m3, scaling_mode="delayed", **paged_decode, num_heads_kv=4)

    # --- deterministic backward ----------------------------------------------------------------
    s.section = "deterministic"
    for dtype in ("bf16", "fp16"):
        for d in (64, 128, 256):
            for mask in ("causal", "no_mask"):
                s.add(qkv_dtype=dtype, head_dim_qk=d, head_dim_v=d, mask=mask, deterministic=True)
    s.add(deterministic=True, num_heads_kv=4)
    s.add(deterministic=True, dropout=0.1)
    s.add(deterministic=True, bias="post_scale_bias", bias_shape="1hss", mask="no_mask")
    s.add(deterministic=True, window_size=[255, 0])
    s.add(deterministic=True, qkv_layout="thd_thd_thd", mask="padding_causal")
    s.add(deterministic=True, head_dim_qk=192, head_dim_v=128)
    s.add(deterministic=True, seqlen_q=2048, seqlen_kv=2048)

    # --- dropout -------------------------------------------------------------------------------
    s.section = "dropout"
    for p in (0.1, 0.2):
        for d in (64, 128):
            for mask in ("causal", "no_mask", "padding"):
                s.add(dropout=p, head_dim_qk=d, head_dim_v=d, mask=mask, is_training=True)
    s.add(dropout=0.1, qkv_dtype="fp16", head_dim_qk=64, head_dim_v=64, num_heads_q=12, num_heads_kv=12, mask="padding")
    s.add(dropout=0.1, qkv_layout="thd_thd_thd", mask="padding", head_dim_qk=64, head_dim_v=64)
    s.add(dropout=0.1, qkv_layout="sbhd_sbhd_sbhd")
    s.add(dropout=0.1, num_heads_kv=4)
    s.add(dropout=0.1, head_dim_qk=256, head_dim_v=256)
    s.add(dropout=0.1, window_size=[255, 0])
    s.add(dropout=0.1, is_training=False)

    # --- bias ----------------------------------------------------------------------------------
    s.section = "bias"
    for shape in BIAS_SHAPES:
        for mask in ("no_mask", "causal"):
            for train in TRAIN_INFER:
                s.add(bias="post_scale_bias", bias_shape=shape, mask=mask, is_training=train)
        s.add(bias="post_scale_bias", bias_shape=shape, mask="padding", head_dim_qk=64, head_dim_v=64,
              qkv_dtype="fp16", is_training=True)
    s.add(bias="post_scale_bias", bias_shape="1hss", seqlen_q=128, seqlen_kv=1024, mask="causal_bottom_right")
    s.add(bias="post_scale_bias", bias_shape="bhss", num_heads_kv=4)
    for mask in ("no_mask", "causal"):
        for train in TRAIN_INFER:
            s.add(bias="pre_scale_bias", mask=mask, is_training=train)
    for mask in ("no_mask", "causal", "padding_causal"):
        for train in TRAIN_INFER:
            s.add(bias="alibi", mask=mask, is_training=train)
    s.add(bias="alibi", seqlen_q=128, seqlen_kv=1024, mask="causal_bottom_right", is_training=False)
    s.add(bias="alibi", num_heads_kv=4)
    s.add(bias="alibi", head_dim_qk=64, head_dim_v=64, qkv_dtype="fp16")

    # --- softmax variants (attention sinks) ----------------------------------------------------
    s.section = "softmax"
    for softmax in ("off_by_one", "learnable"):
        for train in TRAIN_INFER:
            s.add(softmax=softmax, is_training=train)
            s.add(softmax=softmax, mask="no_mask", is_training=train)
            s.add(softmax=softmax, window_size=[127, 0], num_heads_kv=4, is_training=train)
        s.add(softmax=softmax, mask="padding_causal", is_training=True)
        s.add(softmax=softmax, head_dim_qk=64, head_dim_v=64, num_heads_kv=2, is_training=True)
        s.add(softmax=softmax, qkv_layout="thd_thd_thd", mask="padding_causal", is_training=True)
        s.add(softmax=softmax, seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right", num_heads_kv=4, is_training=False)
        s.add(softmax=softmax, qkv_dtype="fp16", is_training=True)

    # --- return_max_logit (QK-clip style training) ---------------------------------------------
    s.section = "max_logit"
    for d in (64, 128):
        for mask in ("causal", "no_mask"):
            for train in TRAIN_INFER:
                s.add(return_max_logit=True, head_dim_qk=d, head_dim_v=d, mask=mask, is_training=train)
    s.add(return_max_logit=True, num_heads_kv=4)
    s.add(return_max_logit=True, window_size=[255, 0])
    s.add(return_max_logit=True, qkv_layout="thd_thd_thd", mask="padding_causal")
    s.add(return_max_logit=True, qkv_dtype="fp16")

    # --- misc: explicit softmax scale, CUDA graphs ---------------------------------------------
    s.section = "misc"
    for train in TRAIN_INFER:
        s.add(attn_scale=0.125, head_dim_qk=192, head_dim_v=128, is_training=train)
        s.add(attn_scale=1.0, is_training=train)
        s.add(cuda_graph=True, is_training=train)
    s.add(attn_scale=0.0625, head_dim_qk=256, head_dim_v=256, num_heads_kv=8, window_size=[1023, 0])
    s.add(cuda_graph=True, seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right", num_heads_kv=4, is_training=False)
    return s


# ----- output --------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    pass


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    # Flow style for window_size ([left, right]); block style for anything containing mappings.
    flow = all(not isinstance(item, (dict, list)) for item in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def coverage(entries: list[dict[str, Any]], section_of: dict[str, str] | None = None) -> list[str]:
    """Human-readable coverage summary lines."""
    def count(key_fn) -> str:
        counter = collections.Counter(key_fn(e) for e in entries)
        return ", ".join(f"{k}: {v}" for k, v in sorted(counter.items(), key=lambda kv: str(kv[0])))

    def ratio(e: dict[str, Any]) -> str:
        hq, hkv = e["num_heads_q"], e["num_heads_kv"]
        return "mha" if hq == hkv else "mqa" if hkv == 1 else f"gqa{hq // hkv}"

    def dtype(e: dict[str, Any]) -> str:
        return e["qkv_dtype"] + (f"/{e['scaling_mode']}" if "scaling_mode" in e else "")

    flags = collections.Counter()
    for e in entries:
        flags["training"] += e["is_training"]
        flags["inference"] += not e["is_training"]
        flags["deterministic"] += bool(e.get("deterministic"))
        flags["dropout>0"] += bool(e.get("dropout"))
        flags["window_size"] += "window_size" in e
        flags["seqlen_q!=seqlen_kv"] += e["seqlen_q"] != e["seqlen_kv"]
        flags["decode (seqlen_q=1)"] += e["seqlen_q"] == 1
        flags["return_max_logit"] += bool(e.get("return_max_logit"))
        flags["cuda_graph"] += bool(e.get("cuda_graph"))
        flags["attn_scale"] += "attn_scale" in e
        flags["bottom_right_diagonal"] += "bottom_right_diagonal" in e
        flags["o/do/dqkv dtype"] += any(k in e for k in ("o_dtype", "do_dtype", "dqkv_dtype"))
        flags["o/do format, dqkv_layout"] += any(k in e for k in ("o_format", "do_format", "dqkv_layout"))
    lines = [
        f"configs: {len(entries)}",
        "qkv_dtype: " + count(dtype),
        "head_dim (qk/v): " + count(lambda e: f"{e['head_dim_qk']}/{e['head_dim_v']}"),
        "heads ratio: " + count(ratio),
        "mask: " + count(lambda e: e["mask"]),
        "qkv_layout: " + count(lambda e: e["qkv_layout"]),
        "bias: " + count(lambda e: e.get("bias", "no_bias") + (f"/{e['bias_shape']}" if "bias_shape" in e else "")),
        "softmax: " + count(lambda e: e.get("softmax", "vanilla")),
        "features: " + ", ".join(f"{k}: {v}" for k, v in flags.items()),
    ]
    if section_of:
        lines.append("sections: " + count(lambda e: section_of[e["name"]]))
    return lines


def render(title: str, description: str, entries: list[dict[str, Any]], summary: list[str]) -> str:
    header = [
        "# GENERATED FILE - DO NOT EDIT BY HAND.",
        "# Generated by tools/gen_probe_suite.py; change the generator and rerun",
        "#   python3 tools/gen_probe_suite.py",
        "# Synthetic Hopper (sm90) cuDNN fused-attention probe problems: the numbers are chosen",
        "# to cover the cuDNN support matrix, not taken from a model. Every entry is complete",
        "# (no defaults block) and satisfies the AttnConfig constraints (checked by the generator).",
        "#",
        "# Coverage:",
    ]
    header += [f"#   {line}" for line in summary]
    body = {
        "name": title,
        "description": description,
        "source": "tools/gen_probe_suite.py (synthetic coverage suite, no model source)",
        "configs": entries,
    }
    text = yaml.dump(body, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
    return "\n".join(header) + "\n" + text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="generate and check; write nothing")
    parser.add_argument("--check-configs", nargs="*", metavar="YAML", help="check these config files and exit")
    args = parser.parse_args(argv)

    if args.check_configs is not None:
        total = 0
        for path in args.check_configs:
            n = check_config_file(Path(path))
            total += n
            print(f"ok {path}: {n} configs")
        print(f"ok: {len(args.check_configs)} files, {total} configs")
        return 0

    suite = build()
    entries = [{"name": name, **cfg} for name, cfg in suite.entries.items()]
    check_unique((NamedConfig(name, check_entry(name, cfg)) for name, cfg in suite.entries.items()),
                 "hopper-suite")
    if len(entries) < MIN_CONFIGS:
        raise ConfigProblem(f"only {len(entries)} configs; the suite needs at least {MIN_CONFIGS}")
    sample = entries[::SAMPLE_EVERY]
    summary = coverage(entries, suite.section_of)
    for line in summary:
        print(line)
    print(f"(skipped {suite.duplicates} duplicate configs; sample: {len(sample)} configs)")
    if args.check:
        return 0

    suite_text = render(
        "hopper-suite",
        "Hopper (sm90) cuDNN fused-attention probe suite: head dims, GQA/MQA, masks, windows, "
        "layouts, paged KV, FP8 recipes, bias, softmax variants, dropout, determinism",
        entries, summary,
    )
    sample_text = render(
        "hopper-suite-sample",
        f"Every {SAMPLE_EVERY}th config of probes/hopper-suite.yaml, for quick GPU agreement tests",
        sample, coverage(sample, suite.section_of),
    )
    # Round-trip both files through the library's config-file parser and the checker before writing.
    for text, where in ((suite_text, SUITE_PATH), (sample_text, SAMPLE_PATH)):
        try:
            reparsed = parse_config_file(yaml.safe_load(text), where.name)
        except ConfigError as err:
            raise ConfigProblem(str(err)) from None
        check_file(reparsed)
    SUITE_PATH.parent.mkdir(parents=True, exist_ok=True)
    SUITE_PATH.write_text(suite_text)
    SAMPLE_PATH.write_text(sample_text)
    print(f"wrote {SUITE_PATH.relative_to(ROOT)} ({len(entries)} configs) and "
          f"{SAMPLE_PATH.relative_to(ROOT)} ({len(sample)} configs)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigProblem as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
