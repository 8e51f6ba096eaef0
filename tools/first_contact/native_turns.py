"""Row 7, the parent's side: the compiled module loaded (FUSEDATTN_SELECT_NATIVE=1) vs not (=0) on
end-to-end workloads, in turns.

The module is built first where no process built it yet (`python3 -m fusedattn_select.cli native
build`, about 1.5 minutes on the H100) into processes.native_dir(), the one every worker uses; when
`native status` still says it is not built, the row is "skipped: not built (why)". Two long-lived
workers, one per setting, settle one after the other on one empty store (models.native_serve), then,
after one turn that is not kept, take turns, the order rotating: each turn is two generate()s, three training steps and three forwards of
an FP8 inference stack (the compiled FP8 forward's workload).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from tools.bench.common import ROOT, first_line, rotated
from tools.first_contact import options
from tools.first_contact.options import Budget, Plan
from tools.first_contact.parts import log
from tools.first_contact.processes import DIR_ENV, Worker, native_dir

ENABLE_ENV = "FUSEDATTN_SELECT_NATIVE"
SETTINGS = {"off": "0", "on": "1"}
SAMPLES = ("generate_tokens_per_s", "train_step_ms", "fp8_forward_ms")
BUILD_TIMEOUT_S, SETUP_TIMEOUT_S, TURN_TIMEOUT_S = 300.0, 150.0, 60.0
BUILD_LEAST_S = 150.0  # a build (about 90 s) is not started with less left: the turns need time after it


def _cli(action: list[str], where: str, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fusedattn_select.cli", "native", *action], cwd=str(ROOT),
                          env=dict(os.environ, **{DIR_ENV: where}), capture_output=True, text=True, timeout=timeout_s,
                          check=False)


def native_status(where: str) -> dict[str, Any]:
    """`native status --json`'s object (or {"built": False, "problem": why it gave none})."""
    try:
        done = _cli(["status", "--json"], where, 60.0)
        return json.loads(done.stdout)
    except (subprocess.TimeoutExpired, ValueError) as err:
        return {"built": False, "problem": f"native status gave no answer: {first_line(err)}"}


def ensure_built(where: str, budget: Budget) -> dict[str, Any]:
    """The module's status after building it where it is not built yet (with the build's outcome)."""
    found: dict[str, Any] = {"dir": where, "status_before": native_status(where)}
    if found["status_before"].get("built") or found["status_before"].get("problem"):
        found["status"] = found["status_before"]  # built, or known not to build here (headers missing)
        return found
    timeout = budget.timeout(BUILD_TIMEOUT_S, least=BUILD_LEAST_S)
    if timeout is None:
        found["status"] = {"built": False, "problem": "no time left to build it"}
        return found
    log(f"native: building the compiled module into {where} (about 1.5 minutes)")
    started = time.monotonic()
    try:
        done = _cli(["build"], where, timeout)
        found["build"] = {"exit_code": done.returncode, "s": time.monotonic() - started,
                          "output_tail": (done.stdout + done.stderr)[-1500:]}
    except subprocess.TimeoutExpired:
        found["build"] = {"exit_code": None, "s": time.monotonic() - started, "output_tail": "timed out"}
    found["status"] = native_status(where)
    return found


def _worker_args() -> dict[str, Any]:
    config, batch, prompt, new_tokens, _ = options.GENERATE["llama"]
    return {"generate": (config, batch, prompt, new_tokens), "train_config": options.FINETUNE,
            "train_batch": options.FINETUNE_BATCH, "train_length": options.NATIVE_TRAIN_LENGTH,
            "fp8": options.NATIVE_FP8, "seed": options.SEED}


def native(plan: Plan, budget: Budget) -> dict[str, Any]:
    """Row 7: build (where needed), then the two settings in turns."""
    where = native_dir()
    result = ensure_built(where, budget)
    status = result["status"]
    if not status.get("built") or status.get("refused"):
        result["status"] = f"skipped: not built ({status.get('problem') or status.get('refused') or 'no reason given'})"
        return result
    result["status"] = "ok"
    settings: dict[str, dict[str, Any]] = {label: {key: [] for key in SAMPLES} for label in SETTINGS}
    workers: dict[str, Worker] = {}
    with tempfile.TemporaryDirectory(prefix="first-contact-native-store-") as store:
        try:
            # One after the other, on one store: the second reads the first's plans and runner choices,
            # so the two settings differ only in the module (the setup is not timed).
            for label, value in SETTINGS.items():
                workers[label] = Worker("native_serve", "ours", _worker_args(), {ENABLE_ENV: value, DIR_ENV: where},
                                        store=store)
                settings[label]["ready"] = workers[label].wait_answer(min(SETUP_TIMEOUT_S, max(1.0, budget.left())))
            _turns(plan, budget, workers, settings, result)
        except RuntimeError as err:
            result["status"] = f"failed: {first_line(err, 300)}"
        finally:
            for label, worker in workers.items():
                if result["status"] != "ok":
                    settings[label]["stderr_tail"] = worker.stderr_tail()
                settings[label]["final"] = worker.close()[0]
    result["settings"] = settings
    loaded = ((settings["on"].get("ready") or {}).get("native") or {}).get("loaded")
    if result["status"] == "ok" and not loaded:
        result["note"] = "the compiled module was not loaded in the FUSEDATTN_SELECT_NATIVE=1 process"
    return result


def _turns(plan: Plan, budget: Budget, workers: dict[str, Worker], settings: dict[str, dict], result: dict) -> None:
    result["turns"] = 0
    for turn in range(-1, plan.native_turns):  # turn -1 is not kept: what the setups left behind settles
        timeout = budget.timeout(TURN_TIMEOUT_S, least=8.0)
        if timeout is None:
            result["note"] = f"time budget: {turn} turns of {plan.native_turns}"
            return
        for label, worker in rotated(list(workers.items()), turn):
            got = worker.request("turn", timeout)
            for key in SAMPLES if turn >= 0 else ():
                settings[label][key].extend(got.get(key, []))
        result["turns"] = max(0, turn + 1)
        log(f"native: turn {turn + 1} of {plan.native_turns}")
