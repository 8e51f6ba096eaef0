"""GPU tests of the transformers integration: attn_implementation="fusedattn" in bf16 on CUDA.

Tiny random-initialised models (nothing downloaded) with head dim 64, so cuDNN runs them. bf16
results are held to "as close to the float32 model as 'sdpa' in bf16 is", rather than to fixed
tolerances; and the fused path must actually have run where Hopper supports it.
"""

from __future__ import annotations

import copy
import types

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("cudnn", reason="cudnn-frontend is not installed")

from hf_test_models import COMPARISONS, FAMILIES, LAYERS, TinyModels  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    masking_utils,  # noqa: E402
)

from fusedattn_select import Backend  # noqa: E402
from fusedattn_select.integrations import transformers as fa_hf  # noqa: E402
from fusedattn_select.reference.autograd_reference import reference_attention  # noqa: E402
from fusedattn_select.runtime.api import dispatch_info  # noqa: E402

CUDA = torch.device("cuda")
# Head dim 64, so cuDNN runs them; gpt-oss routes every token to both experts: top-k routing
# would flip between bf16 and float32.
TINY = TinyModels(vocab=128, seq=48, window=16, hidden=256, intermediate=512, head_dim=64, init_range=0.1,
                  softcap=5.0, experts_per_tok=2, pad=7)
SEQ, WINDOW = TINY.seq, TINY.window
# What Hopper runs fused (F16) in bf16: plain causal GQA, with or without a sliding window.
FUSED_ON_HOPPER = ("llama", "mistral", "qwen2", "gemma3")


@pytest.fixture(scope="module", autouse=True)
def registered():
    fa_hf.register()


def hopper() -> bool:
    return torch.cuda.get_device_capability()[0] == 9


def models_of(name: str):
    """The same weights in bf16 (under test) and float32 (the yardstick), on the GPU."""
    torch.manual_seed(0)
    truth = AutoModelForCausalLM.from_config(TINY.config(name)).to(CUDA).eval()
    truth.set_attn_implementation("eager")
    return copy.deepcopy(truth).to(torch.bfloat16), truth


def inputs(padding: str | None):
    ids, mask = TINY.inputs(padding)
    return ids.to(CUDA), (None if mask is None else mask.to(CUDA))


def real(ids, mask):
    return torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()


def logits(model, impl, ids, mask):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits.float()


def fallbacks(caplog) -> str:
    """dispatch's logged fallback reasons, for the message of a failed 'ran fused' check."""
    return " | ".join(r.getMessage()[-300:] for r in caplog.records if "falls back" in r.getMessage())


def error(value, truth):
    return ((value - truth).norm() / truth.norm()).item()


@pytest.mark.parametrize("padding", [None, "left", "right"])
@pytest.mark.parametrize("name,other", COMPARISONS)
def test_bf16_logits_are_as_accurate_as_the_other_implementation(name, other, padding, caplog):
    tested, truth = models_of(name)
    ids, mask = inputs(padding)
    keep = real(ids, mask)
    exact = logits(truth, "eager", ids, mask)[keep]
    calls = dispatch_info()["fused_calls"]
    ours = logits(tested, "fusedattn", ids, mask)[keep]
    fused = dispatch_info()["fused_calls"] - calls
    theirs = logits(tested, other, ids, mask)[keep]
    assert error(ours, exact) <= 2 * error(theirs, exact) + 2e-3
    if hopper() and name in FUSED_ON_HOPPER:
        assert fused == LAYERS, f"every layer should have run on cuDNN: {fallbacks(caplog)}"


@pytest.mark.parametrize("padding", [None, "right"])
@pytest.mark.parametrize("name,other", COMPARISONS)
def test_bf16_parameter_gradients_are_as_accurate_as_the_other_implementation(name, other, padding):
    tested, truth = models_of(name)
    ids, mask = inputs(padding)
    labels = ids.masked_fill(~real(ids, mask), -100)
    grads = {}
    for label, model, impl in (("truth", truth, "eager"), ("ours", tested, "fusedattn"), ("theirs", tested, other)):
        model.train().set_attn_implementation(impl)
        model.zero_grad()
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        grads[label] = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    for param, exact in grads["truth"].items():
        if ".router." in param:
            continue  # a MoE router's gradient is a small difference of large terms: bf16 noise only
        ours, theirs = error(grads["ours"][param], exact), error(grads["theirs"][param], exact)
        assert ours <= 2 * theirs + 1e-2, param


@pytest.mark.parametrize("name,other", COMPARISONS)
def test_greedy_generation_gives_the_same_tokens(name, other):
    # Left-padded batch decoded past the sliding window: fused prefill, then seqlen_q=1 steps.
    tested, _ = models_of(name)
    ids, mask = inputs("left")
    runs = {}
    for impl in ("fusedattn", other):
        tested.set_attn_implementation(impl)
        runs[impl] = tested.generate(ids, attention_mask=mask, max_new_tokens=WINDOW + 4, do_sample=False,
                                     output_scores=True, return_dict_in_generate=True)
    same_tokens(runs["fusedattn"], runs[other], ids.shape[1])


def same_tokens(ours, theirs, prompt: int) -> None:
    """Greedy generate() outputs agree: only a near-tie of the other implementation's top two
    logits (within a few percent, bf16's noise between two implementations) may go either way."""
    if not torch.equal(ours.sequences, theirs.sequences):
        row, column = (ours.sequences != theirs.sequences).nonzero()[0].tolist()
        top2 = theirs.scores[column - prompt][row].float().topk(2).values
        gap, tie = (top2[0] - top2[1]).item(), 0.03 * top2[0].abs().item() + 0.03
        assert gap < tie, f"tokens differ at step {column - prompt} where the top-2 gap is {gap:.3f}"


@pytest.mark.parametrize("padding", [None, "left"])
def test_static_cache_generation_runs_every_step_fused(padding, caplog):
    # A static cache's decode step asks for its mask as a tensor; the mask function tags it with
    # its description, so each step runs fused with no read of the tensor (no fallback, no log).
    if not hopper():
        pytest.skip("the fused path is checked where cuDNN runs it (Hopper)")
    tested, _ = models_of("llama")
    ids, mask = inputs(padding)
    runs = {}
    for impl in ("fusedattn", "sdpa"):
        tested.set_attn_implementation(impl)
        before = dispatch_info()
        runs[impl] = tested.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                     cache_implementation="static", disable_compile=True,
                                     output_scores=True, return_dict_in_generate=True)
        if impl == "fusedattn":
            after = dispatch_info()
            layers = tested.config.num_hidden_layers
            assert after["fused_calls"] - before["fused_calls"] == 8 * layers, fallbacks(caplog)
            assert after["fallback_calls"] == before["fallback_calls"], fallbacks(caplog)
    assert "did not describe" not in caplog.text
    same_tokens(runs["fusedattn"], runs["sdpa"], ids.shape[1])


SCENARIOS = {
    # (q_length, kv_length, q_offset, kv_offset, sliding window, (side, count) padded in row 0)
    "causal": (SEQ, SEQ, 0, 0, None, None),
    "causal-left-padding": (SEQ, SEQ, 0, 0, None, ("left", 7)),
    "causal-right-padding": (SEQ, SEQ, 0, 0, None, ("right", 7)),  # seqlens_q != seqlens_kv
    "sliding-left-padding": (SEQ, SEQ, 0, 0, WINDOW, ("left", 7)),
    "decode": (1, SEQ, SEQ - 1, 0, None, None),
    "decode-left-padding": (1, SEQ, SEQ - 1, 0, None, ("left", 7)),
    "prefill-after-cache": (8, SEQ, SEQ - 8, 0, WINDOW, None),
    "static-cache-decode": (1, 2 * SEQ, SEQ - 1, 0, None, ("left", 7)),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_fused_attention_with_a_cudnn_mask_matches_the_dense_mask(scenario, caplog):
    q_length, kv_length, q_offset, kv_offset, window, padding = SCENARIOS[scenario]
    two_d = torch.ones(2, q_offset + q_length, dtype=torch.bool, device=CUDA)
    side, count = padding or (None, 0)
    if side == "left":
        two_d[0, :count] = False
    elif side == "right":
        two_d[0, -count:] = False
    function = masking_utils.causal_mask_function if window is None else (
        masking_utils.sliding_window_causal_mask_function(window))
    args = dict(batch_size=2, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
                mask_function=function, attention_mask=two_d, local_size=window, allow_is_causal_skip=True,
                device=CUDA, use_vmap=False)
    cudnn = fa_hf.fusedattn_mask(**args)
    assert isinstance(cudnn, fa_hf.CudnnMask)
    dense = masking_utils.sdpa_mask(**{**args, "allow_is_causal_skip": False})

    gen = torch.Generator(device=CUDA).manual_seed(2)
    q = torch.randn(2, 4, q_length, 64, generator=gen, device=CUDA, dtype=torch.bfloat16)
    k = torch.randn(2, 2, kv_length, 64, generator=gen, device=CUDA, dtype=torch.bfloat16)
    v = torch.randn(2, 2, kv_length, 64, generator=gen, device=CUDA, dtype=torch.bfloat16)
    module = types.SimpleNamespace(is_causal=True, training=False, num_key_value_groups=2)
    calls = dispatch_info()["fused_calls"]
    ours, _ = fa_hf.fusedattn_attention(module, q, k, v, cudnn, scaling=0.125)
    if hopper():
        assert dispatch_info()["fused_calls"] == calls + 1, f"{cudnn.mask} should run on cuDNN: {fallbacks(caplog)}"
    bias = torch.zeros(dense.shape, device=CUDA).masked_fill(~dense, float("-inf"))
    exact = reference_attention(q.float(), k.float(), v.float(), bias=bias, attn_scale=0.125).transpose(1, 2)
    rows = dense.any(-1)[:, 0]
    torch.testing.assert_close(ours.float()[rows], exact[rows], atol=2e-2, rtol=2e-2)


def test_compiled_forward_matches_eager_mode():
    tested, _ = models_of("llama")
    ids, _ = inputs(None)
    expected = logits(tested, "fusedattn", ids, None)
    torch._dynamo.reset()
    compiled = torch.compile(tested, fullgraph=True)
    with torch.no_grad():
        got = compiled(ids).logits.float()
    assert error(got, expected) < 2e-2  # inductor fuses the bf16 norms and matmuls differently


def test_compiled_training_step_matches_eager_mode():
    tested, _ = models_of("mistral")
    tested.train().set_attn_implementation("fusedattn")
    ids, _ = inputs(None)
    tested(ids, labels=ids).loss.backward()
    expected = {n: p.grad.float().clone() for n, p in tested.named_parameters()}
    tested.zero_grad()
    torch._dynamo.reset()
    torch.compile(tested, fullgraph=True)(ids, labels=ids).loss.backward()
    for param, grad in expected.items():
        assert error(dict(tested.named_parameters())[param].grad.float(), grad) < 5e-2, param


@pytest.mark.parametrize("name", list(FAMILIES))
def test_report_names_the_backend_of_every_layer(name):
    rows = fa_hf.report(TINY.config(name), seqlen=4096)
    assert rows and all(row.layers for row in rows)
    for row in rows:
        if name == "gemma2":
            assert row.backend is Backend.NONE and "soft-capping" in row.reason
        elif hopper() and name in FUSED_ON_HOPPER:
            assert row.backend is Backend.F16, row.reason
        else:
            assert row.backend is Backend.F16 or row.reason
    print(fa_hf.format_report(rows))
