"""attention()'s refusals of FP8 arguments no path handles right, on the CPU: descales that require grad
(the fused kernels and torch.compile would drop their gradient), float8 dtypes other than e4m3fn and
e5m2, and an FP8History under activation checkpointing (it would record each step twice)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.checkpoint import checkpoint  # noqa: E402

from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.runtime import api, fused, ops  # noqa: E402
from fusedattn_select.runtime.args import Arguments, call_options  # noqa: E402
from fusedattn_select.runtime.entries import Entry  # noqa: E402
from fusedattn_select.runtime.fp8 import FP8History, FP8Scales  # noqa: E402
from fusedattn_select.runtime.options import NO_INPUTS, OptionalInputs  # noqa: E402

E4M3 = torch.float8_e4m3fn


def _t(seed=0, shape=(1, 2, 8, 16)):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


# ----- descales that require grad ----------------------------------------------------------------------
def _float8(seed=0, dtype=E4M3):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 8, 2, 16, generator=gen).mul(8).to(dtype) for _ in range(3))


@pytest.mark.usefixtures("no_platform")
@pytest.mark.parametrize("which", [0, 2])
def test_descales_that_require_grad_are_refused_naming_the_field(which):
    q8, k8, v8 = _float8()
    plain = [torch.tensor([0.125]) for _ in range(3)]
    api.attention(q8, k8, v8, fp8=FP8Scales(*plain))  # the signature is known: found by its key next
    grads = list(plain)
    grads[which] = torch.tensor([0.125], requires_grad=True)
    name = ("descale_q", "descale_k", "descale_v")[which]
    with pytest.raises(ConfigError, match="must not require grad") as err:
        api.attention(q8, k8, v8, fp8=FP8Scales(*grads))
    assert err.value.field == "fp8." + name and "inference" in str(err.value)
    with pytest.raises(ConfigError) as compiled:  # torch.compile's path checks the same way
        ops.compiled_attention(q8, k8, v8, OptionalInputs(), Arguments(fp8=FP8Scales(*grads)))
    assert compiled.value.field == "fp8." + name
    with torch.no_grad():  # nothing would record: allowed
        out = api.attention(q8, k8, v8, fp8=FP8Scales(*grads))
    assert not out.requires_grad


# ----- float8 dtypes the kernels do not take -----------------------------------------------------------
@pytest.mark.usefixtures("no_platform")
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz])
@pytest.mark.parametrize("fp8", [False, True, "scales"])
def test_fnuz_float8_inputs_are_refused_naming_the_tensor(dtype, fp8):
    q, k, v = _float8(dtype=dtype)
    if fp8 == "scales":
        fp8 = FP8Scales(*(torch.tensor([1.0]) for _ in range(3)))
    with torch.no_grad(), pytest.raises(ConfigError, match="float8_e4m3fn or float8_e5m2") as err:
        api.attention(q, k, v, fp8=fp8)
    assert err.value.field == "q" and err.value.value == dtype
    with torch.no_grad(), pytest.raises(ConfigError) as err:
        api.attention(_float8()[0], k, v, fp8=FP8Scales(*(torch.tensor([1.0]) for _ in range(3))))
    assert err.value.field == "k" and err.value.value == dtype


# ----- an FP8History under activation checkpointing ------------------------------------------------------
# End to end (attention() on a GPU, both checkpoint kinds): tests/gpu/test_fp8_attention.py.
def _history_entry(history):
    """An fp8=FP8History training call's entry without plans (no GPU here): fused_forward refuses before
    it uses one, and past the check it fails on the missing plan."""
    q, k, v = (_t(seed=s).requires_grad_() for s in range(3))
    opts = call_options(q, k, v, NO_INPUTS, Arguments(fp8=history))
    assert opts.fp8 and opts.training
    return Entry(opts), (q, k.detach(), v.detach())


def test_fp8_history_forward_under_non_reentrant_checkpointing_is_refused():
    history = FP8History()
    entry, (q, k, v) = _history_entry(history)

    def forward(x):
        fused.fused_forward(entry, x, k, v, NO_INPUTS, history)
        return x.sin()
    with torch.enable_grad(), pytest.raises(ConfigError, match="checkpointing") as err:
        checkpoint(forward, q, use_reentrant=False)  # saved-tensor hooks are set: refused in the forward
    assert err.value.field == "fp8" and "fp8=True" in str(err.value) and "FP8Scales" in str(err.value)
    assert history.calls == 0  # refused before anything was recorded
    with pytest.raises(AttributeError):  # without checkpointing: past the check, to the missing plan
        forward(q)


def test_fp8_history_recomputation_of_reentrant_checkpointing_is_refused():
    history = FP8History()
    runs = []

    def forward(x):
        runs.append("run")
        fused.refuse_recomputed_history(history, training=True)
        return x.sin()
    q = _t().float().requires_grad_()
    with torch.enable_grad():
        out = checkpoint(forward, q, use_reentrant=True)  # the forward runs under no_grad: no hooks, passes
        assert runs == ["run"]
        with pytest.raises(ConfigError, match="checkpointing") as err:
            out.sum().backward()  # the recomputation runs inside the backward: refused
    assert runs == ["run", "run"] and err.value.field == "fp8"


def test_fp8_history_under_other_saved_tensor_hooks_or_without_grad_is_not_refused():
    # save_on_cpu (activation offloading) runs the forward once; an inference call records nothing twice.
    history = FP8History()
    with torch.enable_grad(), torch.autograd.graph.save_on_cpu():
        fused.refuse_recomputed_history(history, training=True)
    with torch.no_grad():
        checkpoint(lambda x: fused.refuse_recomputed_history(history, training=False) or x.sin(), _t().float(),
                   use_reentrant=False)
