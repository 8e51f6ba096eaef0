"""The one home for plan identity: plan keys, the blob format and persistence of execution plans.

    keys         GraphSignature, plan_key, PlanKey: the store key of one plan
    blob         the serialized form of a plan (header + the engine's bytes); PlanBlobError
    persistence  obtain: load a stored plan or build and store it, once per key across processes
    calls        call_config, dispatch_config: the AttnConfig attention() runs for a call

Torch-free and engine-free: an engine fills a GraphSignature and serializes its graphs
(probing/cudnn/plan_graphs.py); warmup reaches engines through the PlanBuilder protocol. This
file imports nothing, so a probe engine that uses keys or blob does not load persistence (and the
store behind it).
"""
