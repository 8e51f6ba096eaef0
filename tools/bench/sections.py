"""The sections: for each, its parent-side run, its report renderer, and its worker functions."""

from __future__ import annotations

from typing import Callable, Mapping

from tools.bench import dispatch, environment, plan_rebuild, probe_cost, selection, shapes, warm_start, warmup_scaling
from tools.bench.common import Partial
from tools.bench.runner import Runner

RUNS: dict[str, Callable[[Runner], dict]] = {
    "selection": selection.run,
    "probe_cost": probe_cost.run,
    "warm_start": warm_start.run,
    "warmup_scaling": warmup_scaling.run,
    "dispatch": dispatch.run,
    "plan_rebuild": plan_rebuild.run,
    "shapes": shapes.run,
}

RENDERERS: dict[str, Callable[[Mapping], str]] = {
    "selection": selection.render,
    "probe_cost": probe_cost.render,
    "warm_start": warm_start.render,
    "warmup_scaling": warmup_scaling.render,
    "dispatch": dispatch.render,
    "plan_rebuild": plan_rebuild.render,
    "shapes": shapes.render,
}

# `--worker NAME`: the measurement run in a subprocess.
WORKERS: dict[str, Callable[[Mapping, Partial], None]] = {
    "env": environment.worker,
    "selection": selection.worker,
    "probe_file": probe_cost.worker,
    "warm_start": warm_start.worker,
    "warmup": warmup_scaling.worker,
    "dispatch": dispatch.worker,
    "rebuild": plan_rebuild.worker,
    "shapes": shapes.worker,
}
