"""One answer path: select()/get_backend() choose their engine exactly as `why` does.

Issue 13, findings 1 and 9: on a machine without a GPU the Python API used to answer NONE from the
platform rule while the CLI answered from the bundled H100 snapshot; FUSEDATTN_SELECT_SNAPSHOT took
one file only; dispatch_info was not importable from the package.

The live device is replaced by "no device" (probing.choice.live_engine) so these answers do not
depend on the machine; the bundled snapshots are the real ones recorded on an H100 and an H200.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fusedattn_select
from fusedattn_select import AttnConfig, Backend, get_backend, select, use_snapshots
from fusedattn_select.cli import main
from fusedattn_select.errors import ConfigError, SnapshotError
from fusedattn_select.probing import choice
from fusedattn_select.selection.recorder import record_snapshot, write_snapshot
from fusedattn_select.selection.selector import default_selector, set_default_selector
from fusedattn_select.types import Outcome, ProbeDepth

ROOT = Path(__file__).resolve().parents[2]
NO_DEVICE = "test: no GPU here"
BUNDLED_H100 = "snapshot:h100-configs.json+h100-hopper-suite.json+h100-models.json"
# Recorded in the bundled h100-configs.json (llama-3-70b.yaml train-bf16) at depth full.
RECORDED = dict(batch_size=2, num_heads_q=64, num_heads_kv=8, seqlen_q=8192, seqlen_kv=8192, head_dim_qk=128,
                mask="causal")
# README's Python API example (Llama 3 8B's class at batch 2, length 4096): this shape is recorded in no
# bundled snapshot; its class is, over a bucket ladder, so a CPU answers from its bucket.
README_EXAMPLE = dict(batch_size=2, num_heads_q=32, num_heads_kv=8, seqlen_q=4096, seqlen_kv=4096,
                      head_dim_qk=128, mask="causal", is_training=True)


def set_pairs(fields: dict) -> list[str]:
    return [arg for key, value in fields.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture
def no_device(monkeypatch):
    monkeypatch.setattr(choice, "live_engine", lambda: (None, NO_DEVICE))


@pytest.fixture
def second_snapshot(tmp_path, recording_engine):
    """A snapshot of another suite, recorded on the same (test double) device as `recorded_snapshot`."""
    suite = tmp_path / "other.yaml"
    suite.write_text("configs:\n  - {name: small, batch_size: 1, num_heads_q: 4, num_heads_kv: 4, seqlen_q: 64,"
                     " seqlen_kv: 64, head_dim_qk: 64, is_training: false}\n")
    cfg = AttnConfig(batch_size=1, num_heads_q=4, num_heads_kv=4, seqlen_q=64, seqlen_kv=64, head_dim_qk=64,
                     is_training=False)
    return write_snapshot(record_snapshot([suite], recording_engine), tmp_path / "other.json"), cfg


# ----- select() without a GPU answers like why -------------------------------------------------
def test_select_without_a_gpu_answers_from_the_bundled_h100_snapshot_with_a_notice(no_device):
    selection = select(AttnConfig(**RECORDED))
    assert selection.backend is Backend.F16 and selection.engine == BUNDLED_H100
    assert selection.notice.startswith(
        f"no CUDA device/cuDNN here ({NO_DEVICE}); answering from the bundled snapshot recorded on NVIDIA H100")
    assert "rule:platform" not in selection.message


def test_select_and_why_give_the_same_answer_and_notice(no_device, capsys):
    selection = select(AttnConfig(**RECORDED))
    set_default_selector(None)
    code = main(["why", "--json", *set_pairs(RECORDED)])
    out, err = capsys.readouterr()
    document = json.loads(out)
    answered = document["results"][0]["selection"]
    assert code == 0 and document["engine"] == selection.engine
    assert document["notice"] == selection.notice and err.strip() == selection.notice
    mine = selection.to_dict()
    for key in ("backend", "message", "reasons", "verdicts", "notice", "no_data", "cache_key"):
        assert answered[key] == mine[key], key


def test_readme_example_without_a_gpu_answers_from_its_recorded_bucket_not_the_platform_rule(no_device):
    cfg = AttnConfig(**README_EXAMPLE)
    engine = choice.bundled_engine("h100")
    form = engine.bucket_for(cfg)
    assert form is not None  # its shape is not recorded, its class is, over a ladder
    recorded = [engine.probe(form, Backend.F16, phase, ProbeDepth.FAST) for phase in form.phases]
    assert {v.outcome for v in recorded} <= {Outcome.SUPPORTED, Outcome.UNSUPPORTED}
    selection = select(cfg)
    assert not selection.no_data and "rule:platform" not in selection.message
    assert [(v.backend, v.phase, v.outcome, v.stage) for v in selection.verdicts] == [
        (v.backend, v.phase, v.outcome, v.stage) for v in recorded]
    assert selection.backend is (Backend.F16 if all(v.supported for v in recorded) else Backend.NONE)
    assert selection.plan_form.startswith(f"bucket B={form.batch_size} S_q={form.seqlen_q} S_kv={form.seqlen_kv} ")
    assert get_backend(cfg) == (selection.backend, selection.message)
    # README's Python API example shows this answer.
    readme = (ROOT / "README.md").read_text()
    assert f'Backend.{selection.backend.name}, "{selection.plan_form}"' in readme


def test_without_a_gpu_or_bundled_snapshots_every_answer_is_no_data(no_device, monkeypatch, tmp_path):
    monkeypatch.setattr(choice, "SNAPSHOT_DIR", tmp_path)
    selection = select(AttnConfig(**RECORDED))
    assert selection.no_data and {v.stage for v in selection.verdicts} == {"rule:platform"}
    assert "no bundled snapshot for h100 is installed" in selection.notice
    assert "not supported" not in selection.message


def test_a_live_engine_answers_with_the_persistent_store_and_no_notice(monkeypatch, recording_engine):
    monkeypatch.setattr(choice, "live_engine", lambda: (recording_engine, ""))
    selector = default_selector()
    assert selector.engine is recording_engine and selector.notice == ""
    assert selector.store is not None and selector.store.persistent


def test_snapshot_answers_are_not_copied_into_a_store(no_device):
    assert default_selector().store is None


# ----- choosing snapshots from the API ---------------------------------------------------------
def test_use_snapshots_answers_from_the_named_files(recorded_snapshot, second_snapshot):
    other, small = second_snapshot
    selector = use_snapshots([recorded_snapshot, other])
    assert default_selector() is selector and selector.engine_name == "snapshot:test-gpu.json+other.json"
    assert select(small).backend is Backend.F16 and select(small).notice == ""


def test_use_snapshots_takes_a_target_in_any_case(no_device):
    use_snapshots(target="H200")
    assert select(AttnConfig(**RECORDED)).engine == "snapshot:h200-configs.json+h200-hopper-suite.json+h200-models.json"


@pytest.mark.parametrize("kwargs, field", [({}, "snapshots"), ({"target": "a100"}, "target"),
                                            ({"snapshots": "x.json", "target": "h100"}, "target")])
def test_use_snapshots_rejects_nothing_an_unknown_target_or_both(kwargs, field):
    with pytest.raises(ConfigError) as raised:
        use_snapshots(**kwargs)
    assert raised.value.field == field


def test_use_snapshots_names_a_missing_file(tmp_path):
    with pytest.raises(SnapshotError, match="missing.json: file not found"):
        use_snapshots(tmp_path / "missing.json")


# ----- FUSEDATTN_SELECT_SNAPSHOT with several files --------------------------------------------
def test_environment_variable_takes_several_files_separated_by_pathsep(monkeypatch, recorded_snapshot,
                                                                       second_snapshot):
    other, small = second_snapshot
    monkeypatch.setenv("FUSEDATTN_SELECT_SNAPSHOT", os.pathsep.join([str(recorded_snapshot), str(other)]))
    selection = select(small)
    assert selection.engine == "snapshot:test-gpu.json+other.json" and selection.backend is Backend.F16


def test_environment_variable_of_separators_only_is_bad_input(monkeypatch):
    monkeypatch.setenv("FUSEDATTN_SELECT_SNAPSHOT", os.pathsep * 2)
    with pytest.raises(ConfigError, match="FUSEDATTN_SELECT_SNAPSHOT"):
        select(AttnConfig(**RECORDED))


# ----- the package's names ---------------------------------------------------------------------
def test_dispatch_info_is_importable_from_the_package():
    from fusedattn_select import dispatch_info
    from fusedattn_select.runtime.api import dispatch_info as runtime_dispatch_info

    assert dispatch_info is runtime_dispatch_info and "dispatch_info" in fusedattn_select.__all__
    assert {"calls", "fused_calls", "fallback_calls"} <= set(dispatch_info())


# sys.modules[name] = None makes `import name` raise ImportError, as on a machine without it.
WITHOUT_TORCH = textwrap.dedent("""
    import json, sys
    for name in ("torch", "cudnn", "cuda", "cuda.bindings"):
        sys.modules[name] = None
    import fusedattn_select
    from fusedattn_select import AttnConfig, select
    selection = select(AttnConfig(**json.loads(sys.argv[1])))
    try:
        fusedattn_select.dispatch_info
        dispatch = "imported"
    except ImportError:
        dispatch = "needs torch"
    print(json.dumps({"backend": selection.backend.value, "engine": selection.engine,
                      "notice": selection.notice, "dispatch_info": dispatch}))
""")


def test_without_torch_or_cudnn_select_answers_from_the_bundled_snapshot(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FUSEDATTN_SELECT_SNAPSHOT"}
    env["FUSEDATTN_SELECT_CACHE_DIR"] = str(tmp_path / "cache")
    result = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, json.dumps(RECORDED)], capture_output=True,
                            text=True, cwd=ROOT, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["backend"] == "F16" and facts["engine"] == BUNDLED_H100
    assert facts["notice"].startswith("no CUDA device/cuDNN here (cudnn-frontend is not installed")
    assert facts["dispatch_info"] == "needs torch"
