"""build_graph remembers a problem class as static-only (later builds skip dynamic shapes) only where cuDNN
rejected its dynamic-shape graph, not where that build met an incident (out of memory, a CUDA error), which
says nothing about the class. The builds are TEST DOUBLES: this checks the memo, not cuDNN."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fusedattn_select.config import AttnConfig
from fusedattn_select.probing.cudnn import graphs
from fusedattn_select.probing.cudnn.messages import CudnnUnsupported, ProbeFailure
from fusedattn_select.types import Backend, Phase, ProbeDepth

CFG = AttnConfig(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=512, seqlen_kv=512, head_dim_qk=64)


@pytest.fixture
def builds(monkeypatch):
    """(the dynamic build's error, the builds asked for): kernel_cache given = a dynamic-shape build."""
    state = {"error": None, "asked": []}

    def build(cfg, backend, phase, handle, depth, kernel_cache, describe_only):
        state["asked"].append("dynamic" if kernel_cache is not None else "static")
        if kernel_cache is not None and state["error"] is not None:
            raise state["error"]
        return SimpleNamespace(note="")

    monkeypatch.setattr(graphs, "_build", build)
    monkeypatch.setattr(graphs, "frontend_features", lambda: SimpleNamespace(dynamic_shapes=True))
    monkeypatch.setattr(graphs, "_STATIC_ONLY", {})
    return state


def _twice(state):
    for _ in range(2):
        built = graphs.build_graph(CFG, Backend.F16, Phase.FORWARD, handle=None, depth=ProbeDepth.FULL,
                                   kernel_cache=object())
    return built, state["asked"]


def test_an_incident_in_the_dynamic_build_is_not_remembered(builds):
    builds["error"] = ProbeFailure("build_plans", "CUDA out of memory", "cudaErrorMemoryAllocation")
    built, asked = _twice(builds)
    assert asked == ["dynamic", "static", "dynamic", "static"]  # dynamic shapes tried again
    assert "after the dynamic-shape build failed: CUDA out of memory" in built.note


def test_a_rejected_dynamic_graph_is_remembered(builds):
    builds["error"] = CudnnUnsupported("build_plans", "no engine supports dynamic shapes", "")
    built, asked = _twice(builds)
    assert asked == ["dynamic", "static", "static"]
    assert "which cuDNN rejects for this graph: no engine supports dynamic shapes" in built.note
