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


@dataclass(frozen=True)
class Rule:
    """One pre-filter.

    `backends` and `phases` say what it applies to; `cudnn_versions` is an inclusive range of
    cuDNN backend versions (None = unbounded) and is only checked against a known fingerprint.
    `condition(cfg, fingerprint)` returns True when the rule rejects.
    """

    name: str
    backends: tuple[Backend, ...]
    phases: tuple[Phase, ...]
    condition: Callable[[AttnConfig, Fingerprint], bool]
    reason: str
    source: str
    cudnn_versions: tuple[int | None, int | None] = (None, None)
    known_bug: bool = False

    def applies(self, cfg: AttnConfig, fingerprint: Fingerprint) -> bool:
        if cfg.candidate not in self.backends:
            return False
        low, high = self.cudnn_versions
        if low is not None or high is not None:
            version = fingerprint.cudnn_backend_version
            if version <= 0:
                return False
            if low is not None and version < low:
                return False
            if high is not None and version > high:
                return False
        return self.condition(cfg, fingerprint)

    def verdict(self, cfg: AttnConfig, phase: Phase) -> Verdict:
        return Verdict(
            backend=cfg.candidate,
            phase=phase,
            outcome=Outcome.UNSUPPORTED,
            stage=f"rule:{self.name}",
            message=self.reason,
            detail=f"{self.reason} (source: {self.source})",
            provenance=Provenance.RULE,
        )


BOTH = (Phase.FORWARD, Phase.BACKWARD)
FWD = (Phase.FORWARD,)
BWD = (Phase.BACKWARD,)
F16 = (Backend.F16,)
FP8 = (Backend.FP8,)


def _non_padding(cfg: AttnConfig) -> bool:
    return not cfg.has_padding


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
