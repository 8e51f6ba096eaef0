"""Statistics, number formatting, result status, JSON cleaning and timing shared by every section.

Nothing here imports torch, cuDNN or fusedattn_select.
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

ROOT = Path(__file__).resolve().parent.parent.parent
SCHEMA = "fusedattn-select-bench/1"
RESULT_STATUS_OK = "ok"


# ----- statistics --------------------------------------------------------------------------------
def warmed_selector() -> Any:
    """The process's selector with its engine's one-time warm-up done: a selector's live engine
    builds its warm-up graph before its first probe, which these benches time as process start."""
    from fusedattn_select.selection.selector import default_selector

    selector = default_selector()
    selector.warm_up()
    return selector


def summarize(samples: Iterable[float | None], unit: str = "") -> dict | None:
    """Median and spread of `samples` (None and non-finite values dropped); None when empty.

    p25/p75 are the inclusive quartiles when there are at least 4 samples, else min and max.
    """
    xs = sorted(float(x) for x in samples if x is not None and math.isfinite(float(x)))
    if not xs:
        return None
    n = len(xs)
    if n >= 4:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1, q3 = xs[0], xs[-1]
    return {"median": statistics.median(xs), "p25": q1, "p75": q3, "min": xs[0], "max": xs[-1],
            "n": n, "unit": unit}


def median_of(stat: Mapping | None) -> float | None:
    if not isinstance(stat, Mapping):
        return None
    value = stat.get("median")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def ratio(numerator: Mapping | float | None, denominator: Mapping | float | None) -> float | None:
    """numerator / denominator of two medians (or plain numbers); None when either is missing or 0."""
    a = numerator if isinstance(numerator, (int, float)) else median_of(numerator)
    b = denominator if isinstance(denominator, (int, float)) else median_of(denominator)
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b == 0:
        return None
    return a / b


def attention_flops(batch: int, heads_q: int, seqlen_q: int, seqlen_kv: int, head_dim_qk: int,
                    head_dim_v: int | None = None, causal: bool = False) -> float:
    """Forward FLOPs: 2*B*H*Sq*Skv*(Dqk + Dv) (= 4*B*H*Sq*Skv*D), halved for a causal mask.
    The backward pass is counted as 2.5x the forward pass (BACKWARD_FLOP_FACTOR)."""
    dv = head_dim_qk if head_dim_v is None else head_dim_v
    flops = 2.0 * batch * heads_q * seqlen_q * seqlen_kv * (head_dim_qk + dv)
    return flops / 2 if causal else flops


BACKWARD_FLOP_FACTOR = 2.5


def config_flops(cfg: Any) -> float:
    """attention_flops of an AttnConfig (causal only for the plain "causal" mask)."""
    return attention_flops(cfg.batch_size, cfg.num_heads_q, cfg.seqlen_q, cfg.seqlen_kv, cfg.head_dim_qk,
                           cfg.resolved_head_dim_v, cfg.mask == "causal")


def tflops(flops: float | None, ms: float | None) -> float | None:
    if flops is None or ms is None or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e12


def stride_subset(items: Sequence[Any], n: int) -> list[Any]:
    """n items evenly spread over `items` (all of them when n >= len), order kept."""
    if n <= 0:
        return []
    if n >= len(items):
        return list(items)
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


# ----- formatting --------------------------------------------------------------------------------
def fmt_num(x: float | None) -> str:
    """A short human figure: 3 significant digits below 100, integers above."""
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "n/a"
    ax = abs(x)
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    if ax == 0:
        return "0"
    return f"{x:.3g}"


def fmt_stat(stat: Mapping | None) -> str:
    """"median [p25–p75]" (n >= 4), "median (min–max)" (n 2-3), "median (n=1)", or "n/a"."""
    med = median_of(stat)
    if med is None:
        return "n/a"
    n = int(stat.get("n", 1))
    if n >= 4:
        return f"{fmt_num(med)} [{fmt_num(stat['p25'])}–{fmt_num(stat['p75'])}]"
    if n >= 2:
        return f"{fmt_num(med)} ({fmt_num(stat['min'])}–{fmt_num(stat['max'])})"
    return f"{fmt_num(med)} (n=1)"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{fmt_num(value)}x"


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub markdown table (the library's renderer: pipes in cells escaped, newlines folded).

    Imported on first use: only the parent renders, and a worker's first import of the library
    is part of what the warm-start section times.
    """
    from fusedattn_select.cli.table import render_markdown_table

    return render_markdown_table(headers, rows)


def first_line(text: Any, limit: int = 240) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


# ----- result status -----------------------------------------------------------------------------
def failed(reason: Any) -> str:
    return "failed: " + first_line(reason, 400)


def error_status(err: BaseException) -> str:
    """failed(...) naming the exception's type and message."""
    return failed(f"{type(err).__name__}: {err}")


def skipped(reason: str = "time budget") -> str:
    return "skipped: " + reason


def is_ok(status: Any) -> bool:
    return status == RESULT_STATUS_OK


def combined_status(items: Sequence[Mapping], key: str) -> str:
    """ok when every item is ok; failed when none is; partial otherwise (naming the first problem)."""
    if not items:
        return failed("nothing was measured")
    bad = [i for i in items if not is_ok(i.get("status", RESULT_STATUS_OK))]
    if not bad:
        return RESULT_STATUS_OK
    first = f"{bad[0].get(key)}: {bad[0].get('status')}"
    if len(bad) == len(items):
        if all(str(i.get("status", "")).startswith("skipped") for i in bad):
            return skipped(f"time budget ({len(bad)} items)")
        return failed(f"all {len(items)} items; first {first}")
    return f"partial: {len(bad)} of {len(items)} not ok; first {first}"


def clean_json(value: Any) -> Any:
    """A JSON-safe copy: NaN/inf -> None, tuples -> lists, unknown objects -> str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [clean_json(v) for v in value]
    return str(value)


# ----- worker side: results and timing -----------------------------------------------------------
class Partial(dict):
    """A worker's result, written to disk after every item so a crash keeps what was measured."""

    def __init__(self, path: str | None) -> None:
        super().__init__()
        self.path = path

    def save(self) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(clean_json(dict(self)), fh)
        os.replace(tmp, self.path)

    def skipped_past(self, row: dict, deadline: float | None, margin: float) -> bool:
        """True, with `row` marked skipped and saved, when less than `margin` s is left."""
        if not past(deadline, margin):
            return False
        row["status"] = skipped()
        self.save()
        return True


def log(*parts: Any) -> None:
    print("[bench worker]", *parts, file=sys.stderr, flush=True)


def settle(torch: Any, what: str) -> None:
    """Wait for the device and give cached memory back (between measured items)."""
    try:
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
    except Exception as err:  # noqa: BLE001 -- a broken context fails the items after it too
        log(f"cannot synchronize after {what}: {err}")


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - started) * 1e3


def time_calls(fn: Callable[[], Any], calls: int, batches: int) -> list[float]:
    """µs per call over `batches` timed batches of calls//batches back-to-back calls (GC off)."""
    per = max(1, calls // batches)
    for _ in range(min(per, 200)):
        fn()
    samples = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(batches):
            started = time.perf_counter_ns()
            for _ in range(per):
                fn()
            samples.append((time.perf_counter_ns() - started) / per / 1e3)
    finally:
        if enabled:
            gc.enable()
    return samples


def past(deadline: float | None, margin: float = 0.0) -> bool:
    return deadline is not None and time.time() + margin > deadline


def call_entry(q: Any, k: Any, v: Any, training: bool, **arguments: Any) -> Any:
    """The decision attention(q, k, v, **arguments) runs with (runtime.entries.Entry), found as
    attention() finds it (None before its first call, or for calls with optional tensors)."""
    from fusedattn_select.runtime import entries
    from fusedattn_select.runtime.dispatcher import dispatcher
    from fusedattn_select.runtime.args import Arguments

    # attention()'s non-tensor arguments as its hot-path key holds them (Arguments: order and defaults)
    given = tuple(Arguments(**{n: arguments[n] for n in Arguments._fields if n in arguments}))
    key = entries.fast_key(q, k, v, given, training, arguments.get("seqlens_q"), arguments.get("seqlens_kv"))
    return dispatcher.by_call.get(key)


def steady_plans(call: Callable[[], Any], q: Any, k: Any, v: Any, training: bool, timeout_s: float = 240.0,
                 **arguments: Any) -> str:
    """Call `call` (one use of attention(q, k, v, **arguments)) until that signature runs its own
    plans, as a shape repeated for long does: its `dense_after` calls, then until the worker process
    has stored them; "dense", "bucket" when they did not come (rejected, or not within `timeout_s`),
    or "unknown" when the call is not on the hot path."""
    from fusedattn_select.runtime import entries
    from fusedattn_select.runtime.run_settings import run_settings

    for _ in range(run_settings.get().dense_after + 1):
        call()
    # A shape whose class's previous one had many calls waits for more (entries.MAX_PASS).
    untried = 2 * entries.MAX_PASS
    deadline = time.monotonic() + timeout_s
    while True:
        found = call_entry(q, k, v, training, **arguments)
        if found is None:
            return "unknown"
        if getattr(found, "waiting", None) is not None and time.monotonic() < deadline:
            time.sleep(0.05)  # on torch SDPA until its cuDNN plans are prepared (runtime/tiers.py)
            call()
            continue
        waiting = found.promotion in ("pending", "trying") or (found.promotion == "" and untried > 0)
        if not found.bucketed or not waiting or time.monotonic() > deadline:
            return "bucket" if found.bucketed else "dense"
        if found.promotion:
            time.sleep(0.05)
        else:
            untried -= 1
        call()


def rotated(items: Sequence[Any], shift: int) -> list[Any]:
    """`items` rotated left by `shift` (which implementation goes first changes from shape to shape)."""
    if not items:
        return []
    shift %= len(items)
    return list(items[shift:]) + list(items[:shift])


# A timer of in_turns: called once per round with whether it is its first, it returns its samples of
# that round by quantity (e.g. {"fwd_ms": [...], "bwd_ms": [...]}).
Timer = Callable[[bool], Mapping[str, Sequence[float]]]


def in_turns(timers: Sequence[tuple[str, Timer]], rounds: int) -> dict[str, dict[str, Any]]:
    """Run every timer `rounds` times, one round of each before the next round of any, the order
    rotating from round to round, so a host that is busy for a while weighs on every implementation
    alike. Returns, by timer name, its samples gathered over the rounds by quantity, or
    {"error": exception} for a timer that raised (it takes no further turns)."""
    out: dict[str, dict[str, Any]] = {name: {} for name, _ in timers}
    live = list(timers)
    for index in range(max(1, rounds)):
        for name, timer in rotated(live, index):
            try:
                samples = timer(index == 0)
            except Exception as err:  # noqa: BLE001 -- recorded as that implementation's status
                out[name] = {"error": err}
                live = [t for t in live if t[0] != name]
                continue
            for quantity, values in samples.items():
                out[name].setdefault(quantity, []).extend(values)
    return out


def promotions_done(timeout_s: float = 240.0) -> None:
    """Wait until the worker process has finished every dense-plan job asked so far, and every
    signature torch serves while its cuDNN runner is prepared has it prepared (so no build runs
    beside the timed calls of another implementation, and the next calls swap)."""
    from concurrent.futures import wait

    from fusedattn_select.runtime.dispatcher import dispatcher

    pending = [e.pending for e in list(dispatcher.by_call.values()) if e.pending is not None]
    pending += [e.waiting for e in list(dispatcher.entries.values()) if e.waiting is not None]
    if pending:
        wait(pending, timeout=timeout_s)
