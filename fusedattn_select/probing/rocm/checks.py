"""What each declared table says about one problem: every reason it is not declared, xformers style.

Each check translates an AttnConfig into the table's own vocabulary (CK dtype tokens, hipDNN graph
attributes, PyTorch SDPA arguments) and collects all reasons, never just the first. What a table does
not cover (a field it never reads, a dtype with no head-dim list) is a gap, not a reason: the table
has no data for it, and never declares it supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping, Sequence

from fusedattn_select.probing.rocm._core import AttnConfig, Phase
from fusedattn_select.probing.rocm.tables import DeclaredTable


@dataclass(frozen=True)
class TableAnswer:
    """A table's answer: `reasons` why it does not declare the problem, `gaps` (what it does not cover, so it
    has no data) and `notes` (caveats and warnings). Declared supported: neither reasons nor gaps; no data:
    gaps and no reason (a reason answers whatever the gaps would)."""

    table: str
    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()
    gaps: tuple[str, ...] = ()

    @property
    def supported(self) -> bool:
        return not self.reasons and not self.gaps

    @property
    def no_data(self) -> bool:
        return not self.reasons and bool(self.gaps)


def _mixed_dtypes(cfg: AttnConfig, phase: Phase) -> str:
    """The dtype fields that differ from qkv_dtype in this phase (o_dtype; do_dtype and dqkv_dtype in backward)."""
    names = ("o_dtype", "do_dtype", "dqkv_dtype") if phase is Phase.BACKWARD else ("o_dtype",)
    return ", ".join(f"{n}={getattr(cfg, f'resolved_{n}')!r}" for n in names
                     if getattr(cfg, f"resolved_{n}") != cfg.qkv_dtype)


def undeclared(cfg: AttnConfig, phase: Phase, covered: Collection[str] = ()) -> list[str]:
    """The gaps of a table whose check reads none of these fields (but those in `covered`): each field the
    problem sets, named with its value. FP8 scaling, the max logit, a deterministic backward, bias shapes
    and page sizes are in no declared table; the others are gaps of the tables whose checks do not read them
    (each check lists the ones it reads in `covered`)."""
    mixed = _mixed_dtypes(cfg, phase) if not cfg.is_fp8 else ""
    found = {
        "qkv_layout": (f"qkv_layout={cfg.qkv_layout!r}: ragged (THD) inputs, packed sequences of variable length, "
                       "are not declared (the table records no variable-length kernels)") if cfg.layout.ragged else "",
        "mask": (f"mask={cfg.mask!r}: padding (per-sequence lengths) is not declared (the table records no "
                 "variable-length kernels)") if cfg.has_padding else "",
        "softmax": (f"softmax={cfg.softmax!r}: not declared (the table's check has no softmax variant; "
                    "its kernels are named without one)") if cfg.softmax != "vanilla" else "",
        "dtypes": (f"{mixed}: not declared (the table names one dtype for every tensor of a "
                   f"{phase.value} kernel)") if mixed else "",
        "scaling_mode": (f"scaling_mode={cfg.resolved_scaling_mode!r}: not declared (the table names {cfg.qkv_dtype} "
                         "kernels, not how their inputs are scaled)") if cfg.is_fp8 else "",
        "return_max_logit": ("return_max_logit=True: not declared (no source says whether the kernels return the "
                             "max logit)") if cfg.return_max_logit and phase is Phase.FORWARD else "",
        "deterministic": ("deterministic=True: not declared (no source says whether the backward is "
                          "deterministic)") if cfg.deterministic and phase is Phase.BACKWARD else "",
        "bias_shape": (f"bias_shape={cfg.bias_shape!r}: not declared (no source says which bias shapes the kernels "
                       "take)") if cfg.bias_shape is not None else "",
        "page_size": (f"page_size={cfg.page_size}: not declared (no source gives the page sizes of the paged-KV "
                      "pipeline)") if cfg.layout.paged else "",
    }
    return [text for field, text in found.items() if text and field not in covered]


def _dtype_token(tokens: Sequence[Mapping[str, str]], cfg: AttnConfig) -> str | None:
    for entry in tokens:
        if entry["qkv_dtype"] == cfg.qkv_dtype and entry["o_dtype"] == cfg.resolved_o_dtype:
            return entry["token"]
    return None


def _pairs(values: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in values]


def _show_pairs(pairs: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"{a}/{b}" for a, b in pairs)


def mask_kind(cfg: AttnConfig) -> str:
    """The mask as a (left, right) band: no_mask, top_left_causal, bottom_right_causal or sliding_window."""
    left, right = cfg.window_size
    if cfg.is_causal:
        right = 0
    if left == -1 and right == -1:
        return "no_mask"
    if left == -1 and right == 0:
        return "bottom_right_causal" if cfg.resolved_bottom_right_diagonal else "top_left_causal"
    return "sliding_window"


# ----- CK Tile FMHA ----------------------------------------------------------------------------
def _ck_head_dim_reasons(facts: Mapping[str, Any], cfg: AttnConfig, phase: Phase,
                         token: str | None) -> tuple[list[str], list[str]]:
    """(reasons, gaps) of the head dims: a dtype with no forward head-dim list is a gap, not a rejection."""
    pair = (cfg.head_dim_qk, cfg.resolved_head_dim_v)
    reasons, gaps = [], []
    divisor = int(facts["head_dim_multiple_of"])
    if pair[0] % divisor or pair[1] % divisor:
        reasons.append(f"head_dim_qk={pair[0]}, head_dim_v={pair[1]}: must be multiples of {divisor}")
    if phase is Phase.FORWARD:
        table = facts["forward_head_dims"].get(token) if token else None
        if token and table is None:
            gaps.append(f"dtype {token}: no forward head-dim table is declared for it, so no head dims are known")
        elif table is not None and pair not in _pairs(table):
            reasons.append(f"head dims {pair[0]}/{pair[1]}: no {token} forward kernel ({_show_pairs(_pairs(table))})")
    else:
        table = _pairs(facts["backward_head_dims"])
        if pair not in table:
            reasons.append(f"head dims {pair[0]}/{pair[1]}: no backward kernel ({_show_pairs(table)})")
    return reasons, gaps


def _ck_scaling_reasons(table: DeclaredTable, cfg: AttnConfig) -> list[str]:
    """MXFP8 needs block-scale types, which CK's dtype maps (symbol_map.py) do not have."""
    if cfg.resolved_scaling_mode != "mxfp8":
        return []
    cited = "; ".join(s.cite() for s in table.sources if s.path.endswith("symbol_map.py"))
    return [f"scaling_mode='mxfp8': no block-scaled (MX) type in CK's FWD_DTYPE_MAP or BWD_DTYPE_MAP ({cited})"]


def _ck_variable_length_gaps(table: DeclaredTable, cfg: AttnConfig) -> list[str]:
    """Ragged (THD) inputs and padding masks need CK's group mode (variable sequence lengths), which the table
    does not record: its pinned arch specs name group mode only in a code-generation rule
    (global_rules.group_mode_requires_padding), with no dtype, head dim or architecture for it."""
    fields = [f"qkv_layout={cfg.qkv_layout!r} (ragged, THD)"] if cfg.layout.ragged else []
    fields += [f"mask={cfg.mask!r} (padding)"] if cfg.has_padding else []
    if not fields:
        return []
    cited = "; ".join(s.cite() for s in table.sources if s.path.endswith("fmha_arch_specs.json"))
    return [f"{', '.join(fields)}: variable sequence lengths (CK's group mode) are not declared; the arch specs "
            f"({cited}) name group mode only in global_rules.group_mode_requires_padding, with no kernels listed"]


def ck_fmha_answer(table: DeclaredTable, cfg: AttnConfig, phase: Phase, arch: str) -> TableAnswer:
    """CK Tile FMHA: architecture dtypes, head-dim pairs, bias kinds and the global rules."""
    facts = table.facts
    reasons: list[str] = []
    info = facts["architectures"].get(arch)
    if info is None:
        reasons.append(f"arch={arch!r}: not a declared architecture ({', '.join(facts['architectures'])})")
    token = _dtype_token(facts["dtype_tokens"], cfg)
    if token is None:
        reasons.append(f"qkv_dtype={cfg.qkv_dtype!r} with o_dtype={cfg.resolved_o_dtype!r}: no CK dtype for this pair")
    elif info is not None and token not in info["dtypes"]:
        reasons.append(f"dtype {token}: not supported on {arch} ({', '.join(info['dtypes'])})")
    if phase is Phase.BACKWARD:
        if token is not None and token not in facts["backward_dtypes"]:
            reasons.append(f"dtype {token}: backward kernels exist for {', '.join(facts['backward_dtypes'])} only")
        if info is not None and not info["backward"]:
            reasons.append(f"arch={arch!r}: no backward pipeline")
    head_dim_reasons, gaps = _ck_head_dim_reasons(facts, cfg, phase, token)
    reasons += head_dim_reasons + _ck_scaling_reasons(table, cfg)
    if cfg.bias not in facts["bias_tokens"]:
        reasons.append(f"bias={cfg.bias!r}: CK has bias kinds {', '.join(facts['bias_tokens'])} only")
    if cfg.softmax not in facts["softmax"]:
        reasons.append(f"softmax={cfg.softmax!r}: not declared ({', '.join(facts['softmax'])})")
    if cfg.layout.paged and info is not None and not info["paged_kv"]:
        reasons.append(f"qkv_layout={cfg.qkv_layout!r}: no paged-KV pipeline on {arch}")
    notes = [
        w["text"] for w in facts["warnings"]
        if (cfg.head_dim_qk, cfg.resolved_head_dim_v) == (w["head_dim_qk"], w["head_dim_v"])
        and (cfg.bias != "no_bias" or cfg.dropout > 0)
    ]
    covered = ("qkv_layout", "mask", "softmax") + (("scaling_mode",) if cfg.resolved_scaling_mode == "mxfp8" else ())
    gaps += _ck_variable_length_gaps(table, cfg) + undeclared(cfg, phase, covered)
    return TableAnswer(table.name, tuple(reasons), tuple(notes + [table.caveat]), tuple(gaps))


# ----- hipDNN SDPA ----------------------------------------------------------------------------
# How our config reaches a hipDNN SDPA graph attribute the engine rejects, and the words for it.
_HIPDNN_FEATURES: dict[str, Callable[[AttnConfig, Phase], str]] = {
    "dropout": lambda c, p: f"dropout={c.dropout}: dropout_probability must be unset or zero" if c.dropout > 0 else "",
    "alibi": lambda c, p: "bias='alibi': alibi_mask must be false" if c.bias == "alibi" else "",
    "padding_mask": lambda c, p: f"mask={c.mask!r}: padding_mask must be false" if c.has_padding else "",
    "attn_mask": lambda c, p: (
        f"bias={c.bias!r}: attn_mask (bias) tensor not supported"
        if c.bias in ("pre_scale_bias", "post_scale_bias") else ""
    ),
    "paged_kv": lambda c, p: (
        f"qkv_layout={c.qkv_layout!r}: page_table_k/v tensors not supported" if c.layout.paged else ""
    ),
    "stats_output": lambda c, p: (
        "is_training=True: a training forward outputs softmax stats and the engine rejects generate_stats"
        if c.is_training and p is Phase.FORWARD else ""
    ),
    "group_mode": lambda c, p: (
        f"qkv_layout={c.qkv_layout!r}, mask={c.mask!r}: variable sequence lengths (group mode) not supported"
        if c.has_padding or c.layout.ragged else ""
    ),
    "bias_gradient": lambda c, p: "",  # a bias gradient needs a bias, which attn_mask already rejects
}


def _feature_reasons(rejects: Sequence[str], cfg: AttnConfig, phase: Phase) -> list[str]:
    return [text for key in rejects if (text := _HIPDNN_FEATURES[key](cfg, phase))]


def _hipdnn_forward(facts: Mapping[str, Any], cfg: AttnConfig, arch: str) -> list[str]:
    fwd = facts["forward"]
    reasons = []
    if arch not in fwd["architectures"]:
        reasons.append(f"arch={arch!r}: the forward engine runs on {', '.join(fwd['architectures'])} only")
    token = _dtype_token(fwd["dtype_tokens"], cfg)
    if token is None:
        reasons.append(
            f"qkv_dtype={cfg.qkv_dtype!r}, o_dtype={cfg.resolved_o_dtype!r}: needs bf16 in and out, "
            "or fp8_e4m3 in with bf16 out"
        )
    reasons += _feature_reasons(fwd["rejects"], cfg, Phase.FORWARD)
    rows = [k for k in fwd["kernels"] if k["arch"] == arch and k["mode"] == "batch"]
    if not rows or token is None:
        return reasons
    pair, kind = (cfg.head_dim_qk, cfg.resolved_head_dim_v), mask_kind(cfg)
    dtypes = sorted({k["dtype"] for k in rows})
    pairs = sorted({(k["head_dim_qk"], k["head_dim_v"]) for k in rows})
    masks = sorted({k["mask"] for k in rows})
    if token not in dtypes:
        reasons.append(f"dtype {token}: no {arch} forward kernel (kernels are {', '.join(dtypes)})")
    if pair not in pairs:
        reasons.append(f"head dims {pair[0]}/{pair[1]}: no {arch} forward kernel ({_show_pairs(pairs)})")
    if kind not in masks:
        reasons.append(f"mask={cfg.mask!r} ({kind}): no {arch} forward kernel ({', '.join(masks)})")
    matched = any((k["dtype"], k["head_dim_qk"], k["head_dim_v"], k["mask"]) == (token, *pair, kind) for k in rows)
    if not matched and token in dtypes and pair in pairs and kind in masks:
        reasons.append(f"no {arch} forward kernel for {token} {pair[0]}/{pair[1]} {kind}")
    return reasons


def _hipdnn_backward(facts: Mapping[str, Any], cfg: AttnConfig, arch: str) -> tuple[list[str], list[str]]:
    bwd = facts["backward"]
    reasons, notes = [], []
    if arch not in bwd["architectures"]:
        reasons.append(f"arch={arch!r}: the backward engine runs on {', '.join(bwd['architectures'])} only")
    dtypes = {cfg.qkv_dtype, cfg.resolved_o_dtype, cfg.resolved_do_dtype, cfg.resolved_dqkv_dtype}
    if len(dtypes) != 1 or cfg.qkv_dtype not in bwd["dtypes"]:
        reasons.append(
            f"dtypes {'/'.join(sorted(dtypes))}: Q/K/V/dO/dQ/dK/dV must all be one of {', '.join(bwd['dtypes'])}"
        )
    hq, hv = cfg.head_dim_qk, cfg.resolved_head_dim_v
    if bwd["symmetric_head_dims"] and hq != hv:
        reasons.append(f"head_dim_qk={hq}, head_dim_v={hv}: asymmetric head dimensions not supported")
    if hq not in bwd["head_dims_checked"]:
        reasons.append(f"head_dim_qk={hq}: must be one of {', '.join(map(str, bwd['head_dims_checked']))}")
    elif hq in bwd["head_dims_without_kernel_row"]:
        reasons.append(f"head_dim_qk={hq}: no backward kernel row for the dispatched tuple (pssk=1, pddv=1)")
    kind = mask_kind(cfg)
    if kind not in bwd["masks"]:
        reasons.append(f"mask={cfg.mask!r} ({kind}): masked attention not dispatched in backward")
    reasons += _feature_reasons(bwd["rejects"], cfg, Phase.BACKWARD)
    if hq not in bwd["verified_head_dims"]:
        notes.append(f"head dim {hq} backward is not verified against hipDNN's CPU reference")
    return reasons, notes


def hipdnn_sdpa_answer(table: DeclaredTable, cfg: AttnConfig, phase: Phase, arch: str) -> TableAnswer:
    """hipDNN's ASM SDPA engine: isApplicable's checks and its kernel rows."""
    if phase is Phase.FORWARD:
        reasons, notes = _hipdnn_forward(table.facts, cfg, arch), []
    else:
        reasons, notes = _hipdnn_backward(table.facts, cfg, arch)
    # Ragged inputs and padding are rejected (padding_mask, group_mode), and every dtype is read: softmax is not.
    gaps = undeclared(cfg, phase, ("qkv_layout", "mask", "dtypes"))
    return TableAnswer(table.name, tuple(reasons), tuple(notes + [table.caveat]), tuple(gaps))


# ----- PyTorch SDPA on ROCm --------------------------------------------------------------------
def _needs_attn_mask(cfg: AttnConfig) -> list[str]:
    """Parts of the problem SDPA can only express as an explicit attn_mask."""
    needs = []
    if cfg.bias != "no_bias":
        needs.append(f"bias={cfg.bias!r}")
    if cfg.has_padding:
        needs.append(f"mask={cfg.mask!r} (padding)")
    if mask_kind(cfg) == "sliding_window":
        needs.append(f"window_size={list(cfg.window_size)}")
    # is_causal is top-left; bottom-right causal equals it only when the sequence lengths do.
    if mask_kind(cfg) == "bottom_right_causal" and cfg.seqlen_q != cfg.seqlen_kv:
        needs.append(f"mask={cfg.mask!r} with seqlen_q != seqlen_kv")
    return needs


def _sdpa_kernel_reasons(kernel: Mapping[str, Any], cfg: AttnConfig, arch: str) -> list[str]:
    reasons = []
    if cfg.qkv_dtype not in kernel["dtypes"]:
        reasons.append(f"qkv_dtype={cfg.qkv_dtype!r}: must be one of {', '.join(kernel['dtypes'])}")
    limits = kernel["max_head_dim_by_arch_prefix"]
    limit = next((v for p, v in limits.items() if arch.startswith(p)), kernel["max_head_dim"])
    hq, hv = cfg.head_dim_qk, cfg.resolved_head_dim_v
    if kernel["head_dims_equal"] == "qkv" and hq != hv:
        reasons.append(f"head_dim_qk={hq}, head_dim_v={hv}: q, k and v need the same head dim")
    if max(hq, hv) > limit:
        reasons.append(f"head dims {hq}/{hv}: must be <= {limit} on {arch}")
    multiple = int(kernel["head_dim_multiple_of"])
    if hq % multiple or hv % multiple:
        reasons.append(f"head dims {hq}/{hv}: must be multiples of {multiple}")
    needs = _needs_attn_mask(cfg)
    if needs and not kernel["attn_mask"]:
        reasons.append(f"{', '.join(needs)}: needs an attn_mask, which this kernel does not take")
    if kernel["causal_needs_equal_seqlens"] and mask_kind(cfg) == "top_left_causal" and cfg.seqlen_q != cfg.seqlen_kv:
        reasons.append(f"causal with seqlen_q={cfg.seqlen_q} != seqlen_kv={cfg.seqlen_kv}")
    if cfg.num_heads_q != cfg.num_heads_kv and not kernel["grouped_query"]:
        reasons.append(f"num_heads_q={cfg.num_heads_q} != num_heads_kv={cfg.num_heads_kv}: no grouped-query attention")
    return reasons


def _not_expressible(cfg: AttnConfig, kinds: Sequence[str]) -> list[str]:
    found = {
        "fp8": f"qkv_dtype={cfg.qkv_dtype!r}: SDPA on ROCm has no fp8 kernel" if cfg.is_fp8 else "",
        "softmax": f"softmax={cfg.softmax!r}: SDPA has vanilla softmax only" if cfg.softmax != "vanilla" else "",
        "paged_kv": f"qkv_layout={cfg.qkv_layout!r}: SDPA takes no paged KV cache" if cfg.layout.paged else "",
        "return_max_logit": "return_max_logit=True: SDPA does not return it" if cfg.return_max_logit else "",
    }
    return [found[kind] for kind in kinds if found[kind]]


def pytorch_sdpa_answer(table: DeclaredTable, cfg: AttnConfig, phase: Phase, arch: str) -> TableAnswer:
    """PyTorch SDPA on ROCm: supported when the flash or the memory-efficient kernel takes it."""
    facts = table.facts
    common = _not_expressible(cfg, facts["not_expressible"])
    per_kernel = {name: common + _sdpa_kernel_reasons(k, cfg, arch) for name, k in facts["kernels"].items()}
    usable = [name for name, reasons in per_kernel.items() if not reasons]
    notes = [f"kernel: {usable[0]}"] if usable else []
    reasons = () if usable else tuple(f"{name}: {r}" for name, rs in per_kernel.items() for r in rs)
    # fp8, the max logit and softmax are rejections here (not_expressible), padding an attn_mask: the other fields
    # (ragged THD inputs among them: the table records none of SDPA's nested-tensor rules) are gaps.
    gaps = tuple(undeclared(cfg, phase, ("scaling_mode", "return_max_logit", "softmax", "mask")))
    return TableAnswer(table.name, reasons, tuple(notes + [table.caveat]), gaps)


def listed_architectures(table: DeclaredTable) -> list[str]:
    """The architectures `table` lists, read where its check reads them ([] for the PyTorch SDPA table, which
    names none: AOTriton decides at run time)."""
    if table.name == "ck_fmha":
        return list(table.facts["architectures"])
    if table.name == "hipdnn_sdpa":
        phases = (table.facts["forward"], table.facts["backward"])
        return sorted({arch for phase in phases for arch in phase["architectures"]})
    return []


CHECKS: dict[str, Callable[[DeclaredTable, AttnConfig, Phase, str], TableAnswer]] = {
    "ck_fmha": ck_fmha_answer,
    "hipdnn_sdpa": hipdnn_sdpa_answer,
    "pytorch_sdpa": pytorch_sdpa_answer,
}
