"""`matrix --compare torch`: where PyTorch's own SDPA rule for cuDNN disagrees with cuDNN's answer.

cuDNN's answer is the matrix's (a probe, live or recorded). torch's answer is the one torch gave
on the device (probing.torch_rules): recorded in the snapshot, or asked live. Where torch's answer
was not recorded the comparison says "torch not recorded" and counts it, never guesses one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from fusedattn_select.cli.matrix_data import FAILED, NO_DATA, NONE, Problem
from fusedattn_select.probing import torch_rules

AGREE = "agree"
DISAGREE = "disagree"
TORCH_NOT_RECORDED = "torch not recorded"
NOT_EXPRESSIBLE = "not expressible in SDPA"
TORCH_FAILED = "torch rule failed"
CUDNN_NO_DATA = "cuDNN no data"
KINDS = (DISAGREE, AGREE, NOT_EXPRESSIBLE, TORCH_FAILED, TORCH_NOT_RECORDED, CUDNN_NO_DATA)


@dataclass(frozen=True)
class Comparison:
    """One problem: cuDNN's answer, torch's, and which kind of (dis)agreement it is."""

    problem: Problem
    kind: str
    cudnn: str
    torch: str
    torch_reason: str
    sdpa_choice: str

    def to_dict(self) -> dict[str, Any]:
        return {"suite": self.problem.suite, "name": self.problem.name, "kind": self.kind, "cudnn": self.cudnn,
                "torch": self.torch, "torch_reason": self.torch_reason, "sdpa_choice": self.sdpa_choice}


def _torch_verdict(answer: Mapping[str, Any] | None) -> tuple[str, str, str, str]:
    """(kind when not comparable or "", torch's answer, its reason, torch's SDPA choice)."""
    if answer is None:
        return TORCH_NOT_RECORDED, "not recorded", "", ""
    status = answer.get("status")
    if status == torch_rules.NOT_EXPRESSIBLE:
        return NOT_EXPRESSIBLE, "not expressible", str(answer.get("reason", "")), ""
    if status != torch_rules.EVALUATED:
        return TORCH_FAILED, "failed", str(answer.get("error", status)), ""
    accepts = bool(answer.get("cudnn"))
    reasons = [str(r) for r in answer.get("cudnn_reasons", ())]
    reason = "; ".join(reasons) if reasons else ("" if accepts else "(torch gave no reason)")
    return "", "cuDNN" if accepts else "refuses cuDNN", reason, str(answer.get("sdpa_choice", ""))


def compare(problems: Sequence[Problem], answers: Mapping[str, Mapping[str, Any]]) -> list[Comparison]:
    """One Comparison per problem, torch's answer looked up by the problem's cache key."""
    result = []
    for problem in problems:
        kind, torch_text, reason, choice = _torch_verdict(answers.get(problem.config.cache_key()))
        cudnn = problem.answer
        if cudnn in (NO_DATA, FAILED):
            kind = CUDNN_NO_DATA
        elif not kind:
            cudnn_accepts = cudnn != NONE
            torch_accepts = torch_text == "cuDNN"
            kind = AGREE if cudnn_accepts == torch_accepts else DISAGREE
        result.append(Comparison(problem, kind, cudnn, torch_text, reason, choice))
    return result


def counts(comparisons: Sequence[Comparison]) -> dict[str, int]:
    """How many problems of each kind, every kind listed (0 included)."""
    tally = {kind: 0 for kind in KINDS}
    for comparison in comparisons:
        tally[comparison.kind] += 1
    return tally


def describe_problem(problem: Problem) -> str:
    """The fields a reader needs to see why the two disagree, in one short string."""
    cfg = problem.config
    dv = cfg.resolved_head_dim_v
    head = f"d{cfg.head_dim_qk}" + ("" if dv == cfg.head_dim_qk else f"/{dv}")
    parts = [cfg.qkv_dtype, "train" if cfg.is_training else "infer", head, cfg.mask, cfg.qkv_layout]
    if cfg.num_heads_q != cfg.num_heads_kv:
        parts.append(f"gqa{cfg.num_heads_q // cfg.num_heads_kv}")
    if cfg.seqlen_q != cfg.seqlen_kv:
        parts.append(f"s{cfg.seqlen_q}/{cfg.seqlen_kv}")
    if tuple(cfg.window_size) != (-1, -1):
        parts.append(f"window={list(cfg.window_size)}")
    if cfg.bias != "no_bias":
        parts.append(cfg.bias)
    if cfg.dropout:
        parts.append(f"dropout={cfg.dropout}")
    if cfg.deterministic:
        parts.append("deterministic")
    return " ".join(parts)


def torch_versions(headers: Mapping[str, Mapping[str, Any] | None]) -> str:
    """"file: torch 2.11.0+cu130 (cuDNN 91900)" per file, or why a file holds no torch answers."""
    parts = []
    for name, header in headers.items():
        if header is None:
            parts.append(f"{name}: recorded before snapshots held torch's answers")
        elif "unavailable" in header:
            parts.append(f"{name}: torch not available when recorded ({header['unavailable']})")
        else:
            parts.append(f"{name}: torch {header.get('version')} (cuDNN {header.get('cudnn_version')})")
    return "; ".join(parts)
