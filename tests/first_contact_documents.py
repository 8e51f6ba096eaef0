"""The first-contact bench's result documents as tests build them: sides, calls, steps, and one
document with every part (tests/tools/test_first_contact*.py)."""

from __future__ import annotations

import copy


def side(**figures):
    return {"status": "ok", **figures}


def steps(*ms):
    return [{"shape": "s", "call": c, "ms": x} for c, x in zip(("first", "again", "first", "again"), ms)]


def calls(first, again, new):
    return {name: {"tokens_per_s": v} for name, v in (("first", first), ("again", again), ("new_prompt", new))}


def tiny(first, early, late):
    return {"first": first, "calls_2_101_median": early, "calls_1001_1100_median": late}


DOCUMENT = {"parts": {
    "first_calls": {"status": "ok", "sides": {
        "ours": side(steps=steps(140.0, 1.0, 3.0, 1.0), tiny_us=tiny(100.0, 20.0, 20.0)),
        "flash": side(steps=steps(100.0, 1.0, 1.0, 1.0), tiny_us=tiny(90.0, 19.0, 19.0)),
        "default": side(steps=steps(120.0, 1.0, 2.0, 1.0), tiny_us=tiny(100.0, 20.0, 16.0))}},
    "generate": {"models": {"llama": {"sides": {
        "ours": side(calls=calls(95.0, 110.0, 80.0)), "flash": side(calls=calls(100.0, 100.0, 100.0)),
        "default": side(calls=calls(50.0, 90.0, 40.0))}}}},
    "finetune": {"sides": {"ours": side(step_ms=[110.0, 100.0, 90.0]), "flash": side(step_ms=[100.0, 100.0, 100.0]),
                           "default": side(step_ms=[300.0, 100.0, 100.0])}},
    "big_shape": {"status": "ok", "impls": {"ours": side(ms={"median": 4.0}), "raw": side(ms={"median": 3.8}),
                                            "flash": side(ms={"median": 6.0})}},
    "first_step": {"sides": {"ours": side(to_first_result_ms=5000.0), "flash": side(to_first_result_ms=4000.0),
                             "default": side(to_first_result_ms=5500.0)}},
    "native": {"status": "ok", "settings": {
        "on": {"generate_tokens_per_s": [110.0, 105.0, 108.0], "train_step_ms": [99.0, 100.0, 101.0],
               "fp8_forward_ms": [80.0, 82.0, 81.0]},
        "off": {"generate_tokens_per_s": [100.0, 100.0, 100.0], "train_step_ms": [100.0, 100.0, 100.0],
                "fp8_forward_ms": [90.0, 90.0, 90.0]}}},
}}


def run_document(parts_measured, commit, **changes):
    document = {"schema": "fusedattn-first-contact/1", "command": f"python -m tools.bench_first_contact ({commit})",
                "date": "2026-11-27 00:00 UTC", "device": "GPU X", "torch": "2.11", "cudnn_backend": "9.19.0",
                "cudnn_frontend": "1.32.0", "git_commit": commit, "wall_s": 10.0, "budget_s": 100.0,
                "parts_selected": list(parts_measured),
                "parts": {name: copy.deepcopy(DOCUMENT["parts"][name]) for name in parts_measured}}
    document.update(changes)
    return document
