"""Which dropout graphs with few query rows run: a map of cuDNN's dense forward at depth verify.

    python -m tools.dropout_row_check        # writes tools/results/dropout-row-check-<device>.json ($OUT too)

Each problem (bf16, no mask, dropout, one KV head per query head) is verified through the engine with
no selector rule in front (cudnn-9.19-hopper-dropout-one-query-row refuses the one-row ones): its
dense graph and, where it has one, its shape bucket's ragged graph, each executed on seeded data and
compared with the float32 reference (docs/verify.md, "Dropout"). An illegal memory access leaves the
process's CUDA context unusable, so problems run in a child process that stops at the first one and
a fresh child goes on with the rest; such a check is recorded as "illegal memory access".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tools.verify_sweep import ROOT, device_tag

ROWS = (1, 2, 4, 16, 64)
KEYS = (128, 256, 384, 448, 512, 513, 768, 2048)
HEAD_DIMS = (64, 128)
EXTRA = ((4, 8, 1, 512, 64, 0, 0.1), (1, 1, 1, 512, 64, 1, 0.1), (1, 1, 1, 512, 64, 0, 0.01))
CRASH = "illegal memory access"

_CHILD = r"""
import json, sys
from fusedattn_select.buckets import bucket_form
from fusedattn_select.config import AttnConfig
from fusedattn_select.probing.cudnn import CudnnEngine
from fusedattn_select.types import Backend, Phase, ProbeDepth

engine = CudnnEngine()
print("FINGERPRINT " + json.dumps(engine.fingerprint().to_dict()), flush=True)
for batch, heads, rows, keys, dim, training, dropout in json.loads(sys.argv[1]):
    cfg = AttnConfig(batch_size=batch, num_heads_q=heads, num_heads_kv=heads, seqlen_q=rows, seqlen_kv=keys,
                     head_dim_qk=dim, qkv_dtype="bf16", dropout=dropout, is_training=bool(training))
    forms = [("dense", cfg)] + ([("bucket", bucket_form(cfg))] if bucket_form(cfg) is not None else [])
    for form, problem in forms:
        verdict = engine.probe(problem, Backend.F16, Phase.FORWARD, ProbeDepth.VERIFY)
        text = " ".join((verdict.message or verdict.detail).split())
        print("CHECK " + json.dumps({"case": [batch, heads, rows, keys, dim, training, dropout], "form": form,
                                      "outcome": verdict.outcome.value, "text": text[:300]}), flush=True)
        if "illegal memory access" in text:
            sys.exit(3)
"""


def cases() -> list[tuple]:
    grid = [(1, 1, rows, keys, dim, 0, 0.1) for dim in HEAD_DIMS for rows in ROWS for keys in KEYS]
    return grid + list(EXTRA)


def run(todo: list[tuple]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the device's fingerprint, one row per check): children until every case is checked."""
    fingerprint: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    while todo:
        child = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(todo)], capture_output=True, text=True,
                               cwd=ROOT, timeout=600)
        done = set()
        for line in child.stdout.splitlines():
            if line.startswith("FINGERPRINT "):
                fingerprint = json.loads(line[len("FINGERPRINT "):])
            elif line.startswith("CHECK "):
                row = json.loads(line[len("CHECK "):])
                row["outcome"] = "illegal memory access" if CRASH in row["text"] else row["outcome"]
                rows.append(row)
                done.add(tuple(row["case"]))
        if not done:
            raise SystemExit(f"the child checked nothing (exit {child.returncode}): {child.stderr[-2000:]}")
        todo = [case for case in todo if tuple(case) not in done]
    return fingerprint, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="the result file (default: tools/results/...)")
    args = parser.parse_args(argv)
    import torch

    fingerprint, rows = run([list(case) for case in cases()])
    device = torch.cuda.get_device_name(0)
    document = {"tool": "tools/dropout_row_check.py", "device": device, "torch": torch.__version__,
                "fingerprint": fingerprint, "columns": "case = [batch, heads, seqlen_q, seqlen_kv, head_dim, "
                "is_training, dropout]", "rows": rows,
                "summary": {outcome: sum(1 for row in rows if row["outcome"] == outcome)
                            for outcome in sorted({row["outcome"] for row in rows})}}
    path = args.out or ROOT / "tools" / "results" / f"dropout-row-check-{device_tag(device)}.json"
    text = json.dumps(document, indent=1) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], path.name).write_text(text)
    print(json.dumps(document["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
