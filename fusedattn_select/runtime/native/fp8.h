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

// max |x| of n elements (fp16 where `half`, else bf16) folded into *out (zero it first).
void amax(void const *x, bool half, int64_t n, float *out, int sms, cudaStream_t stream);

// y = saturate(x * scale) as e4m3, scale from *amax; writes tensor t's descale (and O's entries, for
// t == 2) into the FP8 state; folds max |x| into *running unless it is null.
void cast(void const *x, bool half, void *y, int64_t n, int t, float const *amax, Scaling const &scaling,
          float *state, float *running, cudaStream_t stream);

// A delayed-scaling history's update with this call's amaxes (src: 3 floats).
void commit(float *buf, int length, float *src, float *state, bool most_recent, bool from_running,
            cudaStream_t stream);

// y = x * descale in fp16 (`half`) or bf16.
void dequantize(void const *x, void *y, bool half, int64_t n, float const *descale, cudaStream_t stream);

}  // namespace fusedattn_select_fp8
