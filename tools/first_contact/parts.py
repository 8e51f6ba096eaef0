"""The parent's side of each part: which fresh processes it starts, with what arguments and time
limits, and what it keeps of their answers. Ratios and verdicts are worked out in targets.py."""

from __future__ import annotations

import statistics
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from tools.bench.common import first_line
from tools.first_contact import options
from tools.first_contact.options import Budget, Plan
from tools.first_contact.processes import run_fresh
from tools.first_contact.sides import SIDES

# Seconds one process of a part may run (its expected time is well below: see the module docs).
# Fresh processes per side in rows 1-4 and 6, the sides in turns: a process's start-up and torch
# import vary by a second or more from one process to the next, one step's time by a third, one
# generate()'s tokens/s by a fifth and the tiny call's median by half (flash's calls 2-101 were 78
# and 114 us in two runs on the H100 host of 2026-11-27), more than the differences those rows look for.
ROUNDS = 3
# Row 2 takes more: one generate()'s speed moves with the host's (GENERATE_SIDES), and its verdicts
# keep only the calls the host ran at full speed, a third of them or fewer on the lent hosts
# (docs/performance.md), so nine processes per side: a model's nine rounds take most of one
# ten-minute device command (`--models` runs the models apart, merge joins them).
GENERATE_ROUNDS = 9
# Row 2's sides: its targets compare ours with flash only, so torch's default is not run and its time
# buys more rounds. The lent hosts run a process's Python at full or about half speed, switching every
# few seconds (docs/performance.md, 'Row 2, generate(), and the host's speed'), which moves one
# generate() more than the targets' margins. So every call records a probe before and after it, and row
# 2's verdicts compare the calls the host ran at full speed (targets.generate; steady_host); each round's
# ratio of two back-to-back processes, and each side's median over all its processes, stay recorded.
GENERATE_SIDES = ("ours", "flash")
STEADY_FACTOR = 1.3
TIMEOUTS_S = {"env": 60.0, "first_calls": 90.0, "generate": 90.0, "finetune": 90.0, "big_shape": 120.0,
              "first_step": 60.0}


def log(*parts: Any) -> None:
    """Progress on stderr (stdout ends with the table)."""
    print("[first contact]", *parts, file=sys.stderr, flush=True)


def overall_status(results: Mapping[str, Mapping[str, Any]]) -> str:
    """"ok" when every side is ok; else the first side that is not, and how many are not."""
    bad = [(name, r.get("status", "failed: no status")) for name, r in results.items() if r.get("status") != "ok"]
    if not bad:
        return "ok"
    prefix = "failed" if len(bad) == len(results) else "partial"
    if all(str(status).startswith("skipped") for _, status in bad):
        prefix = "skipped" if len(bad) == len(results) else "partial"
    return f"{prefix}: {len(bad)} of {len(results)} not ok; {bad[0][0]}: {first_line(bad[0][1], 200)}"


def _rounds(part: str, args: Mapping[str, Any], budget: Budget, plan: Plan, default: int = ROUNDS,
            sides: tuple[str, ...] = SIDES) -> dict[str, list[dict]]:
    """Each side's answers of the plan's --processes (else `default`) fresh processes, the sides in turns,
    their order reversed every other round (so no side always follows the same one); each answer
    records its `round`."""
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for index in range(plan.processes or default):
        for side in (sides if index % 2 == 0 else sides[::-1]):
            found = run_fresh(part, side, args, budget.timeout(TIMEOUTS_S[part]))
            log(f"{part} {side}: {found.get('status')} ({found.get('process_s', 0):.1f} s)")
            runs[side].append(dict(found, round=index))
    return runs


def environment(budget: Budget) -> dict[str, Any]:
    """Device and versions, from a worker (it also brings torch's files into the page cache, so the
    first measured process does not pay their first read from disk alone)."""
    return run_fresh("env", "-", {}, budget.timeout(TIMEOUTS_S["env"]))


def first_calls(plan: Plan, budget: Budget) -> dict[str, Any]:
    """Rows 1 and 4: each side in ROUNDS (or --processes) fresh processes, the sides in turns; each step's ms and each
    tiny-call figure is its median over the side's processes (every process's in `rounds`)."""
    runs = _rounds("first_calls", plan.part_args("first_calls"), budget, plan)
    sides = {side: _median_first_calls(found) for side, found in runs.items()}
    return {"sides": sides, "status": overall_status(sides)}


def _median_first_calls(runs: list[dict]) -> dict[str, Any]:
    """The side's first finished process (its other fields: import time, dispatch_info, ...) with each
    step's ms and each tiny-call figure the median over the finished ones; `rounds` holds every
    process's status and figures. Where none finished, the first that failed (not one skipped)."""
    done = [r for r in runs if r.get("status") == "ok" and r.get("steps") and r.get("tiny_us")]
    if not done:
        failed = [r for r in runs if not str(r.get("status", "")).startswith("skipped")]
        return dict((failed or runs)[0])
    steps = [dict(step, ms=_middle(r["steps"][i]["ms"] for r in done if len(r["steps"]) > i))
             for i, step in enumerate(done[0]["steps"])]
    tiny = {key: (_middle(r["tiny_us"][key] for r in done) if isinstance(value, (int, float)) else value)
            for key, value in done[0]["tiny_us"].items()}
    rounds = [{"status": r.get("status"), "steps_ms": [step["ms"] for step in r.get("steps") or []],
               "tiny_us": r.get("tiny_us"), "native": r.get("native"), "dispatch_info": r.get("dispatch_info")}
              for r in runs]
    return dict(done[0], steps=steps, tiny_us=tiny, rounds=rounds, processes_measured=len(done))


def generate(plan: Plan, budget: Budget) -> dict[str, Any]:
    """Row 2: each model, each side in GENERATE_ROUNDS (or --processes) fresh processes, the sides in turns: each
    call's median tokens/s over the side's processes (every process's calls in `rounds_calls`), the rounds'
    paired ratios (`paired_ratios`) and the full-speed figures the verdicts compare (`steady`)."""
    models: dict[str, Any] = {}
    for name in plan.generate_models:
        config, batch, prompt, new_tokens, new_prompt = options.GENERATE[name]
        args = {"config": config, "batch": batch, "prompt": prompt, "new_tokens": new_tokens,
                "new_prompt": new_prompt, "again_calls": options.AGAIN_CALLS, "seed": options.SEED}
        runs = _rounds("generate", args, budget, plan, GENERATE_ROUNDS, GENERATE_SIDES)
        sides = {side: _median_calls(found) for side, found in runs.items()}
        _token_agreement(sides)
        models[name] = {"model": _model_text(config), "batch": batch, "prompt": prompt, "new_tokens": new_tokens,
                        "new_prompt": new_prompt, "sides": sides, "paired_ratios": paired_ratios(runs),
                        "steady": steady_host(runs), "status": overall_status(sides)}
    return {"models": models, "status": overall_status(models)}


def steady_host(runs: Mapping[str, list[dict]]) -> dict[str, Any]:
    """Per side and call, the median tokens/s over the processes that ran the call with the host at full
    speed: the probes' CPU time before and after it (models.host_probe) within STEADY_FACTOR of the fastest
    of any process of either side (see GENERATE_SIDES). A process's figure is the median of its full-speed
    calls of that name ("again 2", ... count as "again")."""
    done = {side: _finished(found) for side, found in runs.items()}
    probes = [ms for found in done.values() for r in found for figures in r["calls"].values() for ms in _probe(figures)]
    if not probes:
        return {}
    limit = STEADY_FACTOR * min(probes)
    sides: dict[str, dict[str, Any]] = {}
    for side, found in done.items():
        every = [_per_call(r["calls"]) for r in found]
        steady = [_per_call(r["calls"], lambda f: bool(_probe(f)) and max(_probe(f)) <= limit) for r in found]
        sides[side] = {}
        for call in dict.fromkeys(name for per in every for name in per):
            kept = [per[call] for per in steady if call in per]
            sides[side][call] = {"tokens_per_s": statistics.median(kept) if kept else None, "processes": len(kept),
                                 "of": sum(call in per for per in every)}
    return {"fastest_probe_ms": min(probes), "limit_ms": limit, "sides": sides}


def paired_ratios(runs: Mapping[str, list[dict]]) -> dict[str, list[float]]:
    """Per call, ours' tokens/s over flash's in each round where both processes finished (the two ran
    back to back, so they shared more of the host's state than two far apart: see GENERATE_SIDES); a
    process's figure for a repeated call is the median of its repeats."""
    flash = {r.get("round"): _per_call(r["calls"]) for r in _finished(runs.get("flash", []))}
    out: dict[str, list[float]] = {}
    for found in _finished(runs.get("ours", [])):
        theirs = flash.get(found.get("round"), {})
        for call, ours in _per_call(found["calls"]).items():
            if call in theirs:
                out.setdefault(call, []).append(ours / theirs[call])
    return out


def _finished(found: list[dict]) -> list[dict]:
    """A side's processes that finished with their calls measured."""
    return [r for r in found if r.get("status") == "ok" and r.get("calls")]


def _per_call(calls: Mapping[str, dict], keep: Callable[[dict], bool] = bool) -> dict[str, float]:
    """Per call name, the median tokens/s of a process's calls that `keep` keeps ("again 2", ... are
    "again"); a figure that is not a positive number is left out, on either side."""
    groups: dict[str, list[float]] = {}
    for name, figures in calls.items():
        speed = figures.get("tokens_per_s")
        if isinstance(speed, (int, float)) and speed > 0 and keep(figures):
            groups.setdefault(options.call_of(name), []).append(speed)
    return {name: statistics.median(speeds) for name, speeds in groups.items()}


def _probe(figures: Mapping[str, Any]) -> list[float]:
    """A call's probes, as CPU time of the calling thread: a wait for the GIL or for the CPU is not the
    host's speed (runs before host_probe recorded wall time only)."""
    return list(figures.get("probe_cpu_ms") or figures.get("probe_ms") or [])


def _median_calls(runs: list[dict]) -> dict[str, Any]:
    """The side's first finished process (its tokens and counters), with each call's median tokens/s
    over the finished ones."""
    done = [r for r in runs if r.get("status") == "ok" and r.get("calls")]
    if not done:
        return dict(runs[-1])
    calls = {}
    for call, first in done[0]["calls"].items():
        calls[call] = dict(first, tokens_per_s=_middle([r["calls"][call]["tokens_per_s"] for r in done
                                                        if call in r["calls"]]))
    return dict(done[0], calls=calls, rounds_calls=[r["calls"] for r in done],
                rounds_of_calls=[r.get("round") for r in done])


def _token_agreement(sides: Mapping[str, dict]) -> None:
    """Each side's share of first-call greedy tokens equal to flash's (bf16 rounding may flip a close
    argmax; a low share means the sides computed different things)."""
    reference = sides.get("flash", {}).get("first_tokens")
    for found in sides.values():
        tokens = found.get("first_tokens")
        if reference and tokens and len(tokens) == len(reference):
            found["first_tokens_equal_to_flash"] = sum(a == b for a, b in zip(tokens, reference)) / len(reference)


def finetune(plan: Plan, budget: Budget) -> dict[str, Any]:
    """Row 3: each side in ROUNDS (or --processes) fresh processes, the sides in turns; a side's `step_ms` is each
    step's median over its processes (every process's steps in `rounds_step_ms`)."""
    args = plan.part_args("finetune")
    runs = _rounds("finetune", args, budget, plan)
    sides = {side: _median_steps(found) for side, found in runs.items()}
    return {"model": _model_text(args["config"]), "batch": args["batch"], "sides": sides,
            "status": overall_status(sides)}


def _median_steps(runs: list[dict]) -> dict[str, Any]:
    """The side's last finished process, with each step's median over the finished ones."""
    done = [r for r in runs if r.get("status") == "ok" and r.get("step_ms")]
    if not done:
        return dict(runs[-1])
    steps = [_middle(values) for values in zip(*(r["step_ms"] for r in done))]
    return dict(done[-1], step_ms=steps, rounds_step_ms=[r["step_ms"] for r in done])


def big_shape(plan: Plan, budget: Budget) -> dict[str, Any]:
    """Row 5: one process, the implementations in turns."""
    found = run_fresh("big_shape", "ours", plan.part_args("big_shape"), budget.timeout(TIMEOUTS_S["big_shape"]))
    log(f"big_shape: {found.get('status')} ({found.get('process_s', 0):.1f} s)")
    if found.get("status") == "ok":
        impls = found.get("impls") or {}
        found["status"] = overall_status(impls) if impls else "failed: nothing measured"
    return found




def first_step(plan: Plan, budget: Budget) -> dict[str, Any]:
    """Row 6: time to the first result, from just before the process starts; each side's median of
    ROUNDS (or --processes) processes (all of them in `rounds_ms`)."""
    runs = _rounds("first_step", plan.part_args("first_step"), budget, plan)
    for found in (r for side_runs in runs.values() for r in side_runs):
        if "first_result_at" in found and "spawned_at" in found:
            found["to_first_result_ms"] = (found["first_result_at"] - found["spawned_at"]) * 1e3
    sides = {side: _median_run(found) for side, found in runs.items()}
    return {"sides": sides, "status": overall_status(sides)}


def _middle(values: Any, key: Any = None) -> Any:
    """The median of an odd number of values (ROUNDS), the lower of the two middle ones otherwise."""
    ordered = sorted(values, key=key)
    return ordered[(len(ordered) - 1) // 2]


def _median_run(runs: list[dict]) -> dict[str, Any]:
    """The process whose time to its first result is the median of its side's (a failed one where
    none finished), with every process's time."""
    timed = [r for r in runs if r.get("status") == "ok" and "to_first_result_ms" in r]
    chosen = dict(_middle(timed, key=lambda r: r["to_first_result_ms"]) if timed else runs[-1])
    chosen["rounds_ms"] = [r.get("to_first_result_ms") for r in runs]
    return chosen


def _model_text(config: Mapping[str, Any]) -> str:
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    return (f"{config['model_type']}: {config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
            f"{heads}/{kv} heads (head dim {config['hidden_size'] // heads}), vocab {config['vocab_size']}")


def run_part(name: str, runner: Callable[[Plan, Budget], dict], plan: Plan, budget: Budget) -> dict[str, Any]:
    """One part, never raising: "failed: reason" when it breaks, "skipped: time budget" when the
    budget is spent; its rows and wall time added."""
    started = time.monotonic()
    if budget.timeout(1.0, least=15.0) is None:
        result: dict[str, Any] = {"status": "skipped: time budget"}
    else:
        log(f"{name} (rows {', '.join(map(str, options.PARTS[name]))}), {budget.left():.0f} s left")
        try:
            result = runner(plan, budget)
        except Exception as err:  # noqa: BLE001 - the run goes on with the next part
            log(traceback.format_exc())
            result = {"status": f"failed: {type(err).__name__}: {first_line(err, 300)}"}
    result["rows"] = list(options.PARTS[name])
    result["wall_s"] = time.monotonic() - started
    return result
