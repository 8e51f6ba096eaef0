"""FP8History and FP8Scales in training checkpoints: torch.load with its default (weights_only=True, since
torch 2.6) restores them, with the amax history, the count of calls and the settings; a restored history scales
its next call as the saved one would; a saved state that does not fit its settings is refused naming the field.
Before, torch.load refused both classes (UnpicklingError: not an allowed global), so a run resumed with the
default torch.load could not read a checkpoint that held its delayed-scaling histories."""

from __future__ import annotations

import copy
import io
import pickle

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.runtime import fp8 as fp8q  # noqa: E402
from fusedattn_select.runtime.fp8 import FP8History, FP8Scales  # noqa: E402

E4M3 = torch.float8_e4m3fn


def _recorded_history() -> FP8History:
    history = FP8History(length=4, algo="most_recent", margin=1)
    gen = torch.Generator().manual_seed(0)
    for scale in (3.0, 7.0):
        q, k, v = (torch.randn(2, 5, 2, 8, generator=gen).mul(scale).to(torch.bfloat16) for _ in range(3))
        fp8q.quantize_qkv(q, k, v, E4M3, history=history)
    return history


def _saved_and_loaded(obj, **load):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load)


def _next_state(history: FP8History) -> torch.Tensor:
    q = torch.randn(2, 5, 2, 8, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    return fp8q.quantize_qkv(q, q * 2, q * 3, E4M3, history=history)[3]


def test_torch_load_with_its_defaults_restores_a_history_in_a_checkpoint():
    history = _recorded_history()
    restored = _saved_and_loaded({"step": 7, "fp8_histories": [history]})["fp8_histories"][0]
    assert isinstance(restored, FP8History)
    assert (restored.length, restored.algo, restored.margin, restored.o_dtype, restored.calls) == (4, "most_recent", 1,
                                                                                                  None, 2)
    assert torch.equal(restored.amax_history, history.amax_history)
    # (vnorm is NaN outside training: NaN == NaN here)
    assert torch.allclose(_next_state(restored), _next_state(history), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda h: pickle.loads(pickle.dumps(h)),
                                    lambda h: _saved_and_loaded(h, weights_only=False)],
                         ids=["deepcopy", "pickle", "torch.load-unsafe"])
def test_other_copies_of_a_history_keep_its_amaxes(copier):
    history = _recorded_history()
    copied = copier(history)
    assert copied.calls == history.calls and torch.equal(copied.amax_history, history.amax_history)
    assert copied._buf.data_ptr() != history._buf.data_ptr()


def test_a_history_never_called_is_restored_unrecorded():
    restored = _saved_and_loaded(FP8History(length=2, o_dtype=E4M3))
    assert (restored.length, restored.o_dtype, restored.calls, restored.amax_history) == (2, E4M3, 0, None)


def test_torch_load_with_its_defaults_restores_fp8_scales():
    scales = FP8Scales(torch.tensor([0.5]), torch.tensor([0.25]), torch.tensor([2.0]), o_dtype=torch.float16)
    restored = _saved_and_loaded({"scales": scales})["scales"]
    assert isinstance(restored, FP8Scales) and restored.o_dtype == torch.float16
    assert [t.item() for t in (restored.descale_q, restored.descale_k, restored.descale_v)] == [0.5, 0.25, 2.0]


@pytest.mark.parametrize(("change", "field"), [
    (lambda s: s.update(length=8), "FP8History._buf"),          # the buffer of a length-4 history
    (lambda s: s.update(length=0), "FP8History.length"),
    (lambda s: s.update(algo="mean"), "FP8History.algo"),
    (lambda s: s.update(calls=-1), "FP8History.calls"),
    (lambda s: s.update(_buf=None), "FP8History.calls"),        # calls recorded, no amaxes
    (lambda s: s.update(_buf=torch.zeros(19, dtype=torch.float64)), "FP8History._buf"),
    (lambda s: s.pop("margin"), "FP8History.margin"),
])
def test_a_saved_history_that_does_not_fit_its_settings_is_refused_naming_the_field(change, field):
    state = dict(_recorded_history().__dict__)
    change(state)
    restored = FP8History.__new__(FP8History)
    with pytest.raises(ConfigError, match=f"^{field}="):
        restored.__setstate__(state)


def test_saved_fp8_scales_are_checked_as_new_ones_are():
    state = dict(FP8Scales(torch.ones(1), torch.ones(1), torch.ones(1)).__dict__, descale_k=torch.ones(2))
    restored = FP8Scales.__new__(FP8Scales)
    with pytest.raises(ConfigError, match="^FP8Scales.descale_k="):
        restored.__setstate__(state)


def test_a_history_loaded_onto_the_cpu_moves_to_its_call_s_device_once():
    # torch.load(..., map_location="cpu") is how runs resume; FP8 runs on a GPU ("meta" stands in for it here).
    history = _recorded_history()
    restored = _saved_and_loaded(history, map_location="cpu")
    taken = restored.take(torch.device("meta"))
    assert taken.buf.device.type == "meta" and restored.amax_history.device.type == "meta"
    assert restored.calls == history.calls + 1


def test_a_history_used_on_two_devices_is_refused_naming_fp8():
    history = _recorded_history()
    history.take(torch.device("meta"))  # moved from the CPU, where it recorded
    with pytest.raises(ConfigError, match=r"^fp8=.*FP8History of meta.*one history per call site"):
        history.take(torch.device("cpu"))
