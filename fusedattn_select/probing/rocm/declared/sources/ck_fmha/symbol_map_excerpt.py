# Pinned excerpt, verbatim (data only, not imported by fusedattn-select).
# Source: ROCm/rocm-libraries projects/composablekernel/dispatcher/codegen/fmha/symbol_map.py
# Commit: fcfd55a54039baa31cd3a86de09d33642a84c333
# Excerpt: FWD_DTYPE_MAP, BWD_DTYPE_MAP, MASK_CANONICAL, BIAS_CANONICAL (module-level tables).
# Copyright (c) Advanced Micro Devices, Inc., or its affiliates.
# SPDX-License-Identifier: MIT

# Forward dtype → C++ type config struct.
# Source: example/ck_tile/01_fmha/fmha_fwd.hpp FmhaFwdTypeConfig<> specializations
#   and codegen/cpp_symbol_map.py FWD_DTYPE_MAP.
FWD_DTYPE_MAP = {
    "fp32": "FmhaFwdFp32",
    "fp16": "FmhaFwdFp16",
    "bf16": "FmhaFwdBf16",
    "fp8": "FmhaFwdFp8",
    "bf8": "FmhaFwdBf8",
    "fp8fp16": "FmhaFwdFp8Fp16",
    "fp8bf16": "FmhaFwdFp8Bf16",
    "fp8fp32": "FmhaFwdFp8Fp32",
}

# Backward dtype → C++ type config struct.
# Source: example/ck_tile/01_fmha/fmha_bwd.hpp FmhaBwdTypeConfig<> specializations.
# BWD currently only supports fp16/bf16/fp32.
BWD_DTYPE_MAP = {
    "fp32": "FmhaBwdFp32",
    "fp16": "FmhaBwdFp16",
    "bf16": "FmhaBwdBf16",
}

# Mask type → canonical form and C++ types.
# Source: include/ck_tile/ops/fmha/block/block_attention_mask.hpp
#   SimplifiedGenericAttentionMask<is_causal> and GenericAttentionMask<has_mask, has_local>.
MASK_CANONICAL = {
    "no": "no",
    "no_mask": "no",
    "causal": "top_left",
    "top_left": "top_left",
    "t": "top_left",
    "bottom_right": "bottom_right",
    "b": "bottom_right",
    "generic": "generic",
    "window_generic": "generic",
    "g": "generic",
}

# Bias type → canonical form and C++ enum.
# Source: include/ck_tile/ops/fmha/block/block_attention_bias_enum.hpp.
BIAS_CANONICAL = {
    "no": "no",
    "no_bias": "no",
    "bias": "bias",
    "elementwise": "bias",
    "elementwise_bias": "bias",
    "alibi": "alibi",
}
