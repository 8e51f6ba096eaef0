"""First contact, side by side: every "done when" row of issue 34 in one run on one GPU.

    python -m tools.bench_first_contact -o tools/results/first-contact-h100.json [--quick] [--parts 1,2,5]
        [--processes N] [--models llama,qwen2]

Sides: "ours" (fusedattn_select.attention; models: attn_implementation "fusedattn"), "flash" (torch
SDPA pinned to its flash backend), "default" (torch SDPA's own choice). Each side runs in its own
fresh process with an empty store (FUSEDATTN_SELECT_CACHE_DIR a new temp directory):

  1. first fwd+bwd (causal bf16, 32/8 heads, d128) of a fresh process (b2 s1000), again, at a shape of
     an unbuilt bucket (b2 s3000), again; vs flash's same call; three processes per side in turns
     (with row 4), each figure's median
  2. transformers generate() (random weights; a Llama 6 layers 12/4 heads batch 1, a Qwen2 4 layers
     14/2 heads batch 2): first call, the same call again (three times), a new prompt length; tokens/s
     vs flash (torch's default not run), nine processes per side in turns, each with a CPU probe
     around every call; the verdicts compare the calls the host ran at full speed (parts.GENERATE_SIDES)
  3. fine-tuning a 4-layer Llama with a new sequence length every step (batch 4, AdamW); ms per step,
     three processes per side in turns, each step's median
  4. a tiny forward (b1 h1 s64 d64): first call, medians of calls 2-101 and 1001-1100 vs SDPA default
  5. Llama-3-8B's attention (b1 s8192 32/8 d128 causal) fwd+bwd warm: attention() vs the raw cuDNN
     graph vs flash, in turns in one process (CUDA events, medians)
  6. a fresh process's first training step (b2 s4096) from the process's start, imports included;
     three processes per side, the sides in turns, each side's median
  7. the compiled module loaded vs not (FUSEDATTN_SELECT_NATIVE=1/0; built first where it is not):
     generate() tokens/s and a training step, in turns

Writes one JSON document (device, versions, git commit, date, every part's figures and the verdicts)
to -o, and prints the done-when table. A part that fails records "failed: reason" and the run goes
on; the run keeps to a time budget (default 460 s, --quick 300 s), skipping the parts it has no time
left for. `--processes N` (odd) runs N processes per side in rows 1-4 and 6 instead of three (row 2:
nine); `--models` picks row 2's models. Where one command may run only so long, run the parts (or
row 2's models) in several runs on one machine and merge them:
`python -m tools.first_contact.merge -o OUT a.json b.json`. Modules: tools/first_contact/.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from tools.bench.common import clean_json
from tools.bench.environment import _git_rev
from tools.first_contact import native_turns, parts, targets
from tools.first_contact.options import Budget, Plan, parse_args

RUNNERS: dict[str, Callable[[Plan, Budget], dict]] = {
    "first_calls": parts.first_calls, "generate": parts.generate, "finetune": parts.finetune,
    "big_shape": parts.big_shape, "first_step": parts.first_step, "native": native_turns.native}
# Versions and device from the environment worker, lifted to the document's top level.
TOP_LEVEL = ("device", "gpu_name", "capability", "driver", "torch", "torch_cuda", "torch_cudnn", "cudnn_backend",
             "cudnn_frontend", "transformers", "library", "python", "host", "nvidia_smi")


def measure(plan: Plan, argv: list[str]) -> dict[str, Any]:
    """Run the plan's parts; the document."""
    started = time.monotonic()
    budget = Budget(plan.budget_s)
    environment = parts.environment(budget)
    document: dict[str, Any] = {
        "schema": "fusedattn-first-contact/1",
        "command": " ".join(["python -m tools.bench_first_contact", *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **{key: environment[key] for key in TOP_LEVEL if key in environment},
        "git_commit": _git_rev(),
        "environment": environment,
        "quick": plan.quick, "budget_s": plan.budget_s, "processes_per_side": plan.processes,
        "parts_selected": list(plan.parts), "parts": {}}
    for name in plan.parts:
        document["parts"][name] = parts.run_part(name, RUNNERS[name], plan, budget)
        if plan.output:  # what is measured so far survives a run that is cut off
            write(clean_json(document), plan.output)
    document["wall_s"] = time.monotonic() - started
    verdicts = targets.evaluate(document)
    document["targets"] = [v.as_json() for v in verdicts]
    document["table"] = targets.render(verdicts, _heading(document))
    return clean_json(document)


def write(document: dict[str, Any], path: str) -> None:
    """The document as indented JSON at `path` (its folder made where missing)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(document, handle, indent=1)
        handle.write("\n")


def _heading(document: dict[str, Any]) -> str:
    return (f"First contact on {document.get('device', 'n/a')} (torch {document.get('torch', 'n/a')}, cuDNN "
            f"{document.get('cudnn_backend', 'n/a')}, cudnn-frontend {document.get('cudnn_frontend', 'n/a')}, "
            f"git {document.get('git_commit', 'n/a')}, {document['date']}; {document['wall_s']:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    plan = parse_args(argv, __doc__.splitlines()[0])
    document = measure(plan, argv)
    if plan.output:
        write(document, plan.output)
    print(document["table"], end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
