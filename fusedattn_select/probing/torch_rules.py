"""PyTorch's own answer for a problem: what torch's SDPA rules say, evaluated by torch on the device.

The answer comes from torch itself (`torch.backends.cuda.can_use_cudnn_attention` with an
`SDPAParams`, and `torch._fused_sdp_choice`), never from a copy of its rules: a copy would drift
from the torch it claims to describe. torch's cuDNN rule reads the device (compute capability,
cuDNN runtime version), so it is only evaluated where torch sees a CUDA device; the recorder stores
the answer per snapshot entry so the comparison also works on machines without a GPU.

What this module decides itself is only how a problem is stated to SDPA (`sdpa_call`): the tensor
shapes and strides, the mask as `is_causal`, a post-scale bias as a float `attn_mask`, dropout,
GQA, training as inputs that require grad, determinism as `torch.use_deterministic_algorithms(True)`.
A problem SDPA cannot state as the same cuDNN graph (FP8, ragged or paged layouts, softmax
variants, pre-scale bias, ALiBi, padding and windows, which SDPA takes only as dense masks, ...) is
answered "not_expressible" with the reason; an evaluation that raises is answered "failed" with
the error, never as a verdict.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from fusedattn_select.config import AttnConfig
from fusedattn_select.dtypes import FP8_DTYPES
from fusedattn_select.errors import ConfigError, SnapshotError
from fusedattn_select.layouts import format_strides

log = logging.getLogger("fusedattn_select")

# The `status` of a recorded torch answer.
EVALUATED = "evaluated"
NOT_EXPRESSIBLE = "not_expressible"
FAILED = "failed"

# Shapes of a post-scale bias, as (batch, heads) present in the 4-D [b, h, s_q, s_kv] mask.
_BIAS_DIMS = {"11ss": (False, False), "1hss": (False, True), "b1ss": (True, False), "bhss": (True, True)}


@dataclass(frozen=True)
class SdpaCall:
    """How one problem is stated to torch's SDPA: logical [b, h, s, d] tensors with strides."""

    shape_q: tuple[int, int, int, int]
    shape_k: tuple[int, int, int, int]
    shape_v: tuple[int, int, int, int]
    strides_q: tuple[int, int, int, int]
    strides_k: tuple[int, int, int, int]
    strides_v: tuple[int, int, int, int]
    dtype: str  # "fp16" | "bf16"
    is_causal: bool
    mask_shape: tuple[int, int, int, int] | None  # a dense attn_mask of this shape, or none
    mask_is_float: bool  # float (additive bias) mask in the qkv dtype, else boolean
    dropout: float
    scale: float | None
    enable_gqa: bool
    requires_grad: bool
    deterministic: bool

    def describe(self) -> str:
        """One line saying how the problem was stated, stored beside torch's answer."""
        mask = "none"
        if self.mask_shape is not None:
            kind = "float" if self.mask_is_float else "bool"
            mask = f"{kind}{list(self.mask_shape)}"
        return (
            f"q{list(self.shape_q)} k{list(self.shape_k)} v{list(self.shape_v)} {self.dtype} "
            f"is_causal={self.is_causal} attn_mask={mask} dropout={self.dropout} "
            f"enable_gqa={self.enable_gqa} requires_grad={self.requires_grad}"
            + (" deterministic" if self.deterministic else "")
        )


def _not_expressible(cfg: AttnConfig) -> str:
    """Why SDPA's API cannot state this problem ("" when it can)."""
    layout = cfg.layout
    checks = (
        (cfg.qkv_dtype in FP8_DTYPES, f"qkv_dtype={cfg.qkv_dtype!r}: SDPA takes no FP8 scaling recipe"),
        (layout.ragged, f"qkv_layout={cfg.qkv_layout!r}: ragged (THD) tensors need nested tensors"),
        (layout.paged, f"qkv_layout={cfg.qkv_layout!r}: SDPA has no paged KV cache"),
        (cfg.softmax != "vanilla", f"softmax={cfg.softmax!r}: SDPA has the vanilla softmax only"),
        (cfg.bias == "pre_scale_bias", "bias='pre_scale_bias': SDPA adds attn_mask after scaling"),
        (cfg.return_max_logit, "return_max_logit=True: SDPA returns no max logit"),
        (cfg.o_format is not None and cfg.o_format != cfg.q_format,
         f"o_format={cfg.o_format!r}: SDPA chooses the output's memory format"),
        (cfg.dqkv_layout is not None and cfg.dqkv_layout != cfg.qkv_layout,
         f"dqkv_layout={cfg.dqkv_layout!r}: SDPA chooses the gradients' memory format"),
        (cfg.do_format is not None and cfg.do_format != cfg.resolved_o_format,
         f"do_format={cfg.do_format!r}: SDPA takes the output gradient as autograd gives it"),
        (any(getattr(cfg, f) not in (None, cfg.qkv_dtype) for f in ("o_dtype", "do_dtype", "dqkv_dtype")),
         "o/do/dqkv dtype differs from qkv_dtype: SDPA computes in the inputs' dtype"),
    )
    return next((reason for failed, reason in checks if failed), "")


def _mask_blocker(cfg: AttnConfig) -> str:
    """Why SDPA cannot state this mask as the same cuDNN graph ("" when it can).

    Only masks SDPA states without a dense mask tensor are compared: a dense boolean or float mask
    asks cuDNN for another graph (a mask tensor instead of sequence lengths, a window or a
    diagonal), so torch's answer for it would not be about this problem.
    """
    if cfg.has_padding:
        return f"mask={cfg.mask!r}: SDPA states padding only as a dense mask (another cuDNN graph)"
    if cfg.resolved_window_size != (-1, -1):
        return f"window_size={list(cfg.window_size)}: SDPA states windows only as a dense mask (another cuDNN graph)"
    if cfg.bias == "alibi":
        return "bias='alibi': SDPA has no ALiBi; a dense bias is another cuDNN graph"
    # torch's is_causal is the top-left diagonal; it equals bottom-right when s_q == s_kv.
    if cfg.is_causal and cfg.resolved_bottom_right_diagonal and cfg.seqlen_q != cfg.seqlen_kv:
        return f"mask={cfg.mask!r} with seqlen_q != seqlen_kv: SDPA's is_causal is the top-left diagonal"
    if cfg.is_causal and cfg.bias != "no_bias":
        return f"mask={cfg.mask!r} with bias={cfg.bias!r}: SDPA takes is_causal or attn_mask, not both"
    return ""


def _mask(cfg: AttnConfig) -> tuple[bool, tuple[int, int, int, int] | None]:
    """(is_causal, shape of the float attn_mask that carries a post-scale bias, or None)."""
    if cfg.bias != "post_scale_bias":
        return cfg.is_causal, None
    has_b, has_h = _BIAS_DIMS[cfg.bias_shape or "11ss"]
    return False, (cfg.batch_size if has_b else 1, cfg.num_heads_q if has_h else 1, cfg.seqlen_q, cfg.seqlen_kv)


def sdpa_call(cfg: AttnConfig) -> SdpaCall | str:
    """How `cfg` is stated to torch's SDPA, or why it cannot be (a reason string)."""
    reason = _not_expressible(cfg) or _mask_blocker(cfg)
    if reason:
        return reason
    layout, b = cfg.layout, cfg.batch_size
    hq, hkv, sq, skv = cfg.num_heads_q, cfg.num_heads_kv, cfg.seqlen_q, cfg.seqlen_kv
    dqk, dv = cfg.head_dim_qk, cfg.resolved_head_dim_v
    if layout.packing is not None and dqk != dv:
        return f"qkv_layout={cfg.qkv_layout!r} with head_dim_qk != head_dim_v: packed tensors share one head dim"
    q_packing = layout.packing if layout.packing in ("3hd", "h3d") else None
    kv_packing = layout.packing
    is_causal, mask_shape = _mask(cfg)
    return SdpaCall(
        shape_q=(b, hq, sq, dqk), shape_k=(b, hkv, skv, dqk), shape_v=(b, hkv, skv, dv),
        strides_q=format_strides(layout.q_format, b, hq, sq, dqk, q_packing),
        strides_k=format_strides(layout.kv_format, b, hkv, skv, dqk, kv_packing),
        strides_v=format_strides(layout.kv_format, b, hkv, skv, dv, kv_packing),
        dtype=cfg.qkv_dtype, is_causal=is_causal, mask_shape=mask_shape, mask_is_float=mask_shape is not None,
        dropout=float(cfg.dropout), scale=cfg.attn_scale, enable_gqa=hq != hkv,
        requires_grad=bool(cfg.is_training), deterministic=bool(cfg.deterministic),
    )


def torch_platform() -> tuple[dict[str, Any] | None, str]:
    """(torch's versions on this CUDA device, "") or (None, why torch's rules cannot be asked here)."""
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - torch is optional; any import failure means "not here"
        return None, f"torch cannot be imported ({type(err).__name__}: {err})"
    try:
        if not torch.cuda.is_available():
            return None, f"torch {torch.__version__} sees no CUDA device"
        return {
            "version": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn_version": torch.backends.cudnn.version(),
            "device_name": torch.cuda.get_device_name(),
        }, ""
    except Exception as err:  # noqa: BLE001 - a broken CUDA setup is reported, not raised
        return None, f"torch cannot query the CUDA device ({type(err).__name__}: {err})"


def _tensor(torch: Any, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any, grad: bool) -> Any:
    # Storage just large enough for the strided view; torch's rules read shapes and strides only.
    size = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    base = torch.empty(size, dtype=dtype, device="cuda")
    return base.as_strided(shape, strides).requires_grad_(grad)


@contextlib.contextmanager
def _torch_defaults(torch: Any, deterministic: bool) -> Iterator[None]:
    """Every SDPA backend enabled (torch's defaults) and the requested determinism, restored after."""
    backends = torch.backends.cuda
    saved = (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled(),
             backends.math_sdp_enabled())
    saved_det = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        for enable in (backends.enable_cudnn_sdp, backends.enable_flash_sdp, backends.enable_mem_efficient_sdp,
                       backends.enable_math_sdp):
            enable(True)
        torch.use_deterministic_algorithms(deterministic)
        yield
    finally:
        for enable, value in zip((backends.enable_cudnn_sdp, backends.enable_flash_sdp,
                                  backends.enable_mem_efficient_sdp, backends.enable_math_sdp), saved):
            enable(value)
        torch.use_deterministic_algorithms(saved_det[0], warn_only=saved_det[1])


# c10 prints a TORCH_WARN from a function bound without Python's warning handler to stderr as
# "[W... sdp_utils.cpp:NNN] Warning: <text> (function <name>)"; torch 2.11's can_use_cudnn_attention
# does (seen on an H100 and an H200), so its debug reasons are read from the process's stderr.
_C10_WARNING = re.compile(r"Warning: (?P<text>.*?)(?: \(function \w+\))?$")


@contextlib.contextmanager
def _native_stderr() -> Iterator[list[str]]:
    """Collect what native code writes to file descriptor 2 inside the block (lines, after it)."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())


def _torch_reasons(native: list[str], caught: list[warnings.WarningMessage]) -> list[str]:
    texts = [str(w.message).strip() for w in caught]
    texts += [m.group("text").strip() for m in map(_C10_WARNING.search, native) if m]
    return list(dict.fromkeys(t for t in texts if t))


def _evaluate(call: SdpaCall) -> dict[str, Any]:
    import torch
    from torch.backends.cuda import SDPAParams, can_use_cudnn_attention
    from torch.nn.attention import SDPBackend

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[call.dtype]
    with _torch_defaults(torch, call.deterministic), torch.enable_grad():
        q = _tensor(torch, call.shape_q, call.strides_q, dtype, call.requires_grad)
        k = _tensor(torch, call.shape_k, call.strides_k, dtype, call.requires_grad)
        v = _tensor(torch, call.shape_v, call.strides_v, dtype, call.requires_grad)
        mask = None
        if call.mask_shape is not None:
            mask = torch.ones(call.mask_shape, dtype=dtype if call.mask_is_float else torch.bool, device="cuda")
        params = SDPAParams(q, k, v, mask, call.dropout, call.is_causal, call.enable_gqa)
        with warnings.catch_warnings(record=True) as caught, _native_stderr() as native:
            warnings.simplefilter("always")
            accepts = bool(can_use_cudnn_attention(params, True))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            choice = torch._fused_sdp_choice(q, k, v, attn_mask=mask, dropout_p=call.dropout,
                                             is_causal=call.is_causal, scale=call.scale,
                                             enable_gqa=call.enable_gqa)
    reasons = _torch_reasons(native, caught)
    return {
        "status": EVALUATED,
        "cudnn": accepts,
        "cudnn_reasons": [] if accepts else reasons,
        "sdpa_choice": SDPBackend(choice).name,
        "expressed_as": call.describe(),
    }


def torch_answer(cfg: AttnConfig) -> dict[str, Any]:
    """torch's answer for `cfg` on this process's CUDA device, as stored in a snapshot entry.

    {"status": "evaluated", "cudnn": bool, "cudnn_reasons": [torch's debug messages],
    "sdpa_choice": "CUDNN_ATTENTION" | "FLASH_ATTENTION" | ..., "expressed_as": str};
    {"status": "not_expressible", "reason": str}; or {"status": "failed", "error": str}.
    Call it from one thread at a time: it sets torch's global SDPA flags while it asks.
    """
    call = sdpa_call(cfg)
    if isinstance(call, str):
        return {"status": NOT_EXPRESSIBLE, "reason": call}
    try:
        return _evaluate(call)
    except Exception as err:  # noqa: BLE001 - a failed evaluation is recorded as such, never as a verdict
        log.warning("fusedattn_select: torch's SDPA rule could not be evaluated for %s: %s: %s",
                    cfg.cache_key(), type(err).__name__, err)
        return {"status": FAILED, "error": f"{type(err).__name__}: {err}", "expressed_as": call.describe()}


@dataclass
class RecordedTorch:
    """torch's answers recorded in snapshot files: per cache key, and each file's torch header."""

    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # file name -> the header's "torch" object ({"version": ...} or {"unavailable": why}); None
    # for a file recorded before snapshots held torch's answers.
    headers: dict[str, dict[str, Any] | None] = field(default_factory=dict)


def _snapshot_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SnapshotError(f"snapshot {path}: cannot be read ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise SnapshotError(f"snapshot {path}: expected a JSON object with a list 'entries'")
    return data


def read_recorded_torch(paths: Iterable[str | Path]) -> RecordedTorch:
    """torch's answers stored in snapshot files by the recorder (entries without one are skipped).

    Entries are indexed by the cache key this library derives from the recorded config, as the
    snapshot engine indexes verdicts; the first file that answers a key wins.
    """
    recorded = RecordedTorch()
    for path in (Path(p) for p in paths):
        data = _snapshot_json(path)
        header = data.get("torch")
        recorded.headers[path.name] = header if isinstance(header, dict) else None
        for index, raw in enumerate(data["entries"]):
            answer = raw.get("torch") if isinstance(raw, dict) else None
            if answer is None:
                continue
            if not isinstance(answer, dict) or "status" not in answer:
                raise SnapshotError(f"snapshot {path}: entries[{index}].torch must be an object with a 'status'")
            try:
                key = AttnConfig.from_dict(raw["config"]).cache_key()
            except (ConfigError, KeyError, TypeError) as err:
                raise SnapshotError(f"snapshot {path}: entries[{index}]: config is not valid here: {err}") from None
            recorded.answers.setdefault(key, answer)
    return recorded


__all__ = [
    "EVALUATED", "FAILED", "NOT_EXPRESSIBLE", "RecordedTorch", "SdpaCall", "read_recorded_torch",
    "sdpa_call", "torch_answer", "torch_platform",
]
