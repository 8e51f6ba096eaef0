"""CPU tests of the transformers integration (attn_implementation="fusedattn", report()).

Tiny random-initialised models built from configs (nothing is downloaded) run in float32 on the
CPU, where dispatch falls back to torch SDPA / the float32 reference: the integration's mask mapping, rolls
and sinks run end to end, and must give what "sdpa" and "eager" give.
"""

from __future__ import annotations

import json
import logging
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402
from hf_test_models import COMPARISONS  # noqa: E402
from hf_test_models import CPU_TINY as TINY  # noqa: E402
from hf_test_models import fresh_log_once, registered  # noqa: E402, F401 (the module's fixtures)
from torch_abilities import need_torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    masking_utils,  # noqa: E402
)

from fusedattn_select import Backend, ConfigError  # noqa: E402
from fusedattn_select.integrations import transformers as fa_hf  # noqa: E402
from fusedattn_select.integrations.transformers import mask_interface, masks  # noqa: E402
from fusedattn_select.reference.autograd_reference import reference_attention  # noqa: E402
from fusedattn_select.selection.selector import Selector  # noqa: E402

SEQ, WINDOW = TINY.seq, TINY.window
NO_CUDA = "no CUDA device with cuDNN (test)"
# The mask-function tests call it with transformers 5's arguments (4.x passes cache_position).
mask_protocol_5 = pytest.mark.skipif(
    int(transformers.__version__.split(".")[0]) < 5, reason="transformers 5 mask-function arguments")



def model_of(name: str, **changes):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(TINY.config(name, **changes)).eval()


def logits(model, impl, ids, mask):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


def valid(mask, ids):
    return torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()


# ----- whole models against "sdpa" and "eager" ---------------------------------------------------
@pytest.mark.parametrize("padding", [None, "left", "right"])
@pytest.mark.parametrize("name,other", COMPARISONS)
def test_logits_match_other_implementations(name, other, padding):
    model = model_of(name)
    ids, mask = TINY.inputs(padding)
    ours, theirs = logits(model, "fusedattn", ids, mask), logits(model, other, ids, mask)
    # "sdpa" gives the same rows everywhere, padding included (left-padding rows see no key: zero);
    # "eager" spreads such rows uniformly over masked keys, so only real tokens are compared.
    keep = torch.ones_like(ids, dtype=torch.bool) if other == "sdpa" else valid(mask, ids)
    torch.testing.assert_close(ours[keep], theirs[keep], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("padding", [None, "left", "right"])
@pytest.mark.parametrize("name,other", COMPARISONS)
def test_parameter_gradients_match_other_implementations(name, other, padding):
    model = model_of(name).train()
    ids, mask = TINY.inputs(padding)
    real = valid(mask, ids)
    # Predictions made at real tokens only (the logit at a padding position is not a prediction).
    labels = ids.masked_fill(~real, -100)
    labels[:, 1:] = labels[:, 1:].masked_fill(~real[:, :-1], -100)
    grads = {}
    for impl in ("fusedattn", other):
        model.set_attn_implementation(impl)
        model.zero_grad()
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        grads[impl] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads["fusedattn"].keys() == grads[other].keys()
    for param, grad in grads[other].items():
        torch.testing.assert_close(grads["fusedattn"][param], grad, atol=2e-5, rtol=1e-4, msg=param)


@pytest.mark.parametrize("name,other", COMPARISONS)
def test_greedy_generation_gives_the_same_tokens(name, other):
    # Left-padded batch, decoded past the sliding window: prefill, then seqlen_q=1 steps.
    model = model_of(name)
    ids, mask = TINY.inputs("left")
    tokens = {}
    for impl in ("fusedattn", other):
        model.set_attn_implementation(impl)
        tokens[impl] = model.generate(ids, attention_mask=mask, max_new_tokens=2 * WINDOW, do_sample=False)
    assert torch.equal(tokens["fusedattn"], tokens[other])


@pytest.mark.parametrize("padding", [None, "left"])
def test_greedy_generation_with_a_static_cache_gives_the_same_tokens(padding):
    # A compileable cache makes generate() build each step's mask before the forward pass and
    # hand it back to the model as attention_mask (it failed with "'CudnnMask' has no 'ndim'").
    model = model_of("llama")
    ids, mask = TINY.inputs(padding)
    tokens = {}
    for impl in ("fusedattn", "sdpa"):
        model.set_attn_implementation(impl)
        tokens[impl] = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                      cache_implementation="static", disable_compile=True)
    assert torch.equal(tokens["fusedattn"], tokens["sdpa"])


def test_soft_capping_runs_on_the_reference_and_says_so(caplog):
    model = model_of("gemma2")
    ids, _ = TINY.inputs(None)
    with caplog.at_level(logging.WARNING, logger=fa_hf.__name__):
        ours = logits(model, "fusedattn", ids, None)
    torch.testing.assert_close(ours, logits(model, "eager", ids, None), atol=2e-5, rtol=1e-4)
    # The cap matters for this model: without it the same weights give other logits.
    uncapped = model_of("gemma2", attn_logit_softcapping=None)
    assert not torch.allclose(ours, logits(uncapped, "eager", ids, None), atol=1e-3)
    assert "soft-capping (softcap=0.5) has no cuDNN equivalent" in caplog.text


def test_attention_sinks_change_the_output_and_match_eager():
    model = model_of("gpt_oss")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    ids, mask = TINY.inputs("left")
    keep = valid(mask, ids)
    ours = logits(model, "fusedattn", ids, mask)
    torch.testing.assert_close(ours[keep], logits(model, "eager", ids, mask)[keep], atol=2e-5, rtol=1e-4)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-1e4)  # sinks that take no probability
    assert not torch.allclose(ours[keep], logits(model, "fusedattn", ids, mask)[keep], atol=1e-3)


def test_packed_sequences_fall_back_to_the_dense_mask(caplog):
    model = model_of("llama")
    ids, _ = TINY.inputs(None)
    # Two documents packed in each row: positions restart at 6, so the mask is block-causal
    # (transformers detects packing only without a 2D mask and without a cache).
    packed = dict(position_ids=torch.tensor([list(range(6)) + list(range(4))] * 2), use_cache=False)
    out = {}
    with caplog.at_level(logging.WARNING, logger=fa_hf.__name__), torch.no_grad():
        for impl in ("fusedattn", "sdpa"):
            model.set_attn_implementation(impl)
            out[impl] = model(ids, **packed).logits
    torch.testing.assert_close(out["fusedattn"], out["sdpa"], atol=2e-5, rtol=1e-4)
    assert not torch.allclose(out["fusedattn"], logits(model, "sdpa", ids, None), atol=1e-3)  # packing matters
    assert "and_masks.<locals>.and_mask" in caplog.text and "materialised densely" in caplog.text


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_compiled_model_matches_eager_mode_without_graph_breaks(name):
    need_torch((2, 7), "dynamo of torch 2.5 and 2.6 does not trace transformers' own code")
    model = model_of(name)
    ids, _ = TINY.inputs(None)
    expected = logits(model, "fusedattn", ids, None)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_compiled_training_step_matches_eager_mode():
    need_torch((2, 7), "dynamo of torch 2.5 and 2.6 does not trace transformers' own code")
    model = model_of("mistral").train()
    ids, _ = TINY.inputs(None)
    model.set_attn_implementation("fusedattn")
    model(ids, labels=ids).loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    torch._dynamo.reset()
    torch.compile(model, fullgraph=True, backend="aot_eager")(ids, labels=ids).loss.backward()
    for param, grad in expected.items():
        torch.testing.assert_close(dict(model.named_parameters())[param].grad, grad, atol=1e-6, rtol=1e-5)


def test_compiled_model_with_a_padding_mask_uses_the_dense_mask():
    need_torch((2, 7), "dynamo of torch 2.5 and 2.6 does not trace transformers' own code")
    # Reading the 2D mask would break the graph: under tracing it is materialised instead.
    model = model_of("llama")
    ids, mask = TINY.inputs("left")
    expected = logits(model, "sdpa", ids, mask)
    model.set_attn_implementation("fusedattn")
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        got = compiled(ids, attention_mask=mask).logits
    keep = valid(mask, ids)
    torch.testing.assert_close(got[keep], expected[keep], atol=2e-5, rtol=1e-4)


# ----- the mask function ---------------------------------------------------------------------------
def mask_args(**changes):
    args = dict(batch_size=2, q_length=SEQ, kv_length=SEQ, q_offset=0, kv_offset=0,
                mask_function=masking_utils.causal_mask_function, attention_mask=None, local_size=None,
                allow_is_causal_skip=True, dtype=torch.float32, device="cpu", config=None, use_vmap=False)
    args.update(changes)
    return args


@mask_protocol_5
def test_mask_function_describes_a_causal_mask_without_a_tensor():
    assert fa_hf.fusedattn_mask(**mask_args()) == fa_hf.CudnnMask("causal", (-1, -1), SEQ, SEQ)


@mask_protocol_5
def test_mask_function_describes_a_sliding_window_mask():
    mask = fa_hf.fusedattn_mask(**mask_args(
        mask_function=masking_utils.sliding_window_causal_mask_function(WINDOW), local_size=WINDOW,
    ))
    assert (mask.mask, mask.window_size) == ("causal", (WINDOW - 1, 0))


@mask_protocol_5
def test_mask_function_materialises_a_pattern_it_was_mistaken_about():
    # chunked attention passes local_size like a sliding window; sampling its function shows the difference
    chunked = masking_utils.chunked_causal_mask_function(WINDOW, torch.zeros(2, dtype=torch.long))
    mask = fa_hf.fusedattn_mask(**mask_args(mask_function=chunked, local_size=WINDOW))
    expected = masking_utils.sdpa_mask(**mask_args(mask_function=chunked, local_size=WINDOW))
    assert isinstance(mask, torch.Tensor) and torch.equal(mask, expected)


def test_under_tracing_a_sliding_window_is_taken_from_local_size_and_the_config():
    # torch.compile cannot read the closure (or, in torch 2.11, call str methods on its name)
    sliding = masking_utils.sliding_window_causal_mask_function(WINDOW)
    config = types.SimpleNamespace(sliding_window=WINDOW)
    assert mask_interface._recognise(sliding, WINDOW, False, config, tracing=True) == (True, WINDOW)
    chunked_config = types.SimpleNamespace(sliding_window=None, attention_chunk_size=WINDOW)
    with pytest.raises(fa_hf.MaskNotExpressible):
        mask_interface._recognise(sliding, WINDOW, False, chunked_config, tracing=True)
    no_window_config = types.SimpleNamespace(attention_chunk_size=WINDOW)  # Llama 4's: no sliding_window at all
    with pytest.raises(fa_hf.MaskNotExpressible):
        mask_interface._recognise(sliding, WINDOW, False, no_window_config, tracing=True)


@mask_protocol_5
def test_a_mask_transformers_wants_as_a_tensor_is_the_sdpa_tensor_tagged_with_its_description():
    # transformers forbids skipping for packed sequences and block masks, and models that edit their
    # mask ask for it the same way: the mask function makes the tensor "sdpa" makes...
    args = mask_args(q_length=4, kv_length=16, q_offset=12, allow_is_causal_skip=False)
    dense = fa_hf.fusedattn_mask(**args)
    assert isinstance(dense, torch.Tensor) and torch.equal(dense, masking_utils.sdpa_mask(**args))
    # ...tagged with the description it would have returned had transformers allowed one
    described = fa_hf.fusedattn_mask(**{**args, "allow_is_causal_skip": True})
    ours, prefill = masks.tagged(dense, 4, 16)
    assert ours and prefill == described and prefill.mask == "causal_bottom_right"
    assert masks.tagged(dense, 1, 16) == (True, None)  # not this layer's lengths
    # A model may edit a tagged tensor in place: then the description no longer holds.
    owned = masks.tag(dense.clone(), prefill)
    assert masks.tagged(owned, 4, 16) == (True, prefill)
    owned[..., 3] = False
    assert masks.tagged(owned, 4, 16) == (False, None)
    # A tensor the mask function did not make carries nothing.
    assert masks.tagged(masking_utils.sdpa_mask(**args), 4, 16) == (False, None)


@mask_protocol_5
def test_a_decode_step_that_forbids_skipping_gets_the_sdpa_tensor_without_a_read_back(monkeypatch):
    # A static cache's decode step: the tensor is made as "sdpa" makes it, and its one row runs as a
    # bias in the attention function, so the step reads nothing back (a read waits for the GPU).
    args = mask_args(q_length=1, kv_length=16, q_offset=11, allow_is_causal_skip=False,
                     attention_mask=torch.ones(2, 12, dtype=torch.bool))
    for read in ("__bool__", "tolist", "item"):
        monkeypatch.setattr(torch.Tensor, read, lambda *_: pytest.fail("the mask function read a tensor back"))
    dense = fa_hf.fusedattn_mask(**args)
    monkeypatch.undo()
    assert torch.equal(dense, masking_utils.sdpa_mask(**args))
    bias = masks.one_row_bias(dense, 2, 16, torch.bfloat16)
    want = torch.zeros(2, 1, 1, 16, dtype=torch.bfloat16).masked_fill(~dense.expand(2, 1, 1, 16), float("-inf"))
    assert bias.dtype == torch.bfloat16 and torch.equal(bias.expand(2, 1, 1, 16), want)
    assert masks.one_row_bias(dense, 2, 16, torch.bfloat16) is bias  # every layer of the step: made once


@mask_protocol_5
def test_a_tagged_mask_runs_like_its_dense_mask():
    # The attention function takes the tag's description: the same output as "sdpa" on the tensor.
    args = mask_args(q_length=4, kv_length=16, q_offset=12, allow_is_causal_skip=False)
    dense = fa_hf.fusedattn_mask(**args)
    module = types.SimpleNamespace(is_causal=True, num_key_value_groups=2, training=False)
    q, k, v = (torch.randn(2, h, length, 8) for h, length in ((4, 4), (2, 16), (2, 16)))
    out, _ = fa_hf.fusedattn_attention(module, q, k, v, dense)
    want, _ = fa_hf.fusedattn_attention(module, q, k, v, masks.tagged(dense, 4, 16)[1])
    sdpa, _ = transformers.integrations.sdpa_attention.sdpa_attention_forward(module, q, k, v, dense)
    assert torch.equal(out, want)
    torch.testing.assert_close(out, sdpa, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("row", ["prefix", "left-padded", "float"])
def test_a_decode_steps_dense_mask_runs_as_a_bias_like_sdpa(row):
    seen = torch.tensor([[True] * 5 + [False] * 3, [False] * 2 + [True] * 6])[:, None, None, :]
    mask = {"prefix": seen[:1].expand(2, 1, 1, 8), "left-padded": seen,
            "float": torch.zeros(2, 1, 1, 8).masked_fill(~seen, torch.finfo(torch.float32).min)}[row]
    module = types.SimpleNamespace(is_causal=True, num_key_value_groups=2, training=False)
    q, k, v = (torch.randn(2, h, length, 8) for h, length in ((4, 1), (2, 8), (2, 8)))
    out, _ = fa_hf.fusedattn_attention(module, q, k, v, mask)
    sdpa, _ = transformers.integrations.sdpa_attention.sdpa_attention_forward(module, q, k, v, mask)
    torch.testing.assert_close(out, sdpa, atol=1e-5, rtol=1e-5)


def test_one_row_bias_takes_one_query_row_and_makes_it_again_after_an_edit():
    assert masks.one_row_bias(torch.ones(2, 1, 2, 8, dtype=torch.bool), 2, 8, torch.float32) is None  # two rows
    assert masks.one_row_bias(torch.ones(2, 1, 1, 8, dtype=torch.int32), 2, 8, torch.float32) is None  # not a mask
    mask = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    assert masks.one_row_bias(mask, 1, 8, torch.float32).eq(0).all()
    mask[..., 5:] = False
    assert masks.one_row_bias(mask, 1, 8, torch.float32)[0, 0, 0].tolist() == [0.0] * 5 + [float("-inf")] * 3


@pytest.mark.xfail(tuple(int(p) for p in transformers.__version__.split(".")[:2]) < (5, 24), strict=False,
                   reason="Doge in transformers 5.17 reads the mask function's description as a tensor "
                          "(docs/transformers.md); 5.24 asks for a tensor")
def test_a_model_that_edits_its_mask_generates_as_with_sdpa(caplog):
    # Doge asks create_causal_mask for the tensor (allow_is_causal_skip=False) and reads its dtype.
    config = transformers.DogeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                     keep_window_size=8, is_moe=False)
    torch.manual_seed(0)
    model = transformers.DogeForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    tokens = {}
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        for impl in ("fusedattn", "sdpa"):
            model.set_attn_implementation(impl)
            tokens[impl] = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert torch.equal(tokens["fusedattn"], tokens["sdpa"])
    # Its layers get a mask it made from the one the mask function made: they run on torch SDPA, said once.
    assert caplog.text.count("did not describe (the model made or changed it)") == 1


@mask_protocol_5
def test_mask_function_materialises_custom_mask_functions():
    need_torch((2, 6), "transformers makes vmap mask functions from torch 2.6")
    mask = fa_hf.fusedattn_mask(**mask_args(use_vmap=True, allow_is_causal_skip=False))
    assert isinstance(mask, torch.Tensor) and mask.shape == (2, 1, SEQ, SEQ)


SCENARIOS = {
    # name: (q_length, kv_length, q_offset, kv_offset, sliding window, (side, count) padded in row 0)
    "causal": (SEQ, SEQ, 0, 0, None, None),
    "causal-left-padding": (SEQ, SEQ, 0, 0, None, ("left", 3)),
    "causal-right-padding": (SEQ, SEQ, 0, 0, None, ("right", 3)),
    "sliding": (SEQ, SEQ, 0, 0, WINDOW, None),
    "sliding-left-padding": (SEQ, SEQ, 0, 0, WINDOW, ("left", 3)),
    "decode": (1, 12, 11, 0, None, None),
    "decode-left-padding": (1, 12, 11, 0, None, ("left", 3)),
    "prefill-after-cache": (4, 12, 8, 0, None, ("left", 3)),
    "sliding-decode-full-window": (1, WINDOW, 11, 11 - WINDOW + 1, WINDOW, ("left", 3)),
    "sliding-prefill-after-cache": (4, 12, 8, 0, WINDOW, None),
    "static-cache-decode": (1, 16, 11, 0, None, ("left", 3)),
    "static-cache-decode-no-2d-mask": (1, 16, 11, 0, None, None),
}


@mask_protocol_5
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_cudnn_mask_attends_like_the_dense_sdpa_mask(scenario):
    q_length, kv_length, q_offset, kv_offset, window, padding = SCENARIOS[scenario]
    two_d = None
    if padding is not None:
        side, count = padding
        two_d = torch.ones(2, q_offset + q_length, dtype=torch.bool)
        if side == "left":
            two_d[0, :count] = False
        else:
            two_d[0, q_offset + q_length - count:] = False
    function = masking_utils.causal_mask_function if window is None else (
        masking_utils.sliding_window_causal_mask_function(window))
    args = mask_args(q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
                     mask_function=function, local_size=window, attention_mask=two_d)
    cudnn = fa_hf.fusedattn_mask(**args)
    assert isinstance(cudnn, fa_hf.CudnnMask)
    dense = masking_utils.sdpa_mask(**{**args, "allow_is_causal_skip": False})

    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, q_length, 8, generator=gen)
    k, v = torch.randn(2, 2, kv_length, 8, generator=gen), torch.randn(2, 2, kv_length, 8, generator=gen)
    module = types.SimpleNamespace(is_causal=True, training=False, num_key_value_groups=2)
    ours, _ = fa_hf.fusedattn_attention(module, q, k, v, cudnn, scaling=0.3)
    bias = torch.zeros(dense.shape).masked_fill(~dense, float("-inf"))
    theirs = reference_attention(q, k, v, bias=bias, attn_scale=0.3).transpose(1, 2)
    rows = dense.any(-1)[:, 0]  # query rows with at least one visible key; others are padding
    torch.testing.assert_close(ours[rows], theirs[rows], atol=1e-5, rtol=1e-5)


# ----- report() / configs_from_hf() ------------------------------------------------------------
def no_cuda() -> Selector:
    return Selector(None, unavailable_reason=NO_CUDA)


def rows_of(name: str, **kwargs):
    return fa_hf.report(TINY.config(name), seqlen=16, selector=no_cuda(), **kwargs)


SLIDING = (WINDOW, (WINDOW - 1, 0))  # transformers' window, and window_size as cuDNN runs it
FULL = (None, (-1, -1))


@pytest.mark.parametrize("name,expected", [
    ("llama", [("full_attention", (0, 1), *FULL)]),
    ("mistral", [("sliding_attention", (0, 1), *SLIDING)]),
    ("qwen2", [("full_attention", (0,), *FULL), ("sliding_attention", (1,), *SLIDING)]),
    ("gemma2", [("sliding_attention+softcap", (0,), *SLIDING), ("full_attention+softcap", (1,), *FULL)]),
    ("gemma3", [("sliding_attention", (0,), *SLIDING), ("full_attention", (1,), *FULL)]),
    ("gpt_oss", [("sliding_attention+sinks", (0,), *SLIDING), ("full_attention+sinks", (1,), *FULL)]),
])
def test_report_groups_layers_by_problem(name, expected):
    rows = rows_of(name)
    assert [(r.name, r.layers, r.sliding_window, r.config.window_size) for r in rows] == expected
    for row in rows:
        assert (row.config.num_heads_q, row.config.num_heads_kv, row.config.head_dim_qk) == (4, 2, 8)
        assert (row.config.seqlen_q, row.config.mask, row.config.qkv_dtype) == (16, "causal", "bf16")
        assert row.config.is_training


def test_report_on_a_machine_without_cuda_says_none_with_the_platform_reason():
    for name in ("llama", "mistral", "qwen2", "gemma3", "gpt_oss"):
        for row in rows_of(name):
            assert row.backend is Backend.NONE
            assert row.reasons and all(NO_CUDA in reason for reason in row.reasons)


def test_report_says_soft_capped_layers_run_on_the_reference():
    for row in rows_of("gemma2"):
        assert row.backend is Backend.NONE and row.softcap == 0.5
        assert row.reasons == (
            "attn_logit_softcapping=0.5: cuDNN has no logit soft-capping; runs on the float32 reference",)


def test_report_carries_sinks_scale_and_inference():
    (sliding, full) = rows_of("gpt_oss", is_training=False, batch_size=3, dtype="fp16")
    assert sliding.sinks and sliding.config.softmax == "learnable"
    assert (full.config.is_training, full.config.batch_size, full.config.qkv_dtype) == (False, 3, "fp16")
    gemma = rows_of("gemma3")[0]
    assert gemma.config.attn_scale == pytest.approx(8 ** -0.5)


def test_report_drops_a_window_that_cannot_cut():
    (row,) = fa_hf.report(TINY.config("mistral"), seqlen=WINDOW, selector=no_cuda())
    assert (row.sliding_window, row.config.window_size) == (WINDOW, (-1, -1))


def test_report_accepts_a_config_a_model_a_dict_json_and_a_path(tmp_path):
    config = TINY.config("qwen2")
    (tmp_path / "config.json").write_text(config.to_json_string())
    expected = [r.to_dict() for r in fa_hf.report(config, seqlen=16, selector=no_cuda())]
    sources = [
        AutoModelForCausalLM.from_config(config), config.to_dict(), config.to_json_string(),
        str(tmp_path / "config.json"), tmp_path,
    ]
    for source in sources:
        assert [r.to_dict() for r in fa_hf.report(source, seqlen=16, selector=no_cuda())] == expected


def test_report_reads_a_plain_dict_without_a_known_model_type():
    hub_style = {"num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 8, "hidden_size": 512,
                 "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
    rows = fa_hf.report(hub_style, seqlen=1024, selector=no_cuda())
    assert [(r.name, r.layers, r.config.head_dim_qk, r.config.window_size) for r in rows] == [
        ("sliding_attention", (0, 2), 64, (127, 0)), ("full_attention", (1,), 64, (-1, -1))]


def test_report_rejects_what_is_not_a_language_model_config():
    with pytest.raises(ConfigError, match="hf_config"):
        fa_hf.report({"model_type": "nothing", "hidden_size": 4})
    with pytest.raises(ConfigError, match="no such config.json"):
        fa_hf.report("/nonexistent/config.json")


def test_report_uses_the_default_selector_when_none_is_given():
    rows = fa_hf.report(TINY.config("llama"), seqlen=16)
    assert [(r.name, r.layers) for r in rows] == [("full_attention", (0, 1))]
    assert rows[0].backend is Backend.NONE or rows[0].reason == ""


def test_configs_from_hf_returns_name_problem_and_layers():
    problems = fa_hf.configs_from_hf(TINY.config("gemma3"), seqlen=32, batch_size=2)
    assert [(name, layers) for name, _, layers in problems] == [("sliding_attention", [0]), ("full_attention", [1])]
    sliding = problems[0][1]
    assert (sliding.batch_size, sliding.seqlen_q, sliding.window_size) == (2, 32, (WINDOW - 1, 0))


def test_format_report_lists_layer_ranges_windows_and_reasons():
    config = TINY.config("qwen2", num_hidden_layers=5, max_window_layers=2)
    text = fa_hf.format_report(fa_hf.report(config, seqlen=16, selector=no_cuda()))
    lines = text.splitlines()
    assert lines[0].split() == ["layers", "type", "heads", "q/kv", "head", "dim", "window", "seqlen", "backend"]
    assert lines[1].split()[:2] == ["0-1", "full_attention"]
    assert "2-4" in text and f"{WINDOW} -> [{WINDOW - 1}, 0]" in text
    assert "reason: F16 forward no data at rule:platform" in text and NO_CUDA in text


def test_report_is_json_serialisable():
    rows = rows_of("gpt_oss")
    document = json.loads(json.dumps([row.to_dict() for row in rows]))
    assert document[0]["backend"] == "NONE" and document[0]["window_size"] == [WINDOW - 1, 0]
