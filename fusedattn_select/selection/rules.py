"""Static pre-filters: cheap, named, version-scoped rules applied before any probe.

A rule only rejects what cuDNN's graph API cannot express, or what a documented known cuDNN bug
makes unsafe although cuDNN accepts it. Each names the platforms it describes (`Rule.platforms`:
cuda for every rule here, so none answers a ROCm question). Everything else is left to the probe:
the probe is the ground truth, these rules only save its cost or guard against known-wrong answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Collection

try:  # PEP 440 comparison where packaging is installed; it is not a dependency
    from packaging.version import InvalidVersion as _InvalidVersion
    from packaging.version import Version as _Version
except ImportError:  # pragma: no cover - depends on the environment
    _Version = _InvalidVersion = None  # type: ignore[assignment,misc]

from fusedattn_select import dtypes
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
# Measured by this project (no upstream report found): the rule's section of the docs, with the recorded runs
# of tools/fp8_dk_check.py that it cites. Paths in this repository.
MEASURED_HERE = "docs/rules.md"
DROPOUT_ONE_ROW_RUN = "tools/results/dropout-row-check-h200.json"
FP8_GQA_BACKWARD_RUNS = ("tools/results/fp8-dk-check-h100.json", "tools/results/fp8-dk-check-fp8-backward-race-h100.json")
# Platforms as Fingerprint.platform names them. A rule describes the platforms in its `platforms` and no other: the
# cuDNN rules say nothing about ROCm, whose answers come from its own declared tables (probing/rocm).
CUDA = "cuda"
ROCM = "rocm"
KNOWN_PLATFORMS = (CUDA, ROCM)
CUDNN_PLATFORMS = (CUDA,)


@dataclass(frozen=True)
class Rule:
    """One pre-filter.

    `backends` and `phases` say what it applies to; `cudnn_versions` is an inclusive range of
    cuDNN backend versions (None = unbounded) and is only checked against a known fingerprint.
    `frontend_versions` is (first affected, first fixed) of cudnn-frontend, a half-open range of
    PEP 440 versions ("1.29.0.dev0" sorts before "1.29.0a0.dev0", before "1.29.0rc1", before
    "1.29.0"; None = unbounded). `sm_archs` holds the compute capabilities it applies to as
    TransformerEngine writes them (90 = 9.0; a `range` for a family), only checked against a known
    device. `condition(cfg, fingerprint)` returns True when the rule rejects. `see_also` holds
    further links (the fix, the upstream guard) next to `source`. `asked_problem`: the condition is
    about the caller's own problem (a decode step's real seqlen_q), so the selector also decides it
    on the problem asked, whichever graph form (a shape bucket, heads as batch) would answer it.
    `platforms`: the platforms the rule describes (every rule here is about cuDNN: cuda only); on any
    other (rule_platform) it never applies.
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
    sm_archs: Collection[int] | None = None
    see_also: tuple[str, ...] = ()
    asked_problem: bool = False
    platforms: tuple[str, ...] = CUDNN_PLATFORMS

    def applies(self, cfg: AttnConfig, fingerprint: Fingerprint) -> bool:
        if cfg.candidate not in self.backends:
            return False
        return self.covers(fingerprint) and self.condition(cfg, fingerprint)

    def covers(self, fingerprint: Fingerprint) -> bool:
        """The platform is one the rule describes, and the cuDNN, cudnn-frontend and device ranges hold it (the
        condition aside)."""
        if rule_platform(fingerprint) not in self.platforms:
            return False
        if not _in_range(fingerprint.cudnn_backend_version, *self.cudnn_versions):
            return False
        if self.frontend_versions != (None, None) and not _frontend_in(fingerprint, *self.frontend_versions):
            return False
        # An unknown device (sm_arch 0) is in no list, as for the version ranges.
        return self.sm_archs is None or fingerprint.sm_arch in self.sm_archs

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


def rule_platform(fingerprint: Fingerprint) -> str:
    """The platform whose rules hold for `fingerprint`: its own where the library knows it (KNOWN_PLATFORMS); any
    other name (an engine from outside the library, a test double standing in for a cuDNN device) is taken as
    cuda, the platform every such engine answered for before ROCm had answers."""
    return fingerprint.platform if fingerprint.platform in KNOWN_PLATFORMS else CUDA


def _in_range(value: int, low: int | None, high: int | None) -> bool:
    """`value` within the inclusive range; an unknown value (0) is outside any bounded range."""
    if low is None and high is None:
        return True
    if value <= 0:
        return False
    return (low is None or value >= low) and (high is None or value <= high)


def frontend_version_key(text: str) -> Any:
    """A sort key of a cudnn-frontend version in PEP 440 order, or None for text that is not a
    version. packaging.version where it is installed (it is not a dependency), else the same order
    for the forms PEP 440 defines without an epoch or local label (see _pep440_key)."""
    if _Version is not None:
        try:
            return _Version(text.strip())
        except _InvalidVersion:
            return None
    return _pep440_key(text)


# release, then an optional pre-release (a|b|rc N), post-release (.post N) and development build (.dev N)
_PEP440 = re.compile(r"v?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|rc)[-_.]?(\d+))?(?:[-_.]?post[-_.]?(\d+))?"
                     r"(?:[-_.]?dev[-_.]?(\d+))?", re.IGNORECASE)
_PRE_RANK = {"a": 0, "b": 1, "rc": 2}


def _pep440_key(text: str) -> tuple | None:
    """PEP 440's order as a tuple: 1.29.0.dev1 < 1.29.0a1 < 1.29.0rc1.dev3 < 1.29.0rc1 < 1.29.0 <
    1.29.0.post1 < 1.29.1; 1.29 == 1.29.0."""
    match = _PEP440.fullmatch(text.strip())
    if match is None:
        return None
    release, pre, pre_number, post, dev = match.groups()
    numbers = [int(part) for part in release.split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    if pre is not None:
        pre_key = (_PRE_RANK[pre.lower()], int(pre_number))
    else:  # a development build of the release itself sorts before every pre-release of it
        pre_key = (-1, 0) if dev is not None and post is None else (3, 0)
    post_key = -1 if post is None else int(post)
    dev_key = (1, 0) if dev is None else (0, int(dev))
    return (tuple(numbers), pre_key, post_key, dev_key)


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
    # PyTorch's guard tests the caller's s_q == 1 (asked_problem: the selector decides it on the
    # problem asked too, not only on a bucket form whose S_q is larger) and leaves out 9.24.1.
    return cfg.seqlen_q == 1 and fingerprint.cudnn_backend_version != 92401


def _masked_fp8_d256(cfg: AttnConfig, fingerprint: Fingerprint) -> bool:
    # The fix (PR 985) names the masked softmax variants of the d256 kernel; no-mask was always
    # right. A padding mask alone is served through sequence lengths, not a masked variant.
    masked = cfg.mask not in ("no_mask", "padding") or tuple(cfg.window_size) != (-1, -1)
    return cfg.head_dim_qk == 256 and cfg.resolved_head_dim_v == 256 and masked


def _dense_dropout_one_row(cfg: AttnConfig, fingerprint: Fingerprint) -> bool:
    # Where the illegal memory access was measured: one query row, head dim 64, 384-512 keys (not at
    # 128, 256 or from 513 on; 257-383 not measured: refused with the crashing range). The ragged
    # graph of the same problem's shape bucket ran; other head dims did not crash.
    return (cfg.dropout > 0 and cfg.seqlen_q == 1 and cfg.head_dim_qk == 64 and 256 < cfg.seqlen_kv <= 512
            and not cfg.layout.ragged)


def _gqa_fp8_gradients(cfg: AttnConfig, fingerprint: Fingerprint) -> bool:
    # Where the differing dK was measured: query heads sharing a KV head, gradients written in FP8.
    # MHA problems of the same sizes repeated exactly; FP8 backwards with 16-bit gradients are not covered.
    return (cfg.is_training and cfg.num_heads_q != cfg.num_heads_kv
            and dtypes.BY_NAME[cfg.resolved_dqkv_dtype].is_fp8)


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
        F16, BOTH,  # PyTorch guards the forward and the backward (fprop and bprop, dense and nested)
        _decode_step,
        "known cuDNN 9.19-9.25.0 bug on SM 10.x/11.x: SDPA with seqlen_q == 1 (decode) silently "
        "returns wrong output (PyTorch disables it; 9.24.1 is not affected); upgrade cuDNN past 9.25.0",
        PYTORCH_DECODE_GUARD, cudnn_versions=(91900, 92500), known_bug=True, sm_archs=range(100, 120),
        see_also=(PYTORCH_DECODE_ISSUE,), asked_problem=True,
    ),
    Rule(
        "cudnn-frontend-1.29-dev-fp8-d256-masked",
        FP8, FWD,
        _masked_fp8_d256,
        "known cudnn-frontend 1.29.0 development-build bug on SM 10.0/10.3: FP8 forward at head dim "
        "256 with a causal mask or window silently returns wrong output; use cudnn-frontend 1.29.0 "
        "or newer",
        # Every 1.29.0.devN nightly and nothing after: "1.29.0a0.dev0" is the first pre-release form,
        # and 1.29.0 pre-releases (a, b, rc) are taken as fixed like the release (docs/rules.md).
        CUDNN_FE_FP8_D256_ISSUE, known_bug=True, frontend_versions=("1.29.0.dev0", "1.29.0a0.dev0"),
        sm_archs=(100, 103), see_also=(CUDNN_FE_FP8_D256_FIX, CUDNN_FE_FP8_D256_KERNEL),
    ),
    Rule(
        "cudnn-9.19-hopper-dropout-one-query-row",
        F16, BOTH,  # the forward crashed: a training problem runs it too
        _dense_dropout_one_row,
        "measured cuDNN 9.19 bug on Hopper: the dense SDPA forward with dropout, one query row "
        "(seqlen_q == 1), head dim 64 and 257-512 keys makes an illegal memory access, which leaves the "
        "process's CUDA context unusable; its shape bucket's ragged graph runs it",
        MEASURED_HERE, cudnn_versions=(91900, 91999), known_bug=True, sm_archs=(90,),
        see_also=(DROPOUT_ONE_ROW_RUN,),
    ),
    Rule(
        "cudnn-9.19-hopper-fp8-dropout",
        FP8, BOTH,  # the forward crashed: a training problem runs it too
        lambda cfg, fp: cfg.dropout > 0,
        "measured cuDNN 9.19 bug on Hopper: the FP8 SDPA forward with dropout builds execution plans "
        "(head dim 64) that make an illegal memory access when run, which leaves the process's CUDA "
        "context unusable; run dropout in fp16/bf16",
        MEASURED_HERE, cudnn_versions=(91900, 91999), known_bug=True, sm_archs=(90,),
    ),
    Rule(
        "cudnn-9.19-hopper-fp8-gqa-backward",
        FP8, BWD,
        _gqa_fp8_gradients,
        "measured cuDNN 9.19 bug on Hopper: the FP8 backward with grouped KV heads (num_heads_q != "
        "num_heads_kv) and FP8 gradients writes a different dK on the same inputs from run to run, "
        "at times far off the reference; run the backward in fp16/bf16",
        MEASURED_HERE, cudnn_versions=(91900, 91999), known_bug=True, sm_archs=(90,),
        see_also=FP8_GQA_BACKWARD_RUNS,
    ),
)


def asked_problem_rules(fingerprint: Fingerprint) -> tuple[Rule, ...]:
    """The rules about the caller's own problem whose versions and devices hold `fingerprint`."""
    return tuple(rule for rule in RULES if rule.asked_problem and rule.covers(fingerprint))


def refuses_as_asked(rules: tuple[Rule, ...], cfg: AttnConfig, fingerprint: Fingerprint) -> bool:
    """One of `rules` (asked_problem_rules) rejects a pass of `cfg` itself."""
    return any(rule.applies(cfg, fingerprint) and not set(rule.phases).isdisjoint(cfg.phases) for rule in rules)


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
