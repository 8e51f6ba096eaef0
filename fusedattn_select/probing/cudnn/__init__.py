"""The live cuDNN probing engine and the graph building it shares with dispatch.

    device       CUDA device, primary contexts, per-thread cuDNN handles and kernel caches
    features     what the installed cudnn-frontend can express
    description  the tensors and SDPA arguments of one graph
    graphs       build_graph / describe_graph: a graph taken through cuDNN's build stages
    messages     cuDNN text, verdict vs incident, exceptions, verdict_from_exception
    engine       CudnnEngine, the ProbeEngine on a live device
    plan_graphs  a graph's plan key, and its serialized form (plan_store holds keys, blobs, persistence)

Nothing here imports cudnn-frontend or cuda-python at import time: they are optional dependencies
(the 'cuda' extra), loaded when a device or graph is first used.
"""

from __future__ import annotations

from fusedattn_select.probing.cudnn.cudnn_device import device_context, handle_for, kernel_cache_for
from fusedattn_select.probing.cudnn.cudnn_engine import CudnnEngine
from fusedattn_select.probing.cudnn.features import FrontendFeatures, frontend_features
from fusedattn_select.probing.cudnn.graphs import GraphBuild, build_graph, describe_graph, operation_for
from fusedattn_select.probing.cudnn.messages import STAGES, CudnnUnsupported, ProbeFailure, verdict_from_exception

__all__ = [
    "STAGES",
    "CudnnEngine",
    "CudnnUnsupported",
    "FrontendFeatures",
    "GraphBuild",
    "ProbeFailure",
    "build_graph",
    "describe_graph",
    "device_context",
    "frontend_features",
    "handle_for",
    "kernel_cache_for",
    "operation_for",
    "verdict_from_exception",
]
