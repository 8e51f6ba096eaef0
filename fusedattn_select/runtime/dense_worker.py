"""The worker process of dense_builds: `python -m fusedattn_select.runtime.dense_worker FD`.

Reads one JSON job per line on stdin ({"id", "config", "return_lse", "store_dir", "device"}), selects
the problem's own graphs and builds their plans into the persistent store, and answers one JSON line
per job on the pipe FD: {"id", "result": ""} when the plans are stored, {"id", "result": why} when
the graphs are rejected or do not build, {"id", "error": ...} when the job itself failed. Exits at
the end of its input, and quietly when the answer pipe is closed (the calling process is gone).
"""

from __future__ import annotations

import json
import os
import sys

from fusedattn_select.config import AttnConfig
from fusedattn_select.runtime.dense_builds import plan_phases
from fusedattn_select.selection.warmup import worker_selector


def build(config: dict, return_lse: bool, store_dir: str, device: int) -> str:
    """The dense answer of `config` (stored), then its plans (stored); "" or why not."""
    import torch

    from fusedattn_select.runtime import plans

    selector = worker_selector(store_dir, device)
    cfg = AttnConfig.from_dict(config)
    selection = selector.select_dense(cfg)
    if not selection.selected:
        return selection.message
    for plan_cfg, backend, phase in plan_phases(cfg, selection.backend, return_lse):
        try:
            plans.obtain_plan(plan_cfg, backend, phase, torch.device("cuda", device), selector=selector)
        except plans.PlanBuildError as err:
            selector.record_build_failure(cfg, err.verdict)
            return err.verdict.reason()
    return ""


def main() -> None:
    answers = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    for line in sys.stdin:
        job = json.loads(line)
        try:
            answer = {"id": job["id"], "result": build(job["config"], job["return_lse"], job["store_dir"],
                                                       job["device"])}
        except Exception as err:  # noqa: BLE001 - reported to the caller, who builds inline instead
            answer = {"id": job["id"], "error": f"{type(err).__name__}: {err}"}
        try:
            answers.write(json.dumps(answer) + "\n")
        except BrokenPipeError:  # the calling process exited while this job ran: nobody to answer
            os._exit(0)


if __name__ == "__main__":
    main()
