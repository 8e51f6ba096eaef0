// Pinned excerpt, verbatim (not compiled or imported by fusedattn-select).
// Source: ROCm/rocm-libraries
//   dnn-providers/hip-kernel-provider/src/engines/asm_sdpa_engine/plans/SdpaPlanUtils.hpp
// Commit: 1051f6cd93b2801d92ee5d79957814a48b61eda4
// Excerpt: enum class MaskType (the ordinals of the kernel CSVs' `mask` column) and the mask
// classification at the end of resolveMask().
// Copyright © Advanced Micro Devices, Inc., or its affiliates.
// SPDX-License-Identifier:  MIT

// Mask types for AITER ASM (.co) kernel dispatch.
// Ordinals match AITER's asm_mask_type() return values (mha_bwd.cu / mha_fwd.cu)
// and the CSV `mask` column — do not reorder.
// Note: SLIDING_WINDOW (3) is distinct from AITER's mask_enum::window_generic (also
// ordinal 3), which maps to -1 (unsupported) and falls back to CK kernels.
enum class MaskType : int
{
    NO_MASK = 0,
    TOP_LEFT_CAUSAL = 1,
    BOTTOM_RIGHT_CAUSAL = 2,
    SLIDING_WINDOW = 3
};

// [...] (end of resolveMask)
    if(mask.left == -1 && mask.right == -1) // both unbounded
    {
        mask.type = MaskType::NO_MASK;
    }
    else if(mask.left == -1 && mask.right == 0) // causal: attend up to the diagonal
    {
        mask.type = mask.topLeft ? MaskType::TOP_LEFT_CAUSAL : MaskType::BOTTOM_RIGHT_CAUSAL;
    }
    else
    {
        mask.type = MaskType::SLIDING_WINDOW; // anything else is a sliding window
    }
    return mask;
