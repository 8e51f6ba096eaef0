"""Issue 34's "done when" targets checked against a run's document, and the markdown table of them.

Pure: reads the document the parts wrote (options.PARTS names its parts), imports nothing heavy.
Each target compares one figure with its limit; a figure that cannot be worked out (a side failed,
a part skipped) gives the verdict "n/a" with the reason, never "met".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

MET, MISSED = "met", "missed"


class Missing(Exception):
    """A figure a target needs is not in the document (the message says why)."""


@dataclass(frozen=True)
class Verdict:
    """One target: the row of issue 34, the target in words, the figure compared and the outcome."""

    row: int
    target: str
    value: float | None  # the compared figure: a ratio, or a gain as a fraction (0.05 = 5%)
    measured: str  # the figure as the table shows it, with what it was worked out from
    verdict: str  # MET, MISSED or "n/a: why"

    def as_json(self) -> dict[str, Any]:
        return {"row": self.row, "target": self.target, "value": self.value, "measured": self.measured,
                "verdict": self.verdict}


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Missing(f"no {what}")
    return float(value)


def _ok(found: Any, what: str) -> Mapping[str, Any]:
    """`found` when its status is ok; Missing naming `what` and its status otherwise."""
    if not isinstance(found, Mapping):
        raise Missing(f"{what}: not measured")
    status = found.get("status", "ok")
    if status != "ok":
        raise Missing(f"{what}: {status}")
    return found


def _side(part: Mapping[str, Any], side: str) -> Mapping[str, Any]:
    return _ok((part.get("sides") or {}).get(side), side)


def _at_most(row: int, target: str, limit: float, figure: Callable[[], tuple[float, str]]) -> Verdict:
    return _verdict(row, target, figure, lambda v: v <= limit, lambda v: f"{v:.2f}x")


def _at_least(row: int, target: str, limit: float, figure: Callable[[], tuple[float, str]],
              percent: bool = False) -> Verdict:
    shown = (lambda v: f"{v * 100:+.1f}%") if percent else (lambda v: f"{v:.2f}x")
    return _verdict(row, target, figure, lambda v: v >= limit, shown)


def _verdict(row: int, target: str, figure: Callable[[], tuple[float, str]], passes: Callable[[float], bool],
             shown: Callable[[float], str]) -> Verdict:
    try:
        value, detail = figure()
    except Missing as why:
        return Verdict(row, target, None, "n/a", f"n/a: {why}")
    except (KeyError, IndexError, TypeError, AttributeError) as err:  # a document cut short or of another shape
        return Verdict(row, target, None, "n/a", f"n/a: figures incomplete ({type(err).__name__}: {err})")
    return Verdict(row, target, value, f"{shown(value)} ({detail})", MET if passes(value) else MISSED)


def _ratio(a: float, b: float, unit: str, digits: int = 1) -> tuple[float, str]:
    if b == 0:
        raise Missing(f"a zero {unit} to divide by")
    return a / b, f"{a:.{digits}f} vs {b:.{digits}f} {unit}"


# ----- the rows --------------------------------------------------------------------------------------
def first_calls(part: Mapping[str, Any]) -> Iterator[Verdict]:
    """Row 1: each shape's first fwd+bwd <= 1.5x flash's; row 4: the tiny call <= 1.05x torch's default,
    from the first call on."""
    for index, text in ((0, "a fresh process's first fwd+bwd (b2 s1000)"),
                        (2, "first fwd+bwd at a new bucket's shape (b2 s3000)")):
        def step_ratio(index: int = index) -> tuple[float, str]:
            ours, flash = (_number(_side(part, s)["steps"][index]["ms"], f"{s} ms") for s in ("ours", "flash"))
            return _ratio(ours, flash, "ms")
        yield _at_most(1, f"{text} <= 1.5x flash's", 1.5, step_ratio)
    for key, text in (("first", "first call"), ("calls_2_101_median", "calls 2-101 (median)"),
                      ("calls_1001_1100_median", "calls 1001-1100 (median)")):
        def tiny_ratio(key: str = key) -> tuple[float, str]:
            ours, default = (_number(_side(part, s)["tiny_us"][key], f"{s} {key}") for s in ("ours", "default"))
            return _ratio(ours, default, "µs")
        yield _at_most(4, f"tiny forward (b1 h1 s64 d64), {text} <= 1.05x SDPA default", 1.05, tiny_ratio)


def generate(part: Mapping[str, Any]) -> Iterator[Verdict]:
    """Row 2, per model: tokens/s vs flash's >= 0.9x (first call), 1.0x (again), 0.9x (new prompt length).
    Where the run probed the host's speed (parts.GENERATE_SIDES says why): the ratio of the sides' medians
    over the calls the host ran at full speed, n/a where either side has fewer than STEADY_LEAST; else the
    median of the rounds' paired ratios; else (older runs) the ratio of the sides' medians."""
    for name, model in (part.get("models") or {}).items():
        for call, limit, text in (("first", 0.9, "first generate()"), ("again", 1.0, "the same generate() again"),
                                  ("new_prompt", 0.9, "a new prompt length's first generate()")):
            def speed(model: Mapping = model, call: str = call) -> tuple[float, str]:
                ours, flash = (_number(_side(model, s)["calls"][call]["tokens_per_s"], f"{s} tokens/s")
                               for s in ("ours", "flash"))
                paired = [_number(r, "paired ratio") for r in (model.get("paired_ratios") or {}).get(call) or []]
                if (model.get("steady") or {}).get("sides"):
                    return _steady(model["steady"]["sides"], call, paired)
                if "paired_ratios" not in model:
                    return _ratio(ours, flash, "tokens/s")
                if not paired:
                    raise Missing("no round where both sides finished")
                return (statistics.median(paired), f"median of {len(paired)} rounds' ratios; medians "
                                                   f"{ours:.1f} vs {flash:.1f} tokens/s")
            yield _at_least(2, f"{name}: {text}, tokens/s >= {limit}x flash's", limit, speed)


STEADY_LEAST = 3  # processes per side whose call the host ran at full speed


def _steady(sides: Mapping[str, Any], call: str, paired: list[float]) -> tuple[float, str]:
    found = {s: (sides.get(s) or {}).get(call) or {} for s in ("ours", "flash")}
    counts = ", ".join(f"{s} {f.get('processes', 0)} of {f.get('of', 0)}" for s, f in found.items())
    every = f"; every round paired: {statistics.median(paired):.2f}x" if paired else ""
    if any((f.get("processes") or 0) < STEADY_LEAST for f in found.values()):
        raise Missing(f"fewer than {STEADY_LEAST} processes per side ran this call at full host speed "
                      f"({counts}{every})")
    ours, flash = (_number(found[s]["tokens_per_s"], f"{s} steady tokens/s") for s in ("ours", "flash"))
    value, figures = _ratio(ours, flash, "tokens/s")
    return value, f"{figures}, full host speed: {counts}{every}"


def finetune(part: Mapping[str, Any]) -> Iterator[Verdict]:
    """Row 3: every step <= 1.1x flash's same step, and the total <= 1.0x flash's."""
    def steps() -> tuple[list[float], list[float]]:
        ours, flash = (list(_side(part, s).get("step_ms") or []) for s in ("ours", "flash"))
        if not ours or len(ours) != len(flash):
            raise Missing(f"steps measured: ours {len(ours)}, flash {len(flash)}")
        return [_number(x, "ours step ms") for x in ours], [_number(x, "flash step ms") for x in flash]

    def worst() -> tuple[float, str]:
        ours, flash = steps()
        ratios = [a / b for a, b in zip(ours, flash)]
        step = max(range(len(ratios)), key=ratios.__getitem__)
        return ratios[step], f"step {step + 1}: {ours[step]:.1f} vs {flash[step]:.1f} ms"

    def total() -> tuple[float, str]:
        ours, flash = steps()
        return _ratio(sum(ours), sum(flash), "ms")

    yield _at_most(3, "every step (new length each) <= 1.1x flash's same step", 1.1, worst)
    yield _at_most(3, "all steps together <= 1.0x flash's", 1.0, total)


def big_shape(part: Mapping[str, Any]) -> Iterator[Verdict]:
    """Row 5: attention() at Llama-3-8B's shape, warm, >= 0.98x the raw cuDNN graph's speed."""
    def speed() -> tuple[float, str]:
        impls = _ok(part, "the part").get("impls") or {}
        ours, raw = (_number((_ok(impls.get(n), n).get("ms") or {}).get("median"), f"{n} median ms")
                     for n in ("ours", "raw"))
        return raw / ours, f"raw {raw:.3f} ms / ours {ours:.3f} ms"
    yield _at_least(5, "b1 s8192 h32/8 d128 causal fwd+bwd, warm: speed >= 0.98x raw cuDNN graph", 0.98, speed)


def first_step(part: Mapping[str, Any]) -> Iterator[Verdict]:
    """Row 6: a fresh process's first training step (imports included) <= torch's default."""
    def ratio() -> tuple[float, str]:
        ours, default = (_number(_side(part, s).get("to_first_result_ms"), f"{s} time to first result")
                         for s in ("ours", "default"))
        return _ratio(ours, default, "ms", 0)
    yield _at_most(6, "first training step b2 s4096 from process start <= SDPA default's", 1.0, ratio)


def native(part: Mapping[str, Any]) -> Iterator[Verdict]:
    """Row 7: the compiled module gains >= 5% end to end (generate() tokens/s; training step ms; FP8
    inference forward ms)."""
    def gain(key: str, higher_is_better: bool) -> Callable[[], tuple[float, str]]:
        def figure() -> tuple[float, str]:
            settings = _ok(part, "the part").get("settings") or {}
            on, off = (settings.get(label, {}).get(key) or [] for label in ("on", "off"))
            if not on or not off:
                raise Missing(f"{key}: {len(on)} samples with the module, {len(off)} without")
            a, b = statistics.median(on), statistics.median(off)
            value = a / b - 1 if higher_is_better else b / a - 1
            return value, f"median {a:.1f} loaded vs {b:.1f} not, {len(on)}+{len(off)} samples"
        return figure
    yield _at_least(7, "compiled module: generate() tokens/s gain >= 5%", 0.05,
                    gain("generate_tokens_per_s", True), percent=True)
    yield _at_least(7, "compiled module: training step gain >= 5%", 0.05, gain("train_step_ms", False), percent=True)
    yield _at_least(7, "compiled module: FP8 inference forward gain >= 5%", 0.05, gain("fp8_forward_ms", False),
                    percent=True)


EVALUATORS: dict[str, Callable[[Mapping[str, Any]], Iterator[Verdict]]] = {
    "first_calls": first_calls, "generate": generate, "finetune": finetune, "big_shape": big_shape,
    "first_step": first_step, "native": native}


def evaluate(document: Mapping[str, Any]) -> list[Verdict]:
    """Every target of the parts the document holds, by row."""
    verdicts: list[Verdict] = []
    for name, part in (document.get("parts") or {}).items():
        if name in EVALUATORS:
            verdicts.extend(EVALUATORS[name](part if isinstance(part, Mapping) else {}))
    return sorted(verdicts, key=lambda v: v.row)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(verdicts: list[Verdict], heading: str = "") -> str:
    """The markdown table: row, target, measured, verdict; a count of met targets under it."""
    lines = [heading, ""] if heading else []
    lines += ["| row | done when | measured | verdict |", "|---|---|---|---|"]
    lines += [f"| {v.row} | {_cell(v.target)} | {_cell(v.measured)} | {_cell(v.verdict)} |" for v in verdicts]
    met = sum(v.verdict == MET for v in verdicts)
    unknown = sum(v.verdict not in (MET, MISSED) for v in verdicts)
    lines += ["", f"{met} of {len(verdicts)} targets met; {unknown} not measured."]
    return "\n".join(lines) + "\n"
