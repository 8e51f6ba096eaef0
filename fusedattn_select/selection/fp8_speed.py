"""Measured FP8-versus-bf16 speed of cuDNN's attention graphs, per device and cuDNN version.

`tools/record_fp8_speed.py` times the raw FP8 and bf16 graphs of the same problems on a GPU and
writes `snapshots/<device>-fp8-speed.json` with the device fingerprint inside. attention(fp8=True)
reads the record of its own platform: where the FP8 backward graph was measured slower than the
bf16 one, a training call runs the FP8 forward and the bf16 backward, and says so once in the log;
where attention(fp8=True)'s forward, quantization included, was measured no faster than bf16
attention() ("forward_quantized" rows), the first FP8 call says that once too. A platform with no
record has no data: FP8 runs as asked, silently.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Optional

from fusedattn_select.types import Fingerprint

log = logging.getLogger("fusedattn_select")

SCHEMA = "fusedattn-select-fp8-speed/1"
SUFFIX = "-fp8-speed.json"
# Fingerprint fields a record must match: the same GPU and the same cuDNN.
MATCHED = ("device_name", "compute_capability", "cudnn_backend_version")
# Phases of the rows: the raw graphs, and attention(fp8=True) against bf16 attention() (inference).
FORWARD, BACKWARD, FORWARD_QUANTIZED = "forward", "backward", "forward_quantized"
PHASE_TEXT = {FORWARD_QUANTIZED: "forward of attention(fp8=True), quantization included,"}
# A speedup under this is "no faster": the spread between runs and hosts. On the H100 the forward
# through attention(fp8=True) at b2 s4096 measured 0.72-1.04x in the benches (tools/results; the
# low end host-bound) and 1.04-1.06x in the speed records: 1.05 would call it faster or not by chance.
NOT_FASTER = 1.10


@dataclass(frozen=True)
class SpeedRow:
    """One problem and pass timed both ways (milliseconds, medians of CUDA-event times)."""

    problem: str
    phase: str
    bf16_ms: float
    fp8_ms: float

    @property
    def speedup(self) -> float:
        return self.bf16_ms / self.fp8_ms if self.fp8_ms > 0 else 0.0


@dataclass(frozen=True)
class SpeedRecord:
    """A recorder run: where it ran and what it measured."""

    source: str
    fingerprint: Fingerprint
    recorded_at: str
    rows: tuple[SpeedRow, ...]

    def _rows(self, phase: str) -> tuple[SpeedRow, ...]:
        return tuple(r for r in self.rows if r.phase == phase)

    @property
    def backward_slower(self) -> bool:
        """The FP8 backward graph was slower than the bf16 one at every problem measured."""
        rows = self._rows(BACKWARD)
        return bool(rows) and all(r.fp8_ms > r.bf16_ms for r in rows)

    @property
    def forward_not_faster(self) -> bool:
        """attention(fp8=True)'s forward was no faster than bf16 at some problem measured."""
        return any(r.speedup < NOT_FASTER for r in self._rows(FORWARD_QUANTIZED))

    def summary(self, phase: str) -> str:
        """"FP8 backward 0.61x bf16 speed (b2 h32/8 s4096 d128 causal: 2.59 vs 1.58 ms; ...)"."""
        rows = self._rows(phase)
        worst = min(r.speedup for r in rows) if rows else 0.0
        detail = "; ".join(f"{r.problem}: {r.fp8_ms:.3g} vs {r.bf16_ms:.3g} ms" for r in rows)
        return f"FP8 {PHASE_TEXT.get(phase, phase)} at {worst:.2f}x the bf16 speed ({detail})"


def parse(data: Any, source: str) -> SpeedRecord:
    """A record from its JSON; ValueError naming `source` and the field when it is not one."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{source}: not an FP8 speed record (schema must be {SCHEMA!r})")
    try:
        rows = tuple(SpeedRow(str(r["problem"]), str(r["phase"]), float(r["bf16_ms"]), float(r["fp8_ms"]))
                     for r in data["rows"])
        return SpeedRecord(source, Fingerprint.from_dict(data["fingerprint"]), str(data["recorded_at"]), rows)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{source}: bad FP8 speed record ({type(err).__name__}: {err})") from None


@lru_cache(maxsize=1)
def bundled_records() -> tuple[SpeedRecord, ...]:
    """The records shipped in the package's snapshots folder."""
    folder = resources.files("fusedattn_select") / "snapshots"
    records = []
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(SUFFIX):
            records.append(parse(json.loads(item.read_text()), item.name))
    return tuple(records)


def record_for(fingerprint: Fingerprint, records: Optional[tuple[SpeedRecord, ...]] = None) -> Optional[SpeedRecord]:
    """The record measured on this fingerprint's GPU and cuDNN; None when there is none (no data)."""
    for record in bundled_records() if records is None else records:
        if all(getattr(record.fingerprint, f) == getattr(fingerprint, f) for f in MATCHED):
            return record
    return None


_told: set[tuple[str, str]] = set()  # (phase, fingerprint key) already logged


def _tell_once(record: SpeedRecord, phase: str, fingerprint: Fingerprint, message: str) -> str:
    """`record`'s summary of `phase` on this platform, logged once per process, platform and phase
    as `message` % summary."""
    text = (f"{record.summary(phase)} on {fingerprint.device_name} with cuDNN "
            f"{fingerprint.cudnn_backend_version} (measured {record.recorded_at[:10]}, {record.source})")
    key = (phase, fingerprint.key())
    if key not in _told:
        _told.add(key)
        log.warning(message, text)
    return text


def f16_backward_reason(fingerprint: Fingerprint) -> str:
    """Why FP8 training should run its backward in bf16 here ("" when it should not, or no data).
    Logged once per process and platform."""
    record = record_for(fingerprint)
    if record is None or not record.backward_slower:
        return ""
    return _tell_once(record, BACKWARD, fingerprint,
                      "fusedattn_select: fp8=True training runs the FP8 forward and the bf16 backward: %s")


def forward_note(fingerprint: Fingerprint) -> str:
    """Where attention(fp8=True)'s forward, quantization included, was measured no faster than bf16
    on this platform ("" when it was faster everywhere measured, or no data). Logged once per
    process and platform."""
    record = record_for(fingerprint)
    if record is None or not record.forward_not_faster:
        return ""
    return _tell_once(record, FORWARD_QUANTIZED, fingerprint,
                      "fusedattn_select: fp8=True may not be faster than bf16 here: %s; delayed scaling "
                      "(fp8=FP8History()) skips the amax pass, and FP8 output "
                      "(FP8History(o_dtype=torch.float8_e4m3fn)) the pass back to bf16")
