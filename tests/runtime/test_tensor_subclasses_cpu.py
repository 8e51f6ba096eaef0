"""Tensor subclasses (a DTensor, a wrapper subclass) are run by torch through their own dispatch, never by
cuDNN's kernels (which read a plain tensor's memory: a DTensor's shape is the global one and its data pointer
is 0). Their calls are decided apart from plain calls of the same shape, and the reason names the subclass."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
from torch.utils._pytree import tree_map  # noqa: E402

from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.runtime import entries, tiers  # noqa: E402
from fusedattn_select.runtime.api import attention, clear_plans  # noqa: E402
from fusedattn_select.runtime.args import Arguments, call_options  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from fusedattn_select.runtime.options import NO_INPUTS  # noqa: E402
from fusedattn_select.runtime.tensor_layouts import tensor_subclass  # noqa: E402


class Wrapped(torch.Tensor):
    """A wrapper subclass without storage of its own, as DTensor is: every op runs on the tensor it wraps."""
    ops: list[str] = []

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> "Wrapped":
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), dtype=elem.dtype,
                                                   device=elem.device, requires_grad=elem.requires_grad)

    def __init__(self, elem: torch.Tensor) -> None:
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        cls.ops.append(str(func))
        unwrap = lambda t: t.elem if isinstance(t, Wrapped) else t  # noqa: E731
        wrap = lambda t: Wrapped(t) if isinstance(t, torch.Tensor) else t  # noqa: E731
        return tree_map(wrap, func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {})))


@pytest.fixture(autouse=True)
def fresh():
    clear_plans()
    Wrapped.ops.clear()
    yield
    clear_plans()


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, 9, h, 16, generator=gen, dtype=torch.bfloat16) for h in (4, 2, 2)]


def test_the_subclass_is_named_and_plain_tensors_are_not():
    q, k, v = _inputs()
    assert tensor_subclass(q, k, v) == ""
    assert tensor_subclass(q, Wrapped(k), v) == "Wrapped"
    assert tensor_subclass(torch.nn.Parameter(q), k, v) == ""  # a Parameter's memory is its own: it runs fused


def test_a_parameter_call_takes_the_hot_path_as_a_plain_call_does():
    q, k, v = _inputs()
    attention(torch.nn.Parameter(q), k, v, mask="causal")
    attention(torch.nn.Parameter(q), k, v, mask="causal")
    assert len(dispatcher.by_call) == 1  # filed under its fast key (it was decided apart every call)
    assert not any(e.reason.startswith("Parameter") for e in dispatcher.entries.values())


def test_a_subclass_call_runs_through_its_dispatch_decided_apart_from_plain_calls(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    q, k, v = _inputs()
    plain = attention(q, k, v, mask="causal")
    wrapped = attention(Wrapped(q), Wrapped(k), Wrapped(v), mask="causal")
    assert type(wrapped) is Wrapped and Wrapped.ops  # its ops ran through its dispatch (which ones: torch's version)
    assert torch.equal(wrapped.elem, plain)
    reasons = {e.reason.split(":")[0] for e in dispatcher.entries.values()}
    assert "Wrapped inputs" in reasons and len(dispatcher.entries) == 2  # one signature each
    assert any("Wrapped inputs: torch runs a tensor subclass" in r.getMessage() for r in caplog.records)
    assert type(attention(q, k, v, mask="causal")) is torch.Tensor  # the plain signature keeps its own entry


def test_a_subclass_is_decided_at_once_not_prepared_for_cudnn():
    def reason(q, k, v):
        signature = entries.key(q, k, v, call_options(q, k, v, NO_INPUTS, Arguments()), NO_INPUTS)
        return tiers.wait_reason(signature, q, k, v, NO_INPUTS, None)

    q, k, v = _inputs()
    assert reason(q, k, v) == "not a CUDA call"  # what the CPU's plain calls are decided for
    assert reason(Wrapped(q), k, v) == "Wrapped inputs"
    assert reason(q[:0], k[:0], v[:0]) == "an empty problem"


ONLY_THE_REFERENCE = [{"return_lse": True}, {"window_size": (4, 0)}, {"softmax": "off_by_one"}]


@pytest.mark.parametrize("arguments", ONLY_THE_REFERENCE)
def test_a_subclass_call_only_the_reference_runs_runs_there_through_its_dispatch(arguments):
    q, k, v = _inputs()
    got = attention(Wrapped(q), Wrapped(k), Wrapped(v), **arguments)
    want = attention(q, k, v, **arguments)
    for a, b in zip(*((got, want) if isinstance(got, tuple) else ((got,), (want,)))):
        assert type(a) is Wrapped and torch.equal(a.elem, b)


@pytest.fixture
def mesh(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch without torch.distributed")
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


@pytest.mark.parametrize("arguments", ONLY_THE_REFERENCE)
def test_a_dtensor_call_only_the_reference_runs_is_refused_naming_the_argument(mesh, arguments):
    """The reference builds plain masks, which a DTensor's ops refuse to mix with it (a traceback from inside)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    q, k, v = _inputs()
    k = distribute_tensor(k, mesh, [Shard(2)])
    with pytest.raises(ConfigError, match="a DTensor runs on torch SDPA only, which cannot run") as err:
        attention(q, k, v, **arguments)
    assert err.value.field == "k"
