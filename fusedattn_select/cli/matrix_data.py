"""The support matrix as data: each problem's answer, grouped into rows and columns by axes.

An axis names one property of a problem (dtype, pass, head dim, mask, layout family, ...). A cell
counts the problems of its row and column by answer: accepted (F16 or FP8), NONE (rejected by a
rule or by cuDNN), no data (not recorded in the snapshot) and failed (a probe failed). No data and
failed problems are never counted as rejected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from fusedattn_select.config import MASKS, AttnConfig
from fusedattn_select.dtypes import DTYPES
from fusedattn_select.errors import ConfigError
from fusedattn_select.layouts import FORMATS
from fusedattn_select.result import Selection
from fusedattn_select.types import Outcome

NO_DATA = "no data"
FAILED = "failed"
NONE = "NONE"


def answer_of(selection: Selection) -> str:
    """"F16" / "FP8" when a backend is selected; "NONE" when a rule or cuDNN refused some pass
    (a refusal is an answer even where another pass has no data); else "failed" or "no data"."""
    if selection.selected:
        return selection.backend.value
    outcomes = {v.outcome for v in selection.verdicts}
    if Outcome.UNSUPPORTED in outcomes:
        return NONE
    return FAILED if Outcome.FAILED in outcomes else NO_DATA


def _layout_family(cfg: AttnConfig) -> str:
    layout = cfg.layout
    if layout.paged:
        return "paged"
    if layout.ragged:
        return "thd"
    if layout.packing is not None:
        return "packed"
    return layout.q_format if layout.q_format == layout.kv_format else "mixed"


def _head_dim(cfg: AttnConfig) -> str:
    dv = cfg.resolved_head_dim_v
    return f"d{cfg.head_dim_qk}" if dv == cfg.head_dim_qk else f"d{cfg.head_dim_qk}/{dv}"


def _window(cfg: AttnConfig) -> str:
    return "no window" if tuple(cfg.window_size) == (-1, -1) else "window"


def _seqlens(cfg: AttnConfig) -> str:
    if cfg.seqlen_q == 1:
        return "decode"
    return "sq=skv" if cfg.seqlen_q == cfg.seqlen_kv else "sq!=skv"


# axis name -> (value of a problem, sort key of a value)
Axis = tuple[Callable[[AttnConfig], str], Callable[[str], Any]]


def _order(values: Sequence[str]) -> Callable[[str], Any]:
    return lambda value: (values.index(value) if value in values else len(values), value)


def _head_dim_order(value: str) -> Any:
    return tuple(int(part) for part in value[1:].split("/"))


AXES: dict[str, Axis] = {
    "dtype": (lambda c: c.qkv_dtype, _order(DTYPES)),
    "pass": (lambda c: "train" if c.is_training else "infer", _order(("train", "infer"))),
    "head_dim": (_head_dim, _head_dim_order),
    "mask": (lambda c: c.mask, _order(MASKS)),
    "layout": (_layout_family, _order((*FORMATS, "mixed", "packed", "paged"))),
    "bias": (lambda c: c.bias, _order(("no_bias", "post_scale_bias", "pre_scale_bias", "alibi"))),
    "softmax": (lambda c: c.softmax, _order(("vanilla", "off_by_one", "learnable"))),
    "window": (_window, _order(("no window", "window"))),
    "seqlens": (_seqlens, _order(("sq=skv", "sq!=skv", "decode"))),
}


def parse_axes(text: str, flag: str) -> tuple[str, ...]:
    """"dtype,pass,head_dim" -> ("dtype", "pass", "head_dim"); ConfigError names `flag`."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in names if name not in AXES]
    if not names or unknown:
        raise ConfigError(flag, text, "a comma-separated list of " + ", ".join(AXES))
    return names


@dataclass
class Problem:
    """One answered problem: where it came from, its answer and the axis values it falls under."""

    suite: str
    name: str
    config: AttnConfig
    selection: Selection
    answer: str

    def key(self, axes: Sequence[str]) -> tuple[str, ...]:
        return tuple(AXES[axis][0](self.config) for axis in axes)

    @property
    def verified(self) -> bool:
        """Accepted, and every pass's results were compared with a reference (depth verify)."""
        verdicts = self.selection.verdicts
        return self.answer not in (NONE, NO_DATA, FAILED) and bool(verdicts) and all(v.verified for v in verdicts)


@dataclass
class Cell:
    """Counts of one row and column's problems by answer."""

    accepted: int = 0
    none: int = 0
    no_data: int = 0
    failed: int = 0
    verified: int = 0  # of the accepted: results compared with a reference (depth verify)
    problems: list[str] = field(default_factory=list)

    @property
    def answered(self) -> int:
        """Problems with a verdict (accepted or NONE)."""
        return self.accepted + self.none

    def add(self, problem: Problem) -> None:
        if problem.answer == NO_DATA:
            self.no_data += 1
        elif problem.answer == FAILED:
            self.failed += 1
        elif problem.answer == NONE:
            self.none += 1
        else:
            self.accepted += 1
            self.verified += problem.verified
        self.problems.append(f"{problem.suite}:{problem.name}")

    def text(self) -> str:
        """"3/4" accepted of answered; "v3" of them verified; "?2" problems without data; "!1" failed probes."""
        parts = [f"{self.accepted}/{self.answered}"] if self.answered else []
        parts += [f"v{self.verified}"] if self.verified else []
        parts += [f"?{self.no_data}"] if self.no_data else []
        parts += [f"!{self.failed}"] if self.failed else []
        return " ".join(parts)

    def fraction(self) -> float | None:
        """Accepted / answered; None when no problem here has a verdict."""
        return self.accepted / self.answered if self.answered else None

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "none": self.none, "no_data": self.no_data, "failed": self.failed,
                "verified": self.verified, "problems": list(self.problems)}


@dataclass
class Matrix:
    """Rows x columns of cells; rows and columns are tuples of axis values, sorted."""

    row_axes: tuple[str, ...]
    column_axes: tuple[str, ...]
    rows: list[tuple[str, ...]]
    columns: list[tuple[str, ...]]
    cells: dict[tuple[tuple[str, ...], tuple[str, ...]], Cell]

    def cell(self, row: tuple[str, ...], column: tuple[str, ...]) -> Cell | None:
        return self.cells.get((row, column))

    def totals(self) -> Cell:
        total = Cell()
        for cell in self.cells.values():
            total.accepted += cell.accepted
            total.none += cell.none
            total.no_data += cell.no_data
            total.failed += cell.failed
            total.verified += cell.verified
        return total


def _sort_key(axes: Sequence[str]) -> Callable[[tuple[str, ...]], Any]:
    return lambda values: tuple(AXES[axis][1](value) for axis, value in zip(axes, values))


def build_matrix(problems: Sequence[Problem], row_axes: Sequence[str], column_axes: Sequence[str]) -> Matrix:
    """Group `problems` into cells by the values of `row_axes` and `column_axes`."""
    cells: dict[tuple[tuple[str, ...], tuple[str, ...]], Cell] = {}
    for problem in problems:
        key = (problem.key(row_axes), problem.key(column_axes))
        cells.setdefault(key, Cell()).add(problem)
    rows = sorted({row for row, _ in cells}, key=_sort_key(row_axes))
    columns = sorted({column for _, column in cells}, key=_sort_key(column_axes))
    return Matrix(tuple(row_axes), tuple(column_axes), rows, columns, cells)
