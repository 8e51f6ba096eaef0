// FP8 quantization kernels of the compiled FP8 forward (lean.cpp's Fp8Plan): the same bytes as
// runtime/fp8_kernels.py's Triton kernels. Scales are powers of two, 2**floor(log2(top / amax)),
// times a margin factor, at most max_scale; a cast saturates to +-top and keeps NaN; amaxes are
// folded with atomicMax on the bits of non-negative floats. Each kernel walks a tensor's dense
// memory from its first element, as the Triton kernels do.

#include "fp8.h"

#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace fusedattn_select_fp8 {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load(__nv_bfloat16 const *x, int64_t i) { return __bfloat162float(x[i]); }
__device__ __forceinline__ float load(__half const *x, int64_t i) { return __half2float(x[i]); }
// (torch builds with the implicit half and bfloat16 conversions turned off)
__device__ __forceinline__ void store(__nv_bfloat16 *y, int64_t i, float v) { y[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__half *y, int64_t i, float v) { y[i] = __float2half_rn(v); }

__device__ __forceinline__ float pow2_scale(float amax, float top, float max_scale, float margin) {
    float bits = __int_as_float(__float_as_int(__fdiv_rn(top, amax)) & 0x7F800000);
    return fminf(bits * margin, max_scale);
}

// The block's max of `value` (non-negative), folded into *out by atomicMax on its bits.
__device__ __forceinline__ void fold_max(float value, float *out) {
    __shared__ float warps[kThreads / 32];
    for (int offset = 16; offset > 0; offset /= 2) {
        value = fmaxf(value, __shfl_down_sync(0xffffffffu, value, offset));
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) {
        warps[warp] = value;
    }
    __syncthreads();
    if (warp == 0) {
        value = lane < kThreads / 32 ? warps[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset /= 2) {
            value = fmaxf(value, __shfl_down_sync(0xffffffffu, value, offset));
        }
        if (lane == 0 && value > 0.0f) {
            atomicMax(reinterpret_cast<int *>(out), __float_as_int(value));
        }
    }
}

// Eight elements a thread at a time (16-byte loads of fp16/bf16, 8-byte stores of e4m3) where the
// memory is aligned for it, then the rest one at a time.
union Fp8x8 {
    uint2 raw;
    __nv_fp8_storage_t bytes[8];
};

template <typename T>
union Wide8 {
    uint4 raw;
    T values[8];
};

__device__ __forceinline__ float value(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float value(__half v) { return __half2float(v); }

__device__ __forceinline__ __nv_fp8_storage_t to_e4m3(float s) {
    return __nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float from_e4m3(__nv_fp8_storage_t b) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}

// The number of 8-element groups a kernel takes as wide loads (0 where `p` is not 16-byte aligned).
__device__ __forceinline__ int64_t wide(void const *p, int64_t n) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 ? n / 8 : 0;
}

template <typename T>
__global__ void amax_kernel(T const *x, int64_t n, float *out) {
    float m       = 0.0f;
    int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    int64_t step  = static_cast<int64_t>(gridDim.x) * kThreads;
    int64_t groups = wide(x, n);
    auto const *xw = reinterpret_cast<uint4 const *>(x);
    for (int64_t i = first; i < groups; i += step) {
        Wide8<T> in;
        in.raw = xw[i];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            m = fmaxf(m, fabsf(value(in.values[j])));
        }
    }
    for (int64_t i = groups * 8 + first; i < n; i += step) {
        m = fmaxf(m, fabsf(load(x, i)));
    }
    fold_max(m, out);
}

__device__ __forceinline__ float saturate(float s, float top) { return s != s ? s : fminf(fmaxf(s, -top), top); }

// y = saturate(x * scale) as e4m3; scale from *amax (times `margin`). Block 0 writes the state's
// descale of tensor t (and, for t == 2, O's descale and scale, which are V's; for t == 0, vnorm as
// NaN). With `running`, max |x| is folded into it.
template <typename T>
__global__ void cast_kernel(T const *x, __nv_fp8_storage_t *y, int64_t n, int t, float const *amax, float top,
                            float max_scale, float margin, float *state, float *running) {
    float scale = pow2_scale(*amax, top, max_scale, margin);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float descale = __fdiv_rn(1.0f, scale);
        state[t]      = descale;
        if (t == 0) {
            state[6] = __int_as_float(0x7fc00000);
        }
        if (t == 2) {
            state[7] = descale;
            state[8] = scale;
        }
    }
    float m        = 0.0f;
    int64_t first  = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    int64_t step   = static_cast<int64_t>(gridDim.x) * kThreads;
    int64_t groups = reinterpret_cast<uintptr_t>(y) % 8 == 0 ? wide(x, n) : 0;
    auto const *xw = reinterpret_cast<uint4 const *>(x);
    auto *yw       = reinterpret_cast<uint2 *>(y);
    for (int64_t i = first; i < groups; i += step) {
        Wide8<T> in;
        in.raw = xw[i];
        Fp8x8 out;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float v      = value(in.values[j]);
            out.bytes[j] = to_e4m3(saturate(v * scale, top));
            m            = fmaxf(m, fabsf(v));
        }
        yw[i] = out.raw;
    }
    for (int64_t i = groups * 8 + first; i < n; i += step) {
        float v = load(x, i);
        y[i]    = to_e4m3(saturate(v * scale, top));
        m       = fmaxf(m, fabsf(v));
    }
    if (running != nullptr) {
        fold_max(m, running);
    }
}

// A delayed-scaling history's update (one block, a thread per column of q, k, v): rows shift down
// one, row 0 = src, the reduced row = src (most recent) or the max of the new rows; with
// `from_running`, src is the running amax: copied to the state's amaxes and zeroed.
__global__ void commit_kernel(float *buf, int length, float *src, float *state, bool most_recent,
                              bool from_running) {
    int c = threadIdx.x;
    if (c >= 3) {
        return;
    }
    float fresh = src[c];
    float top   = 0.0f;
    for (int row = length - 1; row >= 1; --row) {
        float old              = buf[(row - 1) * 3 + c];
        top                    = fmaxf(top, old);
        buf[row * 3 + c]       = old;
    }
    buf[c]              = fresh;
    buf[length * 3 + c] = most_recent ? fresh : fmaxf(top, fresh);
    if (from_running) {
        state[3 + c] = fresh;
        src[c]       = 0.0f;
    }
}

template <typename T>
__global__ void dequant_kernel(__nv_fp8_storage_t const *x, T *y, int64_t n, float const *descale) {
    float d        = *descale;
    int64_t first  = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    int64_t step   = static_cast<int64_t>(gridDim.x) * kThreads;
    int64_t groups = reinterpret_cast<uintptr_t>(x) % 8 == 0 ? wide(y, n) : 0;
    auto const *xw = reinterpret_cast<uint2 const *>(x);
    auto *yw       = reinterpret_cast<uint4 *>(y);
    for (int64_t i = first; i < groups; i += step) {
        Fp8x8 in;
        in.raw = xw[i];
        Wide8<T> out;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            store(out.values, j, from_e4m3(in.bytes[j]) * d);
        }
        yw[i] = out.raw;
    }
    for (int64_t i = groups * 8 + first; i < n; i += step) {
        store(y, i, from_e4m3(x[i]) * d);
    }
}

int blocks_for(int64_t n, int sms) {
    int64_t wanted = (n / 8 + kThreads - 1) / kThreads;  // a thread per 8 elements at most
    int64_t most   = static_cast<int64_t>(sms) * 8;
    return static_cast<int>(wanted < most ? (wanted > 0 ? wanted : 1) : most);
}

}  // namespace

void amax(void const *x, bool half, int64_t n, float *out, int sms, cudaStream_t stream) {
    if (half) {
        amax_kernel<<<blocks_for(n, sms), kThreads, 0, stream>>>(static_cast<__half const *>(x), n, out);
    } else {
        amax_kernel<<<blocks_for(n, sms), kThreads, 0, stream>>>(static_cast<__nv_bfloat16 const *>(x), n, out);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void cast(void const *x, bool half, void *y, int64_t n, int t, float const *amax, Scaling const &s, float *state,
          float *running, int sms, cudaStream_t stream) {
    auto *out = static_cast<__nv_fp8_storage_t *>(y);
    if (half) {
        cast_kernel<<<blocks_for(n, sms), kThreads, 0, stream>>>(static_cast<__half const *>(x), out, n, t, amax, s.top,
                                                                 s.max_scale, s.margin, state, running);
    } else {
        cast_kernel<<<blocks_for(n, sms), kThreads, 0, stream>>>(static_cast<__nv_bfloat16 const *>(x), out, n, t,
                                                                 amax, s.top, s.max_scale, s.margin, state, running);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void commit(float *buf, int length, float *src, float *state, bool most_recent, bool from_running,
            cudaStream_t stream) {
    commit_kernel<<<1, 32, 0, stream>>>(buf, length, src, state, most_recent, from_running);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void dequantize(void const *x, void *y, bool half, int64_t n, float const *descale, int sms, cudaStream_t stream) {
    auto const *in = static_cast<__nv_fp8_storage_t const *>(x);
    if (half) {
        dequant_kernel<<<blocks_for(n, sms), kThreads, 0, stream>>>(in, static_cast<__half *>(y), n, descale);
    } else {
        dequant_kernel<<<blocks_for(n, sms), kThreads, 0, stream>>>(in, static_cast<__nv_bfloat16 *>(y), n, descale);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace fusedattn_select_fp8
