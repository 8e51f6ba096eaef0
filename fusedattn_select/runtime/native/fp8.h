// The FP8 quantization kernels of the compiled FP8 forward (fp8.cu), launched from lean.cpp.

#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fusedattn_select_fp8 {

// How a cast's scale is made from an amax: 2**floor(log2(top / amax)) * margin, at most max_scale.
struct Scaling {
    float top       = 448.0f;
    float max_scale = 1.0f;
    float margin    = 1.0f;
};

// q, k and v of one call (x: fp16 where `half`, else bf16; n elements each) and their e4m3
// copies (y, with x's layout).
struct Three {
    void const *x[3];
    void *y[3];
    int64_t n[3];
    bool half;
};

// max |x| of each tensor folded into out[i] (3 floats; zero them first), in one launch.
void amax(Three const &xs, float *out, int sms, cudaStream_t stream);

// y = saturate(x * scale) as e4m3 for each tensor, its scale from amax[i] (3 floats), in one
// launch; writes each descale (and O's entries, V's) into the FP8 state; folds max |x| into
// running[i] unless running is null.
void cast(Three const &xs, float const *amax, Scaling const &scaling, float *state, float *running,
          cudaStream_t stream);

// A delayed-scaling history's update with this call's amaxes (src: 3 floats).
void commit(float *buf, int length, float *src, float *state, bool most_recent, bool from_running,
            cudaStream_t stream);

// y = x * descale in fp16 (`half`) or bf16.
void dequantize(void const *x, void *y, bool half, int64_t n, float const *descale, cudaStream_t stream);

}  // namespace fusedattn_select_fp8
