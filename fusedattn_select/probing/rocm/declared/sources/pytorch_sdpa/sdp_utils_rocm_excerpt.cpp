// Pinned excerpt, verbatim (not compiled or imported by fusedattn-select).
// Source: aten/src/ATen/native/transformers/cuda/sdp_utils.cpp of PyTorch, read from the fork
//   cyyever/pytorch (which tracks pytorch/pytorch main) at commit
//   0339585faf33e225134dc017989a9a95dfc955ce. The copy of pytorch/pytorch in the source index
//   (21c3369eded41cbad40b61858013c3312afc6dbb) predates AOTriton 0.9 and its 512 head-dim limit.
// Excerpt: aotriton_max_hdim(), check_head_dim_size_flash(), the ROCm part of
// check_head_dim_size_mem_efficient(), check_flash_causal_non_square_seqlens(),
// check_dtypes_low_precision(), the constraint lists of can_use_flash_attention() and the ROCm
// parts of can_use_mem_efficient_attention().
// Copyright (c) 2016- Facebook, Inc and the PyTorch contributors; BSD-3-Clause (see ../README.md).

#if USE_ROCM_ATTENTION
inline int aotriton_max_hdim() {
  static const int max_hdim = []() {
#if AOTRITON_VERSION_CURRENT >= AOTRITON_VERSION_INT(0, 11)
    // gfx11xx is capped at hdim <= 256 from AOTriton 0.11 onward, and this is a
    // standing decision rather than a version workaround: 0.11/0.12 ship no
    // larger kernels, and the 0.13 hdim 512 kernels are miscompiled under
    // register/LDS pressure and silently return saturated results (#189849).
    // Do not lift the cap on an AOTriton bump alone; hdim > 256 has to be
    // revalidated on gfx11xx hardware first.
    auto dprops = at::cuda::getCurrentDeviceProperties();
    const c10::basic_string_view<char> arch(dprops->gcnArchName);
    if (arch.starts_with("gfx11")) {
      return 256;
    }
#endif // AOTriton >= 0.11
#if AOTRITON_VERSION_CURRENT >= AOTRITON_VERSION_INT(0, 9)
    return 512;
#else
    return 256;
#endif
  }();
  return max_hdim;
}
#endif // USE_ROCM_ATTENTION

template<bool caller_is_meff = false>
bool check_head_dim_size_flash(sdp_params const& params, bool debug) {
  const auto query_size_last = params.query.sym_size(-1);
  const auto key_size_last = params.key.sym_size(-1);
  const auto value_size_last = params.value.sym_size(-1);
  bool supported_head_dim;
#if USE_ROCM_ATTENTION
  if (at::cuda::device_count() == 0) {
    return false;
  }
  const auto max_size = c10::SymInt(aotriton_max_hdim());
  supported_head_dim =
      query_size_last == key_size_last && query_size_last == value_size_last &&
      query_size_last <= max_size;
#else
  supported_head_dim = at::globalContext().userEnabledFA4SDP()
      ? check_head_dim_size_fa4(params)
      : query_size_last == key_size_last &&
          query_size_last == value_size_last && query_size_last <= 256;
#endif

  // [...]
}

bool check_head_dim_size_mem_efficient(sdp_params const& params, bool debug) {
#if USE_ROCM_ATTENTION
#if AOTRITON_VERSION_CURRENT < AOTRITON_VERSION_INT(0, 12)
  return check_head_dim_size_flash_nested<true /* caller_is_meff */>(params, debug);
#endif
#endif
  const auto query_size_last = params.query.sym_size(-1);
  const auto value_size_last = params.value.sym_size(-1);
#ifdef USE_ROCM
  bool is_half = (params.query.dtype() == at::kHalf) ||
      (params.query.dtype() == at::kBFloat16);
  const int64_t alignment = is_half ? 8 : 4;
#else
  const int64_t alignment = minimum_gemm_alignment(params);
#endif
  if (!(query_size_last == params.key.sym_size(-1) &&
        query_size_last % alignment == 0 && query_size_last > 0 &&
        value_size_last % alignment == 0 && value_size_last > 0)) {
  // [...]

#if USE_ROCM_ATTENTION
#if AOTRITON_VERSION_CURRENT >= AOTRITON_VERSION_INT(0, 12)
  const auto max_size = c10::SymInt(aotriton_max_hdim());
  if (!(query_size_last <= max_size && value_size_last <= max_size)) {

  // [...]
}

bool check_flash_causal_non_square_seqlens(sdp_params const& params, bool debug) {
  // FlashAttention 2 updated the default mask meaning for causal in this PR:
  // 9e5e8bc91e it is now aligned to lower_right which would be a BC break
  // for non-square masks. We will not support non-square masks for causal w/ FAV2
  if (params.is_causal &&
      !params.query.is_nested() && !params.key.is_nested() &&
      params.query.sym_size(-2) != params.key.sym_size(-2)) {

  // [...]
}

bool check_dtypes_low_precision(sdp_params const& params, bool debug) {
  auto dprop = at::cuda::getCurrentDeviceProperties();
  if (dprop->major >= 8) {
    constexpr auto sm80_dtypes =
        std::to_array<at::ScalarType>({at::kHalf, at::kBFloat16});
    return check_tensor_dtype(params, sm80_dtypes, debug);
  } else {
    constexpr auto default_dtypes = std::to_array<at::ScalarType>({at::kHalf});
    return check_tensor_dtype(params, default_dtypes, debug);
  }
}


bool can_use_flash_attention(sdp_params const& params, bool debug) {
  constexpr auto general_constraints = std::to_array<bool (*)(sdp_params const&, bool)>({
      check_runtime_disabled_flash,
      check_all_tensors_on_device,
      check_tensor_shapes,
      check_for_attn_mask,
      check_fa4_constraints,
      check_head_dim_size_flash<false /*caller_is_meff*/>,
      check_flash_attention_hardware_support,
      check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120,
      check_flash_causal_non_square_seqlens,
      check_dtypes_flash_attention});
  constexpr bool backend_supports_grouped_query_attention = true;

  // [...]
}

bool can_use_mem_efficient_attention(sdp_params const& params, bool debug) {
#ifdef USE_ROCM
  constexpr auto aotriton_mem_efficient_dtypes =
      std::to_array<at::ScalarType>({at::kHalf, at::kFloat, at::kBFloat16});
  constexpr auto ck_mem_efficient_dtypes =
      std::to_array<at::ScalarType>({at::kHalf, at::kBFloat16});
#else
  // [...]
  if (has_only_dense_inputs(params)) {
#ifdef USE_ROCM
    constexpr bool supports_gqa = false;
    constexpr bool supports_mqa = false;
#else
#ifdef USE_ROCM
  if (params.attn_mask.has_value()) {
    const auto q_dtype = params.query.dtype();
    const auto bias_dtype = params.attn_mask.value().dtype();
    if (bias_dtype != at::kBool && bias_dtype != q_dtype) {
      TORCH_WARN("Efficient attention on ROCm requires attn_mask be boolean, or has the same datatype as of q,k,v");
      return false;
    }
  }
