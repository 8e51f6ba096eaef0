"""The package works on a machine with neither torch nor cuDNN: it answers from the bundled snapshots,
from a recorded bucket where the shape was not recorded, else NONE saying why (no data)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fusedattn_select import AttnConfig, Backend
from fusedattn_select.probing.choice import bundled_engine
from fusedattn_select.types import ProbeDepth

ROOT = Path(__file__).resolve().parents[2]

# sys.modules[name] = None makes `import name` raise ImportError, as on a machine without it.
SCRIPT = textwrap.dedent("""
    import json, sys
    for name in ("torch", "cudnn", "cuda", "cuda.bindings"):
        sys.modules[name] = None

    import fusedattn_select
    from fusedattn_select import AttnConfig, Backend, select
    from fusedattn_select.cli import main

    cfg = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128)
    selection = select(cfg)
    unrecorded = select(cfg.replace(head_dim_qk=112))  # a class no bundled snapshot recorded
    code = main(["info"])
    print(json.dumps({
        "backend": selection.backend.value,
        "plan_form": selection.plan_form,
        "phases": [[v.phase.value, v.outcome.value, v.stage] for v in selection.verdicts],
        "unrecorded_backend": unrecorded.backend.value,
        "unrecorded_no_data": unrecorded.no_data,
        "message": unrecorded.message,
        "stages": sorted({v.stage for v in unrecorded.verdicts}),
        "info_exit": code,
    }))
""")


def test_package_answers_and_info_runs_without_torch_or_cudnn(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FUSEDATTN_SELECT_SNAPSHOT"}
    env["FUSEDATTN_SELECT_CACHE_DIR"] = str(tmp_path / "cache")
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    facts = json.loads(lines[-1])
    info = "\n".join(lines[:-1])
    # No GPU here: the bundled H100 snapshots answer. This shape is not recorded, its class is: its bucket answers.
    cfg = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128)
    engine = bundled_engine("h100")
    form = engine.bucket_for(cfg)
    assert form is not None
    recorded = [engine.probe(form, Backend.F16, phase, ProbeDepth.FAST) for phase in form.phases]
    assert facts["phases"] == [[v.phase.value, v.outcome.value, v.stage] for v in recorded]
    assert facts["backend"] == ("F16" if all(v.supported for v in recorded) else "NONE")
    assert facts["plan_form"].startswith(f"bucket B={form.batch_size} S_q={form.seqlen_q} S_kv={form.seqlen_kv} ")
    # A class they do not hold: NONE for want of data, saying so.
    assert engine.bucket_for(cfg.replace(head_dim_qk=112)) is None
    assert facts["unrecorded_backend"] == "NONE" and facts["unrecorded_no_data"] is True
    assert facts["stages"] == ["snapshot"]
    assert facts["message"].startswith("F16 forward and backward no data at snapshot: not recorded in "
                                       "h100-configs.json+h100-hopper-suite.json+h100-models.json")
    assert "only a live probe" in facts["message"]
    assert facts["info_exit"] == 0
    assert "torch                      not installed" in info
    assert "Traceback" not in result.stderr


def test_asking_for_the_dispatch_api_without_torch_names_the_missing_extra(tmp_path):
    script = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None
        import fusedattn_select
        for name in ("attention", "dispatch_info", "FP8Scales"):
            try:
                getattr(fusedattn_select, name)
            except ModuleNotFoundError as err:
                print(name, err.name, "|", err)
    """)
    env = dict(os.environ, FUSEDATTN_SELECT_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=120)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and len(lines) == 3, result.stderr
    for name, line in zip(("attention", "dispatch_info", "FP8Scales"), lines):
        assert line.startswith(f"{name} torch | fusedattn_select.{name} needs torch"), line
        assert "pip install 'fusedattn-select[torch]'" in line, line
