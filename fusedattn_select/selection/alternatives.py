"""What would work instead: for a refused problem, other problems the same engine supports.

An alternative is another problem, one or two fields away from the one asked (the other causal
diagonal where both are one, another layout, FP8 output, deterministic off, its head dims padded to
sizes the kernels take, fp16 instead of bf16, bf16 instead of FP8, no dropout, inference instead of
training), that the selector which answered NONE answers with a backend: live probes on a GPU,
recorded rows from a snapshot. Alternatives are suggestions labelled as other problems; nothing
here changes the answer for the problem asked. Every alternative is one attention() can run.

Cost is bounded in graph probes, not in problems: each candidate goes through `Selector.select`
(its rules, decision cache and engine), which may probe a bucket form and then the dense graphs, a
decode step's heads-as-batch problem first, forward and backward. A candidate is asked only while
the most it could still probe fits under `max_probes`; the engine calls the calling thread made
are counted (`Selector.probes_by_this_thread`), so answers from the cache or a rule cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterator, Protocol

from fusedattn_select.buckets import heads_as_batch
from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.layouts import LAYOUTS, SEPARATE_LAYOUTS
from fusedattn_select.probing.nearest import DERIVED_FROM, FIELDS, RecordedProblem, closeness, counted, differences
from fusedattn_select.result import Alternative, Change, Selection
from fusedattn_select.selection.rules import rules_by_name
from fusedattn_select.types import Outcome, Phase, ProbeDepth, Provenance

DEFAULT_LIMIT = 3
DEFAULT_MAX_PROBES = 32  # graph probes (engine calls) per refused answer: about 8 training candidates
MAX_CHANGED_FIELDS = 2
# Head dims cuDNN's SDPA kernels are built around; a head dim is padded to the next multiple of 8
# (cuDNN's alignment) or to one of these; the PAD_TRIES cheapest paddings are asked.
HEAD_DIM_SIZES = (64, 96, 128, 192, 256)
PAD_TRIES = 3
PAD_KIND = "pad head dim"
# Layouts with Q, K and V in one memory order, tried in this order.
UNIFORM_LAYOUTS = ("bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd")
# The same result by construction where seqlen_q == seqlen_kv: both diagonals are the main one. With
# a padding mask each sequence has its own lengths, so the padded forms are not swapped.
_SAME_RESULT_MASKS = {"causal": "causal_bottom_right", "causal_bottom_right": "causal"}
# A recorded neighbour may differ only in these: dtypes, memory order and switches. Shapes, masks,
# windows, softmax, bias, dropout, outputs asked for and training change what is computed; a padded
# head dim is asked by the padding move, with its cost and scale.
_NEIGHBOUR_FIELDS = frozenset((
    "qkv_dtype", "o_dtype", "do_dtype", "dqkv_dtype", "scaling_mode", "qkv_layout", "o_format", "do_format",
    "dqkv_layout", "deterministic", "cuda_graph",
))

_BACKWARD_FIELDS = frozenset(("do_dtype", "dqkv_dtype", "do_format", "dqkv_layout"))


class Answers(Protocol):
    """What alternatives are asked through: a Selector (its rules, cache and engine). A protocol,
    not an import: selector.select(alternatives=True) imports this module."""

    engine: Any

    def select(self, cfg: AttnConfig, probe_depth: str | ProbeDepth = ProbeDepth.FAST) -> Selection: ...

    def probes_by_this_thread(self) -> int: ...

    def bucket_for(self, cfg: AttnConfig) -> AttnConfig | None: ...


@dataclass(frozen=True)
class Candidate:
    """A problem to ask about: its kind, its config, what using it takes and, for a padded head dim,
    the extra attention FLOPs per pass in percent."""

    kind: str
    config: AttnConfig
    note: str = ""
    extra_flops_percent: tuple[tuple[Phase, float], ...] = ()


@dataclass(frozen=True)
class Search:
    """The alternatives found for one answer, and what finding them spent: `candidates` problems
    asked, `probes` engine calls (graph probes live, recorded rows from a snapshot) under the cap
    `max_probes`; `capped`: a candidate was left unasked because its probes would not fit."""

    alternatives: tuple[Alternative, ...]
    candidates: int
    probes: int
    max_probes: int
    capped: bool


def find(selector: Answers, selection: Selection, *, limit: int = DEFAULT_LIMIT,
         max_probes: int = DEFAULT_MAX_PROBES, probe_depth: str | ProbeDepth | None = None) -> Search:
    """Up to `limit` alternatives for `selection` (an answer of `selector`), spending at most
    `max_probes` engine calls at `probe_depth` (default: the deepest depth of the answer's verdicts).
    Only a refusal has alternatives: a selected answer, no data or a failed probe get none. Where a
    known-bug rule refused, an alternative on the same backend says so in its note."""
    _check_count("limit", limit)
    _check_count("max_probes", max_probes)
    cfg = selection.config
    if cfg is None or selection.selected or not any(v.outcome is Outcome.UNSUPPORTED for v in selection.verdicts):
        return Search((), 0, 0, max_probes, False)
    depth = _depth(selection, probe_depth)
    known_bug = _known_bug_rule(selection)
    origin = getattr(selector.engine, "provenance", None)
    found: list[Alternative] = []
    asked: set[str] = {cfg.cache_key()}
    candidates_asked, capped = 0, False
    start = selector.probes_by_this_thread()
    for candidate in candidates(cfg, selection, selector):
        if len(found) >= limit:
            break
        question = _question(candidate, origin)
        key = question.cache_key()
        if key in asked or any(a.kind == candidate.kind for a in found):
            continue
        if selector.probes_by_this_thread() - start + _most_probes(selector, question) > max_probes:
            capped = True  # a cheaper candidate after it may still fit
            continue
        asked.add(key)
        candidates_asked += 1
        if known_bug and question.candidate is cfg.candidate:
            candidate = replace(candidate, note=f"{candidate.note}; {_same_kernels_note(known_bug)}")
        alternative = _alternative(cfg, candidate, question, selector.select(question, depth), origin)
        if alternative is not None:
            found = _without_supersets(found, alternative)
    return Search(tuple(found), candidates_asked, selector.probes_by_this_thread() - start, max_probes, capped)


def with_alternatives(selector: Answers, selection: Selection, *, limit: int = DEFAULT_LIMIT,
                      max_probes: int = DEFAULT_MAX_PROBES, probe_depth: str | ProbeDepth | None = None) -> Selection:
    """`selection` with its alternatives filled in (see find); the answer itself is unchanged."""
    search = find(selector, selection, limit=limit, max_probes=max_probes, probe_depth=probe_depth)
    return replace(selection, alternatives=search.alternatives, alternative_probes=search.probes)


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(name, value, "must be a non-negative integer")


def _depth(selection: Selection, asked: str | ProbeDepth | None) -> ProbeDepth:
    if asked is not None:
        return ProbeDepth.parse(asked)
    depths = {v.depth for v in selection.verdicts}
    return next((d for d in (ProbeDepth.VERIFY, ProbeDepth.FULL) if d in depths), ProbeDepth.FAST)


def _known_bug_rule(selection: Selection) -> str:
    """The name of the known-bug rule that refused the problem asked, or ""."""
    rules = rules_by_name()
    return next((v.stage[5:] for v in selection.verdicts if not v.supported and v.stage.startswith("rule:")
                 and getattr(rules.get(v.stage[5:]), "known_bug", False)), "")


def _same_kernels_note(rule: str) -> str:
    # The rule's condition does not hold for this problem, but its graphs may run the same kernels
    # (another graph form of one kernel family): no report says they are right.
    return (f"same backend as the refusal by known-bug rule {rule}, which does not cover this problem; "
            "its kernels may be the same: check it at probe depth verify")


def _question(candidate: Candidate, origin: Provenance | None) -> AttnConfig:
    """The problem asked for `candidate`. A snapshot recorded each problem at its default scale: a
    padded head dim is looked up there, as the scale is a value the graphs take, not a shape."""
    if origin is Provenance.SNAPSHOT and candidate.kind == PAD_KIND:
        return candidate.config.replace(attn_scale=None)
    return candidate.config


def _most_probes(selector: Answers, cfg: AttnConfig) -> int:
    """The most engine calls select(cfg) can make: each pass of its bucket form and then of its own
    graphs, and on a GPU a decode step's heads-as-batch problem (its bucket, its graphs) first."""
    forms = 1 + (selector.bucket_for(cfg) is not None)
    if getattr(selector.engine, "provenance", None) is Provenance.LIVE_PROBE and heads_as_batch(cfg) is not None:
        forms += 2
    return forms * len(cfg.phases)


def _without_supersets(found: list[Alternative], new: Alternative) -> list[Alternative]:
    """`found` with `new` added, unless it only adds changes to one found; one found that only adds
    changes to `new` makes way for it."""
    changes = _change_set(new)
    if any(_change_set(old) <= changes for old in found):
        return found
    return [old for old in found if not changes < _change_set(old)] + [new]


def _change_set(alternative: Alternative) -> frozenset:
    return frozenset((c.field, repr(c.instead)) for c in alternative.changes)


# ----- candidates, cheapest change first -----------------------------------------------------------
def candidates(cfg: AttnConfig, selection: Selection, selector: Answers) -> Iterator[Candidate]:
    """Every candidate for `cfg`, in the order they are asked: changes that keep the result first
    (a mask form equal on these shapes, another layout, FP8 output), then switches (deterministic,
    CUDA graphs), padding, other dtypes, and last the changes that alter what is computed
    (dropout, training); from a snapshot, its recorded supported neighbours after them."""
    refused = {v.phase for v in selection.verdicts if not v.supported}
    for move in (_mask_form, _layouts, _fp8_output, _switches, _padded_head_dims, _dtypes, _no_dropout, _inference):
        for candidate in _valid(move(cfg, refused)):
            if changed_fields(cfg, candidate.config) <= MAX_CHANGED_FIELDS:
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
        yield Candidate("another mask form", cfg.replace(mask=other),
                        "same result: seqlen_q == seqlen_kv puts both diagonals in one place")
    if cfg.mask == "no_mask":
        yield Candidate("padding mask", cfg.replace(mask="padding"),
                        "same result with every sequence at its full length")


def _layouts(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.qkv_layout not in SEPARATE_LAYOUTS or cfg.page_size is not None:
        return
    for layout in UNIFORM_LAYOUTS:
        if layout != cfg.qkv_layout:
            yield Candidate("another layout", cfg.replace(qkv_layout=layout),
                            "same result; the tensors in another memory order (a transpose copy or a view)")


def _fp8_output(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.is_fp8 and cfg.resolved_o_dtype != cfg.qkv_dtype:
        yield Candidate("FP8 output", cfg.replace(o_dtype=cfg.qkv_dtype),
                        "O in FP8 (as TransformerEngine's fp8_mha keeps it) instead of fp16/bf16")


def _switches(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.deterministic and cfg.is_training:
        yield Candidate("deterministic off", cfg.replace(deterministic=False),
                        "the backward may sum in a different order from run to run")
    if cfg.cuda_graph:
        yield Candidate("no CUDA-graph capture", cfg.replace(cuda_graph=False), "run this layer eagerly")


def _padded_head_dims(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    """The PAD_TRIES cheapest paddings, cheapest first. One head dim (head_dim_v left out) pads Q, K
    and V together; two pad each where it can, so a head dim that needs none keeps its size. The
    scale stays the original's, so zero-padding and slicing the output gives the original result."""
    qk, v = cfg.head_dim_qk, cfg.resolved_head_dim_v
    if cfg.head_dim_v is None:
        sizes = [(size, None) for size in _larger(qk)]
    else:
        sizes = [(q, w) for q in (qk, *_larger(qk)) for w in (v, *_larger(v)) if (q, w) != (qk, v)]
    padded = [cfg.replace(head_dim_qk=q, head_dim_v=w, attn_scale=cfg.resolved_attn_scale) for q, w in sizes]
    padded.sort(key=lambda c: _flops_units(c.head_dim_qk, c.resolved_head_dim_v, cfg.is_training))
    for config in padded[:PAD_TRIES]:
        yield Candidate(PAD_KIND, config, _padding_note(cfg, config), _extra_flops(cfg, config))


def _larger(size: int) -> list[int]:
    """The PAD_TRIES smallest sizes above `size`: its next multiple of 8 and HEAD_DIM_SIZES."""
    return sorted(s for s in {-(-size // 8) * 8, *HEAD_DIM_SIZES} if s > size)[:PAD_TRIES]


def _padding_note(cfg: AttnConfig, padded: AttnConfig) -> str:
    qk, v = padded.head_dim_qk > cfg.head_dim_qk, padded.resolved_head_dim_v > cfg.resolved_head_dim_v
    tensors = "Q, K and V" if qk and v else "Q and K" if qk else "V"
    scale = f"attn_scale {cfg.resolved_attn_scale:.6g}"
    scale += f" (1/sqrt({cfg.head_dim_qk}))" if cfg.attn_scale is None else ""
    return f"zero-pad {tensors}, keep {scale}, slice the output"


def _flops_units(qk: int, v: int, training: bool) -> int:
    """Attention FLOPs in units of 2*s_q*s_kv per head: the forward does QK^T (d_qk) and PV (d_v); the
    backward recomputes S (d_qk) and computes dP (d_v), dV (d_v), dQ and dK (d_qk each)."""
    return (qk + v) + ((3 * qk + 2 * v) if training else 0)


def _extra_flops(cfg: AttnConfig, padded: AttnConfig) -> tuple[tuple[Phase, float], ...]:
    """Extra attention FLOPs per pass, in percent of the original's."""
    qk, v, pq, pv = cfg.head_dim_qk, cfg.resolved_head_dim_v, padded.head_dim_qk, padded.resolved_head_dim_v
    extra = [(Phase.FORWARD, (pq + pv) / (qk + v))]
    if cfg.is_training:
        extra.append((Phase.BACKWARD, (3 * pq + 2 * pv) / (3 * qk + 2 * v)))
    return tuple((phase, (ratio - 1.0) * 100.0) for phase, ratio in extra)


def _dtypes(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.qkv_dtype in ("fp16", "bf16"):
        other = "fp16" if cfg.qkv_dtype == "bf16" else "bf16"
        fields = {name: None for name in ("o_dtype", "do_dtype", "dqkv_dtype") if getattr(cfg, name) is not None}
        yield Candidate(f"{other} instead of {cfg.qkv_dtype}", cfg.replace(qkv_dtype=other, **fields),
                        "another 16-bit format: other rounding, other range")
    elif cfg.is_fp8:
        bf16 = cfg.replace(qkv_dtype="bf16", o_dtype=None, do_dtype=None, dqkv_dtype=None, scaling_mode=None)
        yield Candidate("bf16 instead of FP8", bf16, "the F16 backend at bf16")


def _no_dropout(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.dropout:
        yield Candidate("no dropout", cfg.replace(dropout=0.0), "attention dropout off: changes training")


def _inference(cfg: AttnConfig, refused: set[Phase]) -> Iterator[Candidate]:
    if cfg.is_training and refused == {Phase.BACKWARD}:
        yield Candidate("inference instead of training", cfg.replace(is_training=False),
                        "forward only: no gradients through this layer")


def _recorded_neighbours(cfg: AttnConfig, selector: Answers) -> Iterator[Candidate]:
    """From a snapshot: recorded problems it answers with a backend that differ from `cfg` only in
    dtypes, memory order or switches (_NEIGHBOUR_FIELDS), within two fields, closest first."""
    near = []
    for problem in getattr(selector.engine, "recorded", ()):
        if not problem.verdicts or not all(v.supported for v in problem.verdicts):
            continue
        found = differences(cfg, problem)
        if not found or any(d.field not in _NEIGHBOUR_FIELDS for d in found) or not _same_result_layout(cfg, problem):
            continue
        if len(counted(found)) <= MAX_CHANGED_FIELDS:
            near.append((closeness(cfg, problem, found), problem))
    for _, problem in sorted(near, key=lambda item: item[0]):
        yield Candidate(f"recorded problem {problem.label}", problem.config, f"recorded in {problem.file_name}")


def _same_result_layout(cfg: AttnConfig, problem: RecordedProblem) -> bool:
    """Another memory order of the same tensors (no ragged, packed or paged inputs on either side)."""
    layouts = (cfg.qkv_layout, problem.config.qkv_layout)
    return layouts[0] == layouts[1] or all(layout in SEPARATE_LAYOUTS and LAYOUTS[layout].packing is None
                                           for layout in layouts)


def all_changes(cfg: AttnConfig, other: AttnConfig) -> tuple[Change, ...]:
    """Every field in which `other` differs from `cfg`; derived fields compared as resolved, also
    where both leave them out (an O dtype that follows a changed scaling mode is a change)."""
    changes = []
    for name in FIELDS:
        if name in _BACKWARD_FIELDS and not (cfg.is_training or other.is_training):
            continue  # no backward graph on either side
        derived = name in DERIVED_FROM
        asked, instead = (getattr(c, "resolved_" + name if derived else name) for c in (cfg, other))
        if asked != instead:
            changes.append(Change(name, asked, instead))
    return tuple(changes)


def changed_fields(cfg: AttnConfig, other: AttnConfig) -> int:
    """How many fields apart two problems are: a derived field that changes with its source counts with it."""
    return len(counted(differences(cfg, _as_recorded(other))))


def _as_recorded(config: AttnConfig) -> RecordedProblem:
    return RecordedProblem(name="", suite="", file_name="", config=config, verdicts=())


# ----- answers into alternatives -------------------------------------------------------------------
def _alternative(cfg: AttnConfig, candidate: Candidate, question: AttnConfig, answer: Selection,
                 origin: Provenance | None) -> Alternative | None:
    """The alternative `answer` (for `question`) makes of `candidate`, or None where it is not selected.
    Every field that differs is shown, derived ones too (an O dtype that follows the scaling mode)."""
    if not answer.selected:
        return None
    changes = all_changes(cfg, candidate.config)
    note = candidate.note
    if question is not candidate.config:
        note += f"; answered by the recorded problem at its default scale 1/sqrt({question.head_dim_qk})"
    return Alternative(kind=candidate.kind, changes=changes, backend=answer.backend, config=candidate.config,
                       verdicts=answer.verdicts, note=note, extra_flops_percent=candidate.extra_flops_percent,
                       plan=answer.plan, engine=answer.engine, origin=origin,
                       answered_by=None if question is candidate.config else question)
