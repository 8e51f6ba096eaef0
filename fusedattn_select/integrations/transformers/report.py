"""Which backend runs each distinct attention layer of a model, and why, before running it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from fusedattn_select.config import AttnConfig
from fusedattn_select.integrations.transformers.problems import hf_config, model_problems
from fusedattn_select.selection import runners
from fusedattn_select.selection.selector import default_selector
from fusedattn_select.types import Backend

if TYPE_CHECKING:
    from fusedattn_select.selection.selector import Selector


@dataclass(frozen=True)
class LayerReport:
    """One distinct attention problem of a model and the layers that share it.

    `config` is the problem as "fusedattn" runs it (window dropped where it cannot cut, sinks as
    softmax="learnable"); `backend` and `reason` come from `select(config)`, unless the
    integration itself runs the layers elsewhere (soft-capping, chunked attention), in which case
    `backend` is NONE and `reason` says where they run. `reasons` has one line per rejection.
    """

    name: str
    layers: tuple[int, ...]
    layer_type: str
    config: AttnConfig
    backend: Backend
    reason: str
    reasons: tuple[str, ...] = ()
    sliding_window: int | None = None
    softcap: float | None = None
    sinks: bool = False
    runner: str = ""  # the runner measured faster for its graphs on this device ("" = not measured yet)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "layers": list(self.layers), "layer_type": self.layer_type,
            "num_heads_q": self.config.num_heads_q, "num_heads_kv": self.config.num_heads_kv,
            "head_dim_qk": self.config.head_dim_qk, "head_dim_v": self.config.resolved_head_dim_v,
            "window_size": list(self.config.window_size), "sliding_window": self.sliding_window,
            "softcap": self.softcap, "sinks": self.sinks, "backend": self.backend.value,
            "reason": self.reason, "reasons": list(self.reasons), "runner": self.runner or None,
            "config": self.config.to_dict(),
        }


class ModelReport(list):
    """report()'s answer: a list of LayerReport rows, and `notes`, what the config reader says about the
    model (layers that are no softmax attention, a length assumed, a model_type read as another), the
    lines `why --hf-config` prints as "note:"."""

    def __init__(self, rows: Sequence[LayerReport] = (), notes: Sequence[str] = ()) -> None:
        super().__init__(rows)
        self.notes: tuple[str, ...] = tuple(notes)


def report(
    model_or_config: Any, batch_size: int = 1, seqlen: int | None = None, is_training: bool = True,
    dtype: Any = None, *, selector: "Selector | None" = None,
) -> ModelReport:
    """Which backend runs each distinct attention layer of a model, and why, before running it.

    Accepts what `configs_from_hf` accepts, with the same defaults. `selector` defaults to the process-wide one
    (`fusedattn_select.select`); pass another to answer from a snapshot. Each row's `runner` says
    whether torch SDPA or cuDNN was measured faster for that layer's graphs on this device. The
    returned list's `notes` are the config reader's (see ModelReport); `format_report` prints them.
    """
    reading = hf_config(model_or_config)
    selector = selector if selector is not None else default_selector()
    rows = []
    for problem in model_problems(reading, batch_size, seqlen, is_training, dtype, seqlen):
        runner = ""
        if problem.integration_reasons:
            backend, reasons = Backend.NONE, problem.integration_reasons
        else:
            selection = selector.select(problem.config)
            backend, reasons = selection.backend, selection.reasons
            choice = runners.for_selection(selector, selection)
            runner = choice.describe() if choice is not None else ""
        rows.append(LayerReport(
            name=problem.name, layers=tuple(problem.layers), layer_type=problem.layer_type,
            config=problem.config, backend=backend, reason="; ".join(reasons), reasons=reasons,
            sliding_window=problem.sliding_window, softcap=problem.softcap, sinks=problem.sinks, runner=runner,
        ))
    return ModelReport(rows, reading.notes)


def layer_ranges(layers: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    ranges: list[list[int]] = []
    for layer in sorted(layers):
        if ranges and layer == ranges[-1][1] + 1:
            ranges[-1][1] = layer
        else:
            ranges.append([layer, layer])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in ranges)


def format_report(rows: Sequence[LayerReport]) -> str:
    """The reader's notes (a ModelReport's, one "note:" line each), then a table: one line per distinct
    layer problem, then its reason when no backend runs it."""
    header = ["layers", "type", "heads q/kv", "head dim", "window", "seqlen", "backend"]
    table = [header]
    for row in rows:
        cfg = row.config
        dims = str(cfg.head_dim_qk)
        if cfg.resolved_head_dim_v != cfg.head_dim_qk:
            dims += f"/{cfg.resolved_head_dim_v}"
        window = "-" if row.sliding_window is None else f"{row.sliding_window} -> {list(cfg.window_size)}"
        table.append([
            layer_ranges(row.layers), row.name, f"{cfg.num_heads_q}/{cfg.num_heads_kv}", dims, window,
            f"{cfg.seqlen_q}", row.backend.value,
        ])
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = [f"note: {note}" for note in getattr(rows, "notes", ())]
    for position, line in enumerate(table):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
        if position:
            lines.extend(f"    reason: {reason}" for reason in rows[position - 1].reasons)
            if rows[position - 1].runner:
                lines.append(f"    runner: {rows[position - 1].runner}")
    return "\n".join(lines)
