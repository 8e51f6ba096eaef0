"""What would work instead: for a NONE answer, other problems the same engine supports.

An alternative is another problem, one or two fields away from the one asked (its head dim padded
to a size the kernels take, another layout, fp16 instead of bf16, deterministic off, no dropout,
inference instead of training, another mask form, an FP8 forward with a bf16 backward, ...), that
the selector which answered NONE answers with a backend: live probes on a GPU, recorded rows from a
snapshot. Alternatives are suggestions labelled as other problems; nothing here changes the answer
for the problem asked.

Cost is bounded: candidates are asked in a fixed order, cheapest change first, each through
`Selector.select` (its cache, rules and engine), and at most `max_probes` candidate problems are
asked (DEFAULT_MAX_PROBES unless set). A candidate a rule answers costs no device time but counts.
From a snapshot, recorded supported problems within two fields of the one asked are candidates too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.layouts import SEPARATE_LAYOUTS
from fusedattn_select.probing.nearest import RecordedProblem, closeness, counted, differences
from fusedattn_select.result import Alternative, Change, Selection
from fusedattn_select.types import Backend, Outcome, Phase, ProbeDepth

DEFAULT_LIMIT = 3
DEFAULT_MAX_PROBES = 16
MAX_CHANGED_FIELDS = 2
# Head dims cuDNN's SDPA kernels are built around; a padded head dim is tried at the next multiple
# of 8 (cuDNN's alignment) and then at these, smallest first.
HEAD_DIM_SIZES = (64, 96, 128, 192, 256)
PAD_TRIES = 3
_MODEL_FIELDS = frozenset(("num_heads_q", "num_heads_kv"))
_HEAD_DIMS = frozenset(("head_dim_qk", "head_dim_v"))
# Layouts with Q, K and V in one memory order, tried in this order.
UNIFORM_LAYOUTS = ("bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd")
# Same result as asked, by construction: a mask form equal on these shapes, another memory layout.
_SAME_RESULT_MASKS = {
    "causal": "causal_bottom_right", "causal_bottom_right": "causal",
    "padding_causal": "padding_causal_bottom_right", "padding_causal_bottom_right": "padding_causal",
}


class Answers(Protocol):
    """What alternatives are asked through: a Selector (its rules, cache and engine). A protocol,
    not an import: selector.select(alternatives=True) imports this module."""

    engine: Any

    def select(self, cfg: AttnConfig, probe_depth: str | ProbeDepth = ProbeDepth.FAST) -> Selection: ...


@dataclass(frozen=True)
class Candidate:
    """A problem to ask about: its kind, the config(s), and what using it takes."""

    kind: str
    configs: tuple[AttnConfig, ...]
    note: str = ""
    extra_flops_percent: float | None = None


@dataclass(frozen=True)
class Search:
    """The alternatives found for one answer, and what finding them spent."""

    alternatives: tuple[Alternative, ...]
    probes: int
    max_probes: int
    capped: bool


def find(selector: Answers, selection: Selection, *, limit: int = DEFAULT_LIMIT,
         max_probes: int = DEFAULT_MAX_PROBES, probe_depth: str | ProbeDepth | None = None) -> Search:
    """Up to `limit` alternatives for `selection` (an answer of `selector`), asking at most
    `max_probes` candidate problems at `probe_depth` (default: the depth of the answer's verdicts).
    Only a refusal has alternatives: a selected answer, no data or a failed probe get none."""
    _check_count("limit", limit)
    _check_count("max_probes", max_probes)
    cfg = selection.config
    if cfg is None or selection.selected or not any(v.outcome is Outcome.UNSUPPORTED for v in selection.verdicts):
        return Search((), 0, max_probes, False)
    depth = _depth(selection, probe_depth)
    found: list[Alternative] = []
    kinds: set[str] = set()
    asked: set[str] = {cfg.cache_key()}
    probes, capped = 0, False
    for candidate in candidates(cfg, selection, selector):
        if len(found) >= limit:
            break
        keys = [c.cache_key() for c in candidate.configs]
        if candidate.kind in kinds or all(key in asked for key in keys):
            continue
        if probes + len(keys) > max_probes:
            capped = True
            break
        answers = tuple(selector.select(c, depth) for c in candidate.configs)
        probes += len(keys)
        asked.update(keys)
        alternative = _alternative(cfg, candidate, answers)
        if alternative is not None:
            found.append(alternative)
            kinds.add(candidate.kind)
    return Search(tuple(found), probes, max_probes, capped)


def with_alternatives(selector: Answers, selection: Selection, *, limit: int = DEFAULT_LIMIT,
                      max_probes: int = DEFAULT_MAX_PROBES, probe_depth: str | ProbeDepth | None = None) -> Selection:
    """`selection` with its alternatives filled in (see find); the answer itself is unchanged."""
    search = find(selector, selection, limit=limit, max_probes=max_probes, probe_depth=probe_depth)
    return dataclasses.replace(selection, alternatives=search.alternatives, alternative_probes=search.probes)


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(name, value, "must be a non-negative integer")


def _depth(selection: Selection, asked: str | ProbeDepth | None) -> ProbeDepth:
    if asked is not None:
        return ProbeDepth.parse(asked)
    depths = {v.depth for v in selection.verdicts}
    return ProbeDepth.FULL if ProbeDepth.FULL in depths else ProbeDepth.FAST


# ----- candidates, cheapest change first -----------------------------------------------------------
def candidates(cfg: AttnConfig, selection: Selection, selector: Answers) -> Iterator[Candidate]:
    """Every candidate for `cfg`, in the order they are asked: changes that keep the result first
    (a mask form equal on these shapes, another layout, FP8 output), then switches (deterministic,
    CUDA graphs), padding, other dtypes, and last the changes that alter what is computed
    (dropout, training); from a snapshot, its recorded supported neighbours after them."""
    refused = {v.phase for v in selection.verdicts if not v.supported}
    for move in (_mask_form, _layouts, _fp8_output, _switches, _padded_head_dims, _dtypes,
                 _fp8_forward_bf16_backward, _no_dropout, _inference):
        for candidate in _valid(move(cfg, refused)):
            if _changed_fields(cfg, candidate.configs[0]) <= MAX_CHANGED_FIELDS:
                yield candidate
    yield from _recorded_neighbours(cfg, selector)


def _valid(moves: Iterator[Candidate]) -> Iterator[Candidate]:
    """The candidates of one move until one is not a valid problem (AttnConfig refuses the change)."""
    try:
        yield from moves
    except ConfigError:  # e.g. a mask form the layout cannot take: this move has nothing to offer
        return


def _mask_form(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    other = _SAME_RESULT_MASKS.get(cfg.mask)
    if other is not None and cfg.seqlen_q == cfg.seqlen_kv and cfg.bottom_right_diagonal is None:
        yield Candidate("another mask form", (cfg.replace(mask=other),),
                        "same result: seqlen_q == seqlen_kv puts both diagonals in one place")
    if cfg.mask == "no_mask":
        yield Candidate("padding mask", (cfg.replace(mask="padding"),),
                        "same result with every sequence at its full length")


def _layouts(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.qkv_layout not in SEPARATE_LAYOUTS or cfg.page_size is not None:
        return
    for layout in UNIFORM_LAYOUTS:
        if layout != cfg.qkv_layout:
            yield Candidate("another layout", (cfg.replace(qkv_layout=layout),),
                            "same result; the tensors in another memory order (a transpose copy or a view)")


def _fp8_output(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.is_fp8 and cfg.resolved_o_dtype != cfg.qkv_dtype:
        yield Candidate("FP8 output", (cfg.replace(o_dtype=cfg.qkv_dtype),),
                        "O in FP8 (as TransformerEngine's fp8_mha keeps it) instead of fp16/bf16")


def _switches(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.deterministic and cfg.is_training:
        yield Candidate("deterministic off", (cfg.replace(deterministic=False),),
                        "the backward may sum in a different order from run to run")
    if cfg.cuda_graph:
        yield Candidate("no CUDA-graph capture", (cfg.replace(cuda_graph=False),), "run this layer eagerly")


def _padded_head_dims(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    qk, v = cfg.head_dim_qk, cfg.resolved_head_dim_v
    sizes = sorted({-(-qk // 8) * 8, *HEAD_DIM_SIZES} - {qk})
    larger = [size for size in sizes if size > qk and size >= v][:PAD_TRIES]
    for size in larger:
        padded = cfg.replace(head_dim_qk=size, head_dim_v=None if cfg.head_dim_v is None or v == qk else size)
        if padded.resolved_head_dim_v < v:
            continue
        yield Candidate("pad head dim", (padded,), "zero-pad Q, K and V to the new head dim; slice the output",
                        extra_flops_percent=_extra_flops(qk, v, size, padded.resolved_head_dim_v))
    if v < qk:
        yield Candidate("pad head_dim_v", (cfg.replace(head_dim_v=qk),), "zero-pad V; slice the output",
                        extra_flops_percent=_extra_flops(qk, v, qk, qk))


def _extra_flops(qk: int, v: int, padded_qk: int, padded_v: int) -> float:
    """Extra attention FLOPs in percent: QK^T scales with head_dim_qk, PV with head_dim_v."""
    return ((padded_qk + padded_v) / (qk + v) - 1.0) * 100.0


def _dtypes(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.qkv_dtype in ("fp16", "bf16"):
        other = "fp16" if cfg.qkv_dtype == "bf16" else "bf16"
        fields = {name: None for name in ("o_dtype", "do_dtype", "dqkv_dtype") if getattr(cfg, name) is not None}
        yield Candidate(f"{other} instead of {cfg.qkv_dtype}", (cfg.replace(qkv_dtype=other, **fields),),
                        "another 16-bit format: other rounding, other range")
    elif cfg.is_fp8:
        yield Candidate("bf16 instead of FP8", (_as_bf16(cfg),), "the F16 backend at bf16")


def _as_bf16(cfg: AttnConfig) -> AttnConfig:
    return cfg.replace(qkv_dtype="bf16", o_dtype=None, do_dtype=None, dqkv_dtype=None, scaling_mode=None)


def _fp8_forward_bf16_backward(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.is_fp8 and cfg.is_training and refused == {Phase.BACKWARD}:
        yield Candidate("FP8 forward, bf16 backward", (cfg.replace(is_training=False), _as_bf16(cfg)),
                        "the forward in FP8 and the backward in bf16 (TransformerEngine: NVTE_FP8_DPA_BWD=0)")


def _no_dropout(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.dropout:
        yield Candidate("no dropout", (cfg.replace(dropout=0.0),), "attention dropout off: changes training")


def _inference(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.is_training and refused == {Phase.BACKWARD}:
        yield Candidate("inference instead of training", (cfg.replace(is_training=False),),
                        "forward only: no gradients through this layer")


def _recorded_neighbours(cfg: AttnConfig, selector: Answers) -> Iterator[Candidate]:
    """From a snapshot: recorded problems it answers with a backend, within two fields, closest first."""
    recorded = getattr(selector.engine, "recorded", ())
    near = []
    for problem in recorded:
        if problem.backend is Backend.NONE:
            continue
        found = counted(differences(cfg, problem))
        # A model fixes its head counts, and a head dim can be padded but never shrunk.
        if any(d.field in _MODEL_FIELDS or (d.field in _HEAD_DIMS and d.recorded < d.asked) for d in found):
            continue
        if 0 < len(found) <= MAX_CHANGED_FIELDS:
            near.append((closeness(cfg, problem, found), problem))
    for _, problem in sorted(near, key=lambda item: item[0]):
        yield Candidate(f"recorded problem {problem.label}", (problem.config,),
                        f"recorded in {problem.file_name}")


def _changed_fields(cfg: AttnConfig, other: AttnConfig) -> int:
    return len(counted(differences(cfg, _as_recorded(other))))


def _as_recorded(config: AttnConfig) -> RecordedProblem:
    return RecordedProblem(name="", suite="", file_name="", config=config, verdicts=())


# ----- answers into alternatives -------------------------------------------------------------------
def _alternative(cfg: AttnConfig, candidate: Candidate, answers: tuple[Selection, ...]) -> Alternative | None:
    """The alternative `answers` make of `candidate`, or None where the engine does not select it."""
    if len(answers) == 1:
        (answer,) = answers
        if not answer.selected:
            return None
        verdicts, backend, plan_form, engine = answer.verdicts, answer.backend, answer.plan_form, answer.engine
    else:
        forward, backward = answers
        fwd = tuple(v for v in forward.verdicts if v.phase is Phase.FORWARD)
        bwd = tuple(v for v in backward.verdicts if v.phase is Phase.BACKWARD)
        if not fwd or not bwd or not all(v.supported for v in fwd + bwd):
            return None
        verdicts, backend, plan_form, engine = fwd + bwd, forward.candidate, forward.plan_form, forward.engine
    if len(candidate.configs) == 1:
        found = counted(differences(cfg, _as_recorded(candidate.configs[0])))
        changes = tuple(Change(d.field, d.asked, d.recorded) for d in found)
    else:  # an FP8 forward with a bf16 backward: the forward is the problem asked, as inference
        changes = (Change("backward qkv_dtype", cfg.qkv_dtype, candidate.configs[1].qkv_dtype),)
    return Alternative(kind=candidate.kind, changes=changes, backend=backend, configs=candidate.configs,
                       verdicts=verdicts, note=candidate.note, extra_flops_percent=candidate.extra_flops_percent,
                       plan_form=plan_form, engine=engine)
