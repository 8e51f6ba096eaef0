"""Static pre-filters: cheap, named, version-scoped rules applied before any probe.

A rule only rejects what cuDNN's graph API cannot express, or what a documented known cuDNN bug
makes unsafe although cuDNN accepts it. Everything else is left to the probe: the probe is the
ground truth, these rules only save its cost or guard against known-wrong answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fusedattn_select.config import AttnConfig
from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, Provenance, Verdict

# Where a rule comes from: the TransformerEngine selector that still guards these cases.
TE_SELECTOR = (
    "https://github.com/NVIDIA/TransformerEngine/blob/main/"
    "transformer_engine/common/fused_attn/fused_attn.cpp (nvte_get_fused_attn_backend)"
)
CUDNN_FE_SDPA_FP8 = "https://github.com/NVIDIA/cudnn-frontend/blob/main/docs/operations/Attention.md"
# Silent-corruption reports: the graph builds and check_support passes, yet the output is wrong.
PYTORCH_DECODE_GUARD = "https://github.com/pytorch/pytorch/pull/194927"
PYTORCH_DECODE_ISSUE = "https://github.com/pytorch/pytorch/issues/193893"
CUDNN_FE_FP8_D256_ISSUE = "https://github.com/NVIDIA/cudnn-frontend/issues/981"
CUDNN_FE_FP8_D256_KERNEL = "https://github.com/NVIDIA/cudnn-frontend/pull/860"
CUDNN_FE_FP8_D256_FIX = "https://github.com/NVIDIA/cudnn-frontend/pull/985"


@dataclass(frozen=True)
class Rule:
    """One pre-filter.

    `backends` and `phases` say what it applies to; `cudnn_versions` is an inclusive range of
    cuDNN backend versions (None = unbounded) and is only checked against a known fingerprint.
    `frontend_versions` is (first affected, first fixed) of cudnn-frontend, a half-open range of
    PEP 440 versions ("1.29.0.dev0" sorts before "1.29.0"; None = unbounded). `sm_archs` is an
    inclusive range of compute capabilities as TransformerEngine writes them (90 = 9.0), only
    checked against a known device. `condition(cfg, fingerprint)` returns True when the rule
    rejects. `see_also` holds further links (the fix, the upstream guard) next to `source`.
    """

    name: str
    backends: tuple[Backend, ...]
    phases: tuple[Phase, ...]
    condition: Callable[[AttnConfig, Fingerprint], bool]
    reason: str
    source: str
    cudnn_versions: tuple[int | None, int | None] = (None, None)
    known_bug: bool = False
    frontend_versions: tuple[str | None, str | None] = (None, None)
    sm_archs: tuple[int, int] | None = None
    see_also: tuple[str, ...] = ()

    def applies(self, cfg: AttnConfig, fingerprint: Fingerprint) -> bool:
        if cfg.candidate not in self.backends:
            return False
        if not _in_range(fingerprint.cudnn_backend_version, *self.cudnn_versions):
            return False
        if self.frontend_versions != (None, None) and not _frontend_in(fingerprint, *self.frontend_versions):
            return False
        if self.sm_archs is not None and not _in_range(fingerprint.sm_arch, *self.sm_archs):
            return False
        return self.condition(cfg, fingerprint)

    def verdict(self, cfg: AttnConfig, phase: Phase) -> Verdict:
        return Verdict(
            backend=cfg.candidate,
            phase=phase,
            outcome=Outcome.UNSUPPORTED,
            stage=f"rule:{self.name}",
            message=self.reason,
            detail=f"{self.reason} (source: {' '.join((self.source, *self.see_also))})",
            provenance=Provenance.RULE,
        )


def _in_range(value: int, low: int | None, high: int | None) -> bool:
    """`value` within the inclusive range; an unknown value (0) is outside any bounded range."""
    if low is None and high is None:
        return True
    if value <= 0:
        return False
    return (low is None or value >= low) and (high is None or value <= high)


def frontend_version_key(text: str) -> tuple[int, ...] | None:
    """A sort key of a cudnn-frontend version as PEP 440 orders the forms it ships ("1.32.0",
    "1.29.0.dev66375696", "1.29.0rc1": a dev build before a pre-release before the release);
    None for text that is not such a version."""
    release, _, dev = text.strip().partition(".dev")
    pre = ""
    for marker in ("rc", "b", "a"):
        if marker in release:
            release, _, pre = release.partition(marker)
            break
    parts = release.split(".")
    if not all(p.isdigit() for p in parts) or (dev and not dev.isdigit()) or (pre and not pre.isdigit()):
        return None
    numbers = tuple(int(p) for p in parts) + (0,) * (3 - len(parts))
    # dev (0) < pre-release (1) < release (2); the number after each orders builds of one kind.
    stage = 0 if dev else 1 if pre else 2
    return (*numbers[:3], stage, int(dev or pre or 0))


def _frontend_in(fingerprint: Fingerprint, first_affected: str | None, first_fixed: str | None) -> bool:
    version = frontend_version_key(fingerprint.cudnn_frontend_version)
    if version is None:  # unknown: as with the cuDNN version, a version-scoped rule does not fire
        return False
    if first_affected is not None and version < frontend_version_key(first_affected):
        return False
    return first_fixed is None or version < frontend_version_key(first_fixed)


BOTH = (Phase.FORWARD, Phase.BACKWARD)
FWD = (Phase.FORWARD,)
BWD = (Phase.BACKWARD,)
F16 = (Backend.F16,)
FP8 = (Backend.FP8,)


def _non_padding(cfg: AttnConfig) -> bool:
    return not cfg.has_padding


def _decode_step(cfg: AttnConfig, fingerprint: Fingerprint) -> bool:
    # PyTorch's guard tests the graph's own s_q == 1 and leaves out 9.24.1, which did not corrupt.
    return cfg.seqlen_q == 1 and fingerprint.cudnn_backend_version != 92401


def _masked_fp8_d256(cfg: AttnConfig, fingerprint: Fingerprint) -> bool:
    # The fix (PR 985) names the masked softmax variants of the d256 kernel; no-mask was always
    # right. A padding mask alone is served through sequence lengths, not a masked variant.
    masked = cfg.mask not in ("no_mask", "padding") or tuple(cfg.window_size) != (-1, -1)
    return cfg.head_dim_qk == 256 and cfg.resolved_head_dim_v == 256 and masked


RULES: tuple[Rule, ...] = (
    Rule(
        "pre-scale-bias",
        F16 + FP8, BOTH,
        lambda cfg, fp: cfg.bias == "pre_scale_bias",
        "cuDNN's SDPA graph adds the bias after scaling; a pre-scale bias cannot be expressed",
        CUDNN_FE_SDPA_FP8,
    ),
    Rule(
        "fp8-bias",
        FP8, BOTH,
        lambda cfg, fp: cfg.bias != "no_bias",
        "cuDNN's FP8 SDPA (sdpa_fp8) takes no bias or ALiBi input",
        CUDNN_FE_SDPA_FP8,
    ),
    Rule(
        "fp8-max-logit",
        FP8, FWD,
        lambda cfg, fp: cfg.return_max_logit,
        "cuDNN's FP8 SDPA cannot return the max logit",
        TE_SELECTOR,
    ),
    Rule(
        "fp8-layout",
        FP8, BOTH,
        lambda cfg, fp: cfg.layout.ragged or cfg.layout.paged,
        "cuDNN's FP8 SDPA has no ragged (THD) or paged-KV inputs; use BSHD, SBHD or BHSD",
        CUDNN_FE_SDPA_FP8,
    ),
    Rule(
        "cudnn-9.10.0-fp8",
        FP8, BOTH,
        lambda cfg, fp: True,
        "known cuDNN 9.10.0 bugs in FP8 SDPA; upgrade cuDNN to 9.10.2 or newer",
        TE_SELECTOR, cudnn_versions=(91000, 91000), known_bug=True,
    ),
    Rule(
        "cudnn-9.10.0-9.10.1-f16",
        F16, BOTH,
        lambda cfg, fp: True,
        "known cuDNN 9.10.0/9.10.1 bugs in F16 SDPA; upgrade cuDNN to 9.10.2 or newer",
        TE_SELECTOR, cudnn_versions=(91000, 91001), known_bug=True,
    ),
    Rule(
        "cudnn-9.14.0-window-non-causal",
        F16, BOTH,
        lambda cfg, fp: cfg.seqlen_kv > 1024 and cfg.window_size[0] != -1
        and cfg.mask not in ("causal", "causal_bottom_right"),
        "known cuDNN 9.14.0 bug: sliding window with a non-causal mask and seqlen_kv > 1024; "
        "upgrade cuDNN",
        TE_SELECTOR, cudnn_versions=(91400, 91400), known_bug=True,
    ),
    Rule(
        "cudnn-le-9.15.0-cuda-graph-training",
        F16, BWD,
        lambda cfg, fp: cfg.is_training and cfg.cuda_graph and _non_padding(cfg)
        and cfg.q_format in ("bshd", "sbhd") and cfg.seqlen_kv % 128 != 0,
        "known cuDNN <= 9.15.0 bug: backward under CUDA-graph capture with a non-padding mask, "
        "BSHD/SBHD and seqlen_kv not divisible by 128; upgrade to cuDNN 9.15.1+",
        TE_SELECTOR, cudnn_versions=(None, 91500), known_bug=True,
    ),
    Rule(
        "cudnn-9.11-hopper-mla-backward",
        F16, BWD,
        lambda cfg, fp: fp.sm_arch == 90 and cfg.head_dim_qk >= 128 and cfg.resolved_head_dim_v >= 128
        and cfg.head_dim_qk != cfg.resolved_head_dim_v
        and not (cfg.head_dim_qk == 192 and cfg.resolved_head_dim_v == 128),
        "known cuDNN >= 9.11 bug on Hopper: backward with 128 <= head dims and head_dim_qk != "
        "head_dim_v (other than 192/128)",
        TE_SELECTOR, cudnn_versions=(91100, None), known_bug=True,
    ),
    Rule(
        "cudnn-9.19-9.25.0-blackwell-decode",
        F16, FWD,
        _decode_step,
        "known cuDNN 9.19-9.25.0 bug on SM 10.x/11.x: SDPA with seqlen_q == 1 (decode) silently "
        "returns wrong output (PyTorch disables it; 9.24.1 is not affected); upgrade cuDNN past 9.25.0",
        PYTORCH_DECODE_GUARD, cudnn_versions=(91900, 92500), known_bug=True, sm_archs=(100, 119),
        see_also=(PYTORCH_DECODE_ISSUE,),
    ),
    Rule(
        "cudnn-frontend-1.29-dev-fp8-d256-masked",
        FP8, FWD,
        _masked_fp8_d256,
        "known cudnn-frontend 1.29.0 development-build bug on SM 10.0/10.3: FP8 forward at head dim "
        "256 with a causal mask or window silently returns wrong output; use cudnn-frontend 1.29.0 "
        "or newer",
        CUDNN_FE_FP8_D256_ISSUE, known_bug=True, frontend_versions=("1.29.0.dev0", "1.29.0"),
        sm_archs=(100, 103), see_also=(CUDNN_FE_FP8_D256_FIX, CUDNN_FE_FP8_D256_KERNEL),
    ),
)


def rules_by_name() -> dict[str, Rule]:
    return {rule.name: rule for rule in RULES}


def apply_rules(cfg: AttnConfig, fingerprint: Fingerprint, phase: Phase) -> Verdict | None:
    """The first rule that rejects `phase` of `cfg` on this platform, as a verdict; else None."""
    for rule in RULES:
        if phase in rule.phases and rule.applies(cfg, fingerprint):
            return rule.verdict(cfg, phase)
    return None


NO_PLATFORM_MESSAGE = (
    "no CUDA device with cuDNN to probe ({detail}): {probe}or answer from recorded snapshots "
    "(--snapshot FILE, --target h100|h200, FUSEDATTN_SELECT_SNAPSHOT or fusedattn_select.use_snapshots())"
)
_PROBE_HINT = "probe on a GPU machine with fusedattn-select[cuda], "


def no_platform_verdict(cfg: AttnConfig, phase: Phase, detail: str) -> Verdict:
    """The platform rule: without a device or snapshot there is no ground truth to answer with."""
    # The reason an engine is missing may already name the extra to install: say it once.
    probe = "" if "fusedattn-select[cuda]" in detail else _PROBE_HINT
    message = NO_PLATFORM_MESSAGE.format(detail=detail, probe=probe)
    return Verdict(
        backend=cfg.candidate, phase=phase, outcome=Outcome.NO_DATA,
        stage="rule:platform", message=message, detail=message, provenance=Provenance.RULE,
    )
