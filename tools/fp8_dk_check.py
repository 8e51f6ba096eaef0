"""Where verify finds an FP8 backward's dK off the reference: is it dK's scale, or the graph itself?

    python -m tools.fp8_dk_check                  # the problems the H100 verify sweep found missing
    python -m tools.fp8_dk_check --problems llama-3-8b-fp8:train-fp8-delayed --repeats 5
    python -m tools.fp8_dk_check --config probes/fp8-backward-race.yaml --divisors 1 256 --workspace empty

Each problem is verified (the engine's forward and backward probes at depth verify, no selector rule in
front of them: cudnn-9.19-hopper-fp8-gqa-backward refuses most of these problems) with dK's
scale sized from its bound, dtypes.fp8_gradient_bounds (as dispatch would size it; verify itself sizes
gradient scales from the reference's amax), and with that bound divided by
powers of two (a larger scale: dK keeps more bits, until it saturates); `--repeats` times each, with
the graph's workspace as verify allocates it (uninitialized) and zeroed. Every check also runs the
backward graph `--executions` more times on the same inputs (each with fresh outputs and workspace)
and records the largest difference from its first dQ, dK and dV, in the values the graph writes (an
FP8 gradient's are its real values times its scale): a graph that computes the same thing twice
differs by 0. `--config FILE` asks every FP8 training entry of a config file.

A diagnostic: it replaces verify's gradient magnitudes and workspace allocation in this process only
(probing/cudnn/verify_run.py). Writes tools/results/fp8-dk-check-<device>.json, with `--config FILE`
fp8-dk-check-<FILE stem>-<device>.json (and a copy in $OUT when set).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

from tools.verify_sweep import ROOT, _environment, device_tag

SUITES = {"llama-3-8b-fp8": ROOT / "configs" / "llama-3-8b-fp8.yaml", "hopper-suite": ROOT / "probes" / "hopper-suite.yaml"}
# The FP8 backwards the H100 verify sweep of 2026-11-27 found missing the reference (docs/verify.md).
DEFAULT_PROBLEMS = ("llama-3-8b-fp8:train-fp8-delayed", "llama-3-8b-fp8:train-fp8-delayed-hybrid",
                    "llama-3-8b-fp8:train-fp8-current-fp8-output", "llama-3-8b-fp8:train-fp8-delayed-deterministic",
                    "hopper-suite:fp8e4m3-delayed-d128-causal-gqa4-s2048-train")
DIVISORS = (1, 16, 256, 4096, 65536)
GRADIENTS = ("dQ", "dK", "dV")
# The verdict keeps only its detail text: read as probing/cudnn/tolerances.Check.describe writes it.
_ERROR = re.compile(r"\b(dQ|dK|dV)(?: \(second execution\))? max error ([0-9.e+-]+|inf)")


def config_problems(path: Path) -> list[tuple[str, Any]]:
    """(`stem:entry`, config) of every FP8 training entry of a config file; ValueError where it has none."""
    from fusedattn_select.config_files import load_config_file

    found = [(f"{path.stem}:{e.name}", e.config) for e in load_config_file(path).entries
             if e.config.is_fp8 and e.config.is_training]
    if not found:
        raise ValueError(f"--config {path}: the file has no FP8 training entry")
    return found


def problems(names: list[str]) -> list[tuple[str, Any]]:
    """(name, config) of each `suite:entry`; ValueError naming the unknown one."""
    from fusedattn_select.config_files import load_config_file

    found = []
    for name in names:
        suite, _, entry = name.partition(":")
        if suite not in SUITES:
            raise ValueError(f"--problems {name!r}: the suite must be one of {', '.join(SUITES)}")
        match = [e for e in load_config_file(SUITES[suite]).entries if e.name == entry]
        if not match:
            raise ValueError(f"--problems {name!r}: {SUITES[suite].name} has no entry {entry!r}")
        found.append((name, match[0].config))
    return found


def errors(detail: str) -> dict[str, float]:
    """The gradients' max errors a backward verdict's detail gives."""
    return {name: float(value) for name, value in _ERROR.findall(detail)}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per problem: checks run, checks whose dK passed, dK errors above 1 (beyond the reference's own
    largest magnitude: not rounding), and checks whose repeated executions differed."""
    out: dict[str, Any] = {}
    for row in rows:
        s = out.setdefault(row["problem"], {"checks": 0, "dK_passed": 0, "dK_error_above_1": 0, "repeat_differed": 0})
        s["checks"] += 1
        dk = row["errors"].get("dK")
        s["dK_passed"] += dk is not None and dk <= row["tolerance"]
        s["dK_error_above_1"] += dk is not None and dk > 1.0
        s["repeat_differed"] += any(d > 0.0 for run in row["repeat_max_diff"] for d in run.values())
    return out


class _Patched:
    """verify_run with dK's bound divided by `divisor`, the workspace zeroed where asked, and each backward
    execution run `executions` more times (differences kept in `repeats`)."""

    def __init__(self, verify_run: Any, torch: Any, executions: int) -> None:
        self.divisor, self.zero, self.repeats = 1, False, []
        bounds_of, execute, patched = verify_run._bounds_of, verify_run.execute, self

        def scaled_bounds(bound: Any) -> dict[str, float]:
            # Every gradient's scale from its bound (verify itself sizes them from the reference's amax).
            if not bound.gradient_bounds:
                found = dict(bounds_of(bound))
                found["dK"] = found["dK"] / patched.divisor
                bound.gradient_bounds = found
            return bound.gradient_bounds

        class Torch:  # verify_run's `torch`: its workspace (uint8) zeroed where asked
            def __getattr__(self, name: str) -> Any:
                return getattr(torch, name)

            def empty(self, *args: Any, **kwargs: Any) -> Any:
                made = torch.empty(*args, **kwargs)
                return made.zero_() if patched.zero and kwargs.get("dtype") is torch.uint8 else made

        def repeated(bound: Any, build: Any, phase: Any, handle: Any, after_execute: Any = None) -> Any:
            outputs = execute(bound, build, phase, handle, after_execute)
            # Verify runs the backward twice: the repeats are of its first execution only.
            if phase.value == "backward" and not patched.repeats:
                first = {n: outputs[n].float().clone() for n in GRADIENTS if n in outputs}
                patched.repeats = [{n: float((again[n].float() - t).abs().max()) for n, t in first.items()}
                                   for again in (execute(bound, build, phase, handle, None) for _ in range(executions))]
                bound.tensors.update(outputs)  # the checks read the first execution's
            return outputs

        verify_run._gradient_bounds, verify_run.torch, verify_run.execute = scaled_bounds, Torch(), repeated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=list(DEFAULT_PROBLEMS), help="suite:entry (suites: "
                        + ", ".join(SUITES) + ")")
    parser.add_argument("--config", type=Path, help="ask every FP8 training entry of this config file instead")
    parser.add_argument("--divisors", type=int, nargs="+", default=list(DIVISORS),
                        help="dK bound divisors (default " + " ".join(map(str, DIVISORS)) + ")")
    parser.add_argument("--workspace", choices=("both", "empty", "zeroed"), default="both",
                        help="the workspace as verify allocates it (empty), zeroed, or both (default)")
    parser.add_argument("--repeats", type=int, default=2, help="checks per divisor and workspace (default 2)")
    parser.add_argument("--executions", type=int, default=3,
                        help="further backward executions per check, compared with the first (default 3)")
    parser.add_argument("-o", "--output", type=Path, help="default tools/results/fp8-dk-check-<device>.json")
    args = parser.parse_args(argv)
    for name in ("divisors", "repeats", "executions"):
        values = getattr(args, name)
        if min(values if isinstance(values, list) else [values]) < 1:
            parser.error(f"--{name} must be 1 or more")
    try:
        asked = config_problems(args.config) if args.config else problems(args.problems)
    except (ValueError, OSError) as err:
        parser.error(str(err))
    import torch

    from fusedattn_select.probing.cudnn import tolerances, verify_run
    from fusedattn_select.probing.cudnn.cudnn_engine import CudnnEngine
    from fusedattn_select.types import Backend, Phase, ProbeDepth

    engine = CudnnEngine()
    document: dict[str, Any] = {"tool": "tools/fp8_dk_check.py", "environment": _environment(engine), "rows": []}
    stem = f"fp8-dk-check-{args.config.stem}" if args.config else "fp8-dk-check"
    path = args.output or ROOT / "tools" / "results" / f"{stem}-{device_tag(document['environment']['device'])}.json"
    patched = _Patched(verify_run, torch, args.executions)
    for name, cfg in asked:
        tolerance = tolerances.fp8_tolerance(cfg.qkv_dtype, cfg.resolved_do_dtype, cfg.resolved_dqkv_dtype)
        for zero in {"both": (False, True), "empty": (False,), "zeroed": (True,)}[args.workspace]:
            for divisor in args.divisors:
                for _ in range(args.repeats):
                    patched.divisor, patched.zero, patched.repeats = divisor, zero, []
                    # The engine itself, forward then backward (the backward check reads the forward's
                    # tensors): a selector would answer a problem a rule refuses without running it.
                    forward, backward = (engine.probe(cfg, Backend.FP8, phase, ProbeDepth.VERIFY)
                                         for phase in (Phase.FORWARD, Phase.BACKWARD))
                    row = {"problem": name, "zeroed_workspace": zero, "dK_bound_divisor": divisor,
                           "answer": "FP8" if forward.supported and backward.supported else "NONE",
                           "tolerance": tolerance, "errors": errors(backward.detail),
                           "repeat_max_diff": patched.repeats}
                    document["rows"].append(row)
                    print(json.dumps(row), flush=True)
    document["summary"] = summary(document["rows"])
    text = json.dumps(document, indent=1) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], path.name).write_text(text)
    print(json.dumps(document["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
