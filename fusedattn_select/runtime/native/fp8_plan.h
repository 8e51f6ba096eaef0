// The compiled FP8 forward (lean.cpp registers it; runtime/native/fp8_plan.py makes it): an FP8
// inference call's quantization of q, k and v (current or delayed scaling), its FP8 graph and the
// pass of O back to the input precision, run from C++ with the bytes runtime/fp8.py's path makes.

#pragma once

#include "fp8.h"
#include "graphs.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>

#include <optional>
#include <utility>
#include <vector>

namespace {

// Positions of a call's buffers: q8, k8, v8, o8, then the FP8 state's entries (runtime/fp8.py's
// STATE, float32 each), then the plan's constant tensors.
constexpr int kStateAt = 4, kStateSize = 11, kConstantsAt = kStateAt + kStateSize;

struct Fp8Plan {
    std::shared_ptr<Graph> graph;
    std::vector<int64_t> out_shape, out_strides;  // O in the caller's dim order
    at::ScalarType out_dtype = at::kBFloat16;     // Float8_e4m3fn: the kernel's FP8 O, else dequantized
    std::vector<at::Tensor> constants;
    fusedattn_select_fp8::Scaling scaling;        // top and max_scale (the margin is the call's)
    int sms = 1;

    // (O, the FP8 state) of a call; `history` is an FP8History's buffer (delayed scaling, or its
    // first call, `fresh`, which scales from the current amaxes and records them).
    std::pair<at::Tensor, at::Tensor> forward(at::Tensor const &q, at::Tensor const &k, at::Tensor const &v,
                                              std::optional<at::Tensor> const &history, int64_t length,
                                              double margin, bool most_recent, bool fresh) {
        namespace f8 = fusedattn_select_fp8;
        c10::cuda::CUDAGuard guard(q.device());
        cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
        auto options        = q.options();
        at::Tensor state    = at::empty({kStateSize}, options.dtype(at::kFloat));
        float *st           = state.data_ptr<float>();
        bool half           = q.scalar_type() == at::kHalf;
        at::Tensor const *xs[] = {&q, &k, &v};
        at::Tensor ys[3];
        f8::Three three{};
        three.half = half;
        for (int i = 0; i < 3; ++i) {
            ys[i]      = at::empty_strided(xs[i]->sizes(), xs[i]->strides(), options.dtype(at::kFloat8_e4m3fn));
            three.x[i] = xs[i]->data_ptr();
            three.y[i] = ys[i].data_ptr();
            three.n[i] = xs[i]->numel();
        }
        float *buf = history.has_value() ? history->data_ptr<float>() : nullptr;
        f8::Scaling scale = scaling;
        if (buf == nullptr || fresh) {  // current scaling
            C10_CUDA_CHECK(cudaMemsetAsync(st + 3, 0, 3 * sizeof(float), stream));
            f8::amax(three, st + 3, sms, stream);
            scale.margin = 1.0f;
            f8::cast(three, st + 3, scale, st, nullptr, stream);
            if (buf != nullptr) {
                f8::commit(buf, static_cast<int>(length), st + 3, st, most_recent, false, stream);
            }
        } else {  // delayed scaling: the history's reduced amaxes; this call's are recorded
            scale.margin   = static_cast<float>(margin);
            float *running = buf + (length + 1) * 3;
            f8::cast(three, buf + length * 3, scale, st, running, stream);
            f8::commit(buf, static_cast<int>(length), running, st, most_recent, true, stream);
        }
        at::Tensor o8 = at::empty_strided(out_shape, out_strides, options.dtype(at::kFloat8_e4m3fn));
        void *buffers[kMaxBuffers];
        for (int i = 0; i < 3; ++i) {
            buffers[i] = ys[i].data_ptr();
        }
        buffers[3] = o8.data_ptr();
        for (int i = 0; i < kStateSize; ++i) {
            buffers[kStateAt + i] = st + i;
        }
        for (size_t i = 0; i < constants.size(); ++i) {
            buffers[kConstantsAt + i] = constants[i].data_ptr();
        }
        run(*graph, buffers, q);
        if (out_dtype == at::kFloat8_e4m3fn) {
            return {o8, state};
        }
        at::Tensor o = at::empty_strided(out_shape, out_strides, options.dtype(out_dtype));
        f8::dequantize(o8.data_ptr(), o.data_ptr(), out_dtype == at::kHalf, o8.numel(), st + 7, stream);
        return {o, state};
    }
};

}  // namespace
