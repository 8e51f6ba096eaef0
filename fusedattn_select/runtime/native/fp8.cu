// FP8 quantization kernels of the compiled FP8 forward (lean.cpp's Fp8Plan): the same bytes as
// runtime/fp8_kernels.py's Triton kernels. Scales are powers of two, 2**floor(log2(top / amax)),
// times a margin factor, at most max_scale; a cast saturates to +-top and keeps NaN; amaxes are
// folded with atomicMax on the bits of non-negative floats. Each kernel walks a tensor's dense
// memory from its first element, as the Triton kernels do.
//
// Launch shapes, chosen by timing variants on an H100 (b2 h32/8 d128 bf16 q, k, v at s4096 and
// s8192; every variant's bytes checked against the Triton kernels'): amax keeps kAmaxLoads 16-byte
// loads a thread in flight (no L1 allocation, L2 256-byte prefetch), takes the max on packed
// pairs and runs at most sms * kAmaxBlocksPerSm blocks; cast and dequantize run one block per
// threads * elements a thread (no grid stride for dense tensors) with streaming (evict-first)
// loads and stores, and the cast converts pairs with one cvt.

#include "fp8.h"

#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace fusedattn_select_fp8 {
namespace {

constexpr int kAmaxThreads = 512, kAmaxLoads = 2;  // 16-byte loads a thread per step
constexpr int kAmaxBlocksPerSm = 32;
constexpr int kCastThreads = 128, kCastElems = 8;   // cast without a running amax
constexpr int kFoldThreads = 256, kFoldElems = 16;  // cast folding the running amax (fewer, larger blocks)
constexpr int kDequantThreads = 256;

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
template <int kThreads>
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

// Where the memory is aligned for it, the kernels move 8 or 16 elements a thread at a time (16-byte
// loads of fp16/bf16, 8- or 16-byte stores of e4m3), then the rest one at a time.
union Fp8x8 {
    uint2 raw;
    __nv_fp8_storage_t bytes[8];
};

template <typename T> struct Pair;
template <> struct Pair<__nv_bfloat16> {
    using type = __nv_bfloat162;
    static __device__ __forceinline__ type make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <> struct Pair<__half> {
    using type = __half2;
    static __device__ __forceinline__ type make(float a, float b) { return __floats2half2_rn(a, b); }
};

template <typename T>
union Wide8 {
    uint4 raw;
    T values[8];
    typename Pair<T>::type pairs[4];
};

__device__ __forceinline__ float value(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float value(__half v) { return __half2float(v); }

__device__ __forceinline__ __nv_fp8_storage_t to_e4m3(float s) {
    return __nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3);
}

// Two at once: one cvt.rn.satfinite.e4m3x2.f32 (the instruction to_e4m3 uses for one); a in the low byte.
__device__ __forceinline__ __nv_fp8x2_storage_t to_e4m3x2(float a, float b) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float from_e4m3(__nv_fp8_storage_t b) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}

// Read-once 16 bytes: not kept in L1, with a 256-byte L2 prefetch (sm_80 and newer; a streaming
// load before that).
__device__ __forceinline__ uint4 load_once(uint4 const *p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
#else
    return __ldcs(p);
#endif
}

// The number of 8-element groups a kernel takes as wide loads (0 where `p` is not 16-byte aligned).
__device__ __forceinline__ int64_t wide(void const *p, int64_t n) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 ? n / 8 : 0;
}

// q, k and v in one launch: blocks [0, e0) take tensor 0, [e0, e1) tensor 1, [e1, e2) tensor 2.
// (Fields, not arrays: a parameter array indexed at run time would be copied to local memory.)
struct Span3 {
    void const *x0, *x1, *x2;
    void *y0, *y1, *y2;
    int64_t n0, n1, n2;
    int e0, e1, e2;
};

template <typename V>
__device__ __forceinline__ V pick(int t, V a, V b, V c) {
    return t == 0 ? a : (t == 1 ? b : c);
}

// The tensor of this block, and the block's index and count among that tensor's blocks.
__device__ __forceinline__ int tensor_of(Span3 const &a, int64_t &block, int64_t &blocks) {
    int b  = static_cast<int>(blockIdx.x);
    int t  = b < a.e0 ? 0 : (b < a.e1 ? 1 : 2);
    int lo = pick(t, 0, a.e0, a.e1);
    block  = b - lo;
    blocks = pick(t, a.e0, a.e1, a.e2) - lo;
    return t;
}

// max |x| folded into *out by `blocks` blocks, this one `block`. Each block step covers
// kAmaxThreads * kAmaxLoads 16-byte groups, thread i loading groups start + i + u * kAmaxThreads
// (all loads issued before any max). The max runs on packed pairs: exact, and like fmaxf it
// ignores NaN.
template <typename T>
__device__ __forceinline__ void amax_body(T const *__restrict__ x, int64_t n, float *__restrict__ out, int64_t block,
                                          int64_t blocks) {
    using Pair2          = typename Pair<T>::type;
    constexpr int kChunk = kAmaxThreads * kAmaxLoads;
    int64_t groups       = wide(x, n);
    auto const *xw       = reinterpret_cast<uint4 const *>(x);
    Pair2 m2             = Pair<T>::make(0.0f, 0.0f);
    int64_t step         = blocks * kChunk;
    for (int64_t start = block * kChunk; start < groups; start += step) {
        Wide8<T> in[kAmaxLoads];
        bool full = start + kChunk <= groups;
#pragma unroll
        for (int u = 0; u < kAmaxLoads; ++u) {
            int64_t i = start + u * kAmaxThreads + threadIdx.x;
            in[u].raw = (full || i < groups) ? load_once(xw + i) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kAmaxLoads; ++u) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                m2 = __hmax2(m2, __habs2(in[u].pairs[j]));
            }
        }
    }
    float m = fmaxf(__low2float(m2), __high2float(m2));
    for (int64_t i = groups * 8 + block * kAmaxThreads + threadIdx.x; i < n; i += blocks * kAmaxThreads) {
        m = fmaxf(m, fabsf(load(x, i)));
    }
    fold_max<kAmaxThreads>(m, out);
}

template <typename T>
__global__ void __launch_bounds__(kAmaxThreads) amax_kernel(Span3 a, float *__restrict__ out) {
    int64_t block, blocks;
    int t = tensor_of(a, block, blocks);
    amax_body(static_cast<T const *>(pick(t, a.x0, a.x1, a.x2)), pick(t, a.n0, a.n1, a.n2), out + t, block, blocks);
}

__device__ __forceinline__ float saturate(float s, float top) { return s != s ? s : fminf(fmaxf(s, -top), top); }

// y = saturate(x * scale) as e4m3; scale from *amax (times `margin`). Block 0 writes the state's
// descale of tensor t (and, for t == 2, O's descale and scale, which are V's; for t == 0, vnorm as
// NaN). With kFold, max |x| is folded into *running. A thread takes kElems elements (8: one
// 16-byte load, one 8-byte store; 16: two loads, one 16-byte store); a block kThreads * kElems.
// `blocks` blocks cast x, this one `block`.
template <int kThreads, int kElems, bool kFold, typename T>
__device__ __forceinline__ void cast_body(T const *__restrict__ x, __nv_fp8_storage_t *__restrict__ y, int64_t n,
                                          int t, float const *__restrict__ amax, float top, float max_scale,
                                          float margin, float *__restrict__ state, float *__restrict__ running,
                                          int64_t block, int64_t blocks) {
    constexpr int kLoads = kElems / 8;
    using Out            = std::conditional_t<kElems == 16, uint4, uint2>;
    float scale          = pow2_scale(*amax, top, max_scale, margin);
    if (block == 0 && threadIdx.x == 0) {
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
    float m       = 0.0f;
    int64_t first = block * kThreads + threadIdx.x;
    int64_t step  = blocks * kThreads;
    bool aligned  = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % kElems == 0;
    int64_t units = aligned ? n / kElems : 0;
    auto const *xw = reinterpret_cast<uint4 const *>(x);
    auto *yw       = reinterpret_cast<Out *>(y);
    for (int64_t i = first; i < units; i += step) {
        Wide8<T> in[kLoads];
#pragma unroll
        for (int g = 0; g < kLoads; ++g) {
            in[g].raw = __ldcs(xw + i * kLoads + g);
        }
        union {
            Out raw;
            __nv_fp8x2_storage_t pairs[kElems / 2];
        } out;
#pragma unroll
        for (int g = 0; g < kLoads; ++g) {
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                float v0 = value(in[g].values[j]), v1 = value(in[g].values[j + 1]);
                out.pairs[g * 4 + j / 2] = to_e4m3x2(saturate(v0 * scale, top), saturate(v1 * scale, top));
                if constexpr (kFold) {
                    m = fmaxf(m, fmaxf(fabsf(v0), fabsf(v1)));
                }
            }
        }
        __stcs(yw + i, out.raw);
    }
    for (int64_t i = units * kElems + first; i < n; i += step) {
        float v = load(x, i);
        y[i]    = to_e4m3(saturate(v * scale, top));
        m       = fmaxf(m, fabsf(v));
    }
    if constexpr (kFold) {
        fold_max<kThreads>(m, running);
    }
}

// The casts of q, k and v: amax and (with kFold) running hold a float a tensor.
template <int kThreads, int kElems, bool kFold, typename T>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(Span3 a, float const *__restrict__ amax, float top, float max_scale, float margin,
                float *__restrict__ state, float *__restrict__ running) {
    int64_t block, blocks;
    int t = tensor_of(a, block, blocks);
    cast_body<kThreads, kElems, kFold>(static_cast<T const *>(pick(t, a.x0, a.x1, a.x2)),
                                       static_cast<__nv_fp8_storage_t *>(pick(t, a.y0, a.y1, a.y2)),
                                       pick(t, a.n0, a.n1, a.n2), t, amax + t, top, max_scale, margin, state,
                                       kFold ? running + t : nullptr, block, blocks);
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

// Streaming (evict-first) loads and stores: each byte is touched once.
template <typename T>
__global__ void __launch_bounds__(kDequantThreads)
    dequant_kernel(__nv_fp8_storage_t const *__restrict__ x, T *__restrict__ y, int64_t n,
                   float const *__restrict__ descale) {
    float d        = *descale;
    int64_t first  = static_cast<int64_t>(blockIdx.x) * kDequantThreads + threadIdx.x;
    int64_t step   = static_cast<int64_t>(gridDim.x) * kDequantThreads;
    int64_t groups = reinterpret_cast<uintptr_t>(x) % 8 == 0 ? wide(y, n) : 0;
    auto const *xw = reinterpret_cast<uint2 const *>(x);
    auto *yw       = reinterpret_cast<uint4 *>(y);
    for (int64_t i = first; i < groups; i += step) {
        Fp8x8 in;
        in.raw = __ldcs(xw + i);
        Wide8<T> out;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            store(out.values, j, from_e4m3(in.bytes[j]) * d);
        }
        __stcs(yw + i, out.raw);
    }
    for (int64_t i = groups * 8 + first; i < n; i += step) {
        store(y, i, from_e4m3(x[i]) * d);
    }
}

// One block per `per_block` elements, at most `most` blocks (then the blocks stride).
int blocks(int64_t n, int64_t per_block, int64_t most) {
    int64_t wanted = (n + per_block - 1) / per_block;
    return static_cast<int>(wanted < most ? (wanted > 0 ? wanted : 1) : most);
}

constexpr int64_t kNoLimit = int64_t{1} << 30;

// The three tensors with `per_block` elements a block, at most `most` blocks each.
Span3 span(Three const &xs, int64_t per_block, int64_t most) {
    Span3 a{xs.x[0], xs.x[1], xs.x[2], xs.y[0], xs.y[1], xs.y[2], xs.n[0], xs.n[1], xs.n[2], 0, 0, 0};
    a.e0 = blocks(xs.n[0], per_block, most);
    a.e1 = a.e0 + blocks(xs.n[1], per_block, most);
    a.e2 = a.e1 + blocks(xs.n[2], per_block, most);
    return a;
}

template <typename T>
void cast_as(Three const &xs, float const *amax, Scaling const &s, float *state, float *running,
             cudaStream_t stream) {
    if (running != nullptr) {  // larger blocks: fewer folds
        Span3 a = span(xs, int64_t{kFoldThreads} * kFoldElems, kNoLimit);
        cast_kernel<kFoldThreads, kFoldElems, true, T><<<a.e2, kFoldThreads, 0, stream>>>(
            a, amax, s.top, s.max_scale, s.margin, state, running);
    } else {
        Span3 a = span(xs, int64_t{kCastThreads} * kCastElems, kNoLimit);
        cast_kernel<kCastThreads, kCastElems, false, T><<<a.e2, kCastThreads, 0, stream>>>(
            a, amax, s.top, s.max_scale, s.margin, state, running);
    }
}

}  // namespace

void amax(Three const &xs, float *out, int sms, cudaStream_t stream) {
    Span3 a = span(xs, int64_t{kAmaxThreads} * kAmaxLoads * 8, int64_t{sms} * kAmaxBlocksPerSm);
    if (xs.half) {
        amax_kernel<__half><<<a.e2, kAmaxThreads, 0, stream>>>(a, out);
    } else {
        amax_kernel<__nv_bfloat16><<<a.e2, kAmaxThreads, 0, stream>>>(a, out);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void cast(Three const &xs, float const *amax, Scaling const &s, float *state, float *running, cudaStream_t stream) {
    if (xs.half) {
        cast_as<__half>(xs, amax, s, state, running, stream);
    } else {
        cast_as<__nv_bfloat16>(xs, amax, s, state, running, stream);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void commit(float *buf, int length, float *src, float *state, bool most_recent, bool from_running,
            cudaStream_t stream) {
    commit_kernel<<<1, 32, 0, stream>>>(buf, length, src, state, most_recent, from_running);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void dequantize(void const *x, void *y, bool half, int64_t n, float const *descale, cudaStream_t stream) {
    auto const *in = static_cast<__nv_fp8_storage_t const *>(x);
    int grid       = blocks(n, int64_t{kDequantThreads} * 8, kNoLimit);
    if (half) {
        dequant_kernel<<<grid, kDequantThreads, 0, stream>>>(in, static_cast<__half *>(y), n, descale);
    } else {
        dequant_kernel<<<grid, kDequantThreads, 0, stream>>>(in, static_cast<__nv_bfloat16 *>(y), n, descale);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace fusedattn_select_fp8
