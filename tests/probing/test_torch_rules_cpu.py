"""How a problem is stated to torch's SDPA, how torch's answers are recorded and read back, and
that a snapshot without them still loads. torch's rule itself is only asked on a GPU
(tests/gpu/test_torch_rules.py); here torch has no CUDA device, so asking it must fail as such."""

from __future__ import annotations

import json
import os

import pytest

from fusedattn_select.config import AttnConfig
from fusedattn_select.probing import bundled_snapshot, torch_rules
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.recorder import record_snapshot, write_snapshot

BASE = dict(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=512, seqlen_kv=512, head_dim_qk=128)


def call(**fields) -> torch_rules.SdpaCall:
    result = torch_rules.sdpa_call(AttnConfig(**{**BASE, **fields}))
    assert isinstance(result, torch_rules.SdpaCall), result
    return result


def test_square_causal_is_stated_with_is_causal_and_bshd_strides():
    c = call(mask="causal")
    assert c.is_causal and c.mask_shape is None and c.enable_gqa
    assert c.shape_q == (2, 16, 512, 128) and c.shape_k == (2, 4, 512, 128)
    assert c.strides_q == (512 * 16 * 128, 128, 16 * 128, 1)  # [b, s, h, d] memory seen as [b, h, s, d]
    assert c.requires_grad and not c.deterministic


def test_bottom_right_causal_with_equal_lengths_is_is_causal():
    assert call(mask="causal_bottom_right").is_causal


def test_a_post_scale_bias_is_a_float_mask_of_its_shape():
    c = call(bias="post_scale_bias", bias_shape="1hss")
    assert c.mask_shape == (1, 16, 512, 512) and c.mask_is_float and not c.is_causal


def test_packed_qkv_keeps_the_interleaved_strides():
    c = call(qkv_layout="bs3hd", num_heads_kv=16)
    assert c.strides_q == c.strides_k == (512 * 3 * 16 * 128, 128, 3 * 16 * 128, 1)


@pytest.mark.parametrize("fields, named", [
    (dict(qkv_dtype="fp8_e4m3"), "qkv_dtype='fp8_e4m3'"),
    (dict(qkv_layout="thd_thd_thd", mask="padding_causal"), "qkv_layout='thd_thd_thd'"),
    (dict(softmax="off_by_one"), "softmax='off_by_one'"),
    (dict(bias="pre_scale_bias"), "bias='pre_scale_bias'"),
    (dict(return_max_logit=True, is_training=False), "return_max_logit=True"),
    (dict(mask="padding"), "mask='padding'"),
    (dict(mask="causal", window_size=[127, 0]), "window_size=[127, 0]"),
    (dict(bias="alibi"), "bias='alibi'"),
    (dict(mask="causal_bottom_right", seqlen_q=128, is_training=False), "mask='causal_bottom_right'"),
    (dict(mask="causal", bias="post_scale_bias", bias_shape="11ss"), "mask='causal' with bias"),
])
def test_problems_sdpa_cannot_state_name_the_field(fields, named):
    reason = torch_rules.sdpa_call(AttnConfig(**{**BASE, **fields}))
    assert isinstance(reason, str) and reason.startswith(named)
    assert torch_rules.torch_answer(AttnConfig(**{**BASE, **fields})) == {"status": "not_expressible",
                                                                          "reason": reason}


def test_without_a_cuda_device_asking_torch_is_a_failure_not_a_verdict():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    platform, reason = torch_rules.torch_platform()
    assert platform is None and "no CUDA device" in reason
    answer = torch_rules.torch_answer(AttnConfig(**BASE))
    assert answer["status"] == "failed" and "cudnn" not in answer and answer["error"]


def test_recording_without_torch_on_a_device_says_why_and_stays_loadable(tmp_path, suite_file, recording_engine):
    snapshot = record_snapshot([suite_file], recording_engine)
    assert "unavailable" in snapshot["torch"]
    assert all("torch" not in entry for entry in snapshot["entries"])
    path = write_snapshot(snapshot, tmp_path / "s.json")
    assert len(SnapshotEngine.load(path)) > 0
    assert record_snapshot([suite_file], recording_engine, ask_torch=False)["torch"] == {
        "unavailable": "not asked (ask_torch=False)"}


def test_recorded_torch_answers_are_read_by_cache_key(tmp_path, suite_file, recording_engine):
    snapshot = record_snapshot([suite_file], recording_engine, ask_torch=False)
    # FORMAT FIXTURE: torch answers written by the test in the recorder's format, not device data.
    snapshot["torch"] = {"version": "fixture", "cudnn_version": 0, "device_name": "format fixture"}
    snapshot["entries"][0]["torch"] = {"status": "evaluated", "cudnn": True, "cudnn_reasons": [],
                                       "sdpa_choice": "CUDNN_ATTENTION", "expressed_as": "fixture"}
    path = write_snapshot(snapshot, tmp_path / "s.json")
    recorded = torch_rules.read_recorded_torch([path])
    key = AttnConfig.from_dict(snapshot["entries"][0]["config"]).cache_key()
    assert recorded.answers == {key: snapshot["entries"][0]["torch"]}
    assert recorded.headers == {"s.json": snapshot["torch"]}


def test_a_malformed_torch_answer_names_the_entry(tmp_path, suite_file, recording_engine):
    from fusedattn_select.errors import SnapshotError

    snapshot = record_snapshot([suite_file], recording_engine, ask_torch=False)
    snapshot["entries"][1]["torch"] = "yes"
    path = write_snapshot(snapshot, tmp_path / "s.json")
    with pytest.raises(SnapshotError, match=r"entries\[1\]\.torch"):
        torch_rules.read_recorded_torch([path])


def test_bundled_snapshots_recorded_before_torch_answers_hold_none():
    path = bundled_snapshot("h100", "hopper-suite")
    recorded = torch_rules.read_recorded_torch([path])
    if "torch" in json.loads(path.read_text()):
        pytest.skip("the bundled snapshot was re-recorded with torch's answers")
    assert recorded.answers == {} and recorded.headers == {path.name: None}


def test_torch_debug_reasons_are_read_from_native_stderr():
    # torch 2.11 prints can_use_cudnn_attention's debug reasons from C++ to file descriptor 2.
    with torch_rules._native_stderr() as native:
        os.write(2, b"[W1122 14:27:31.004 sdp_utils.cpp:718] Warning: head_dim should be no more than 128 "
                    b"(function check_cudnn_tensor_shapes)\nunrelated line\n")
    assert torch_rules._torch_reasons(native, []) == ["head_dim should be no more than 128"]
