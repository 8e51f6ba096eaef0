// Pinned excerpt, verbatim (not compiled or imported by fusedattn-select).
// Source: ROCm/rocm-libraries
//   dnn-providers/hip-kernel-provider/src/engines/asm_sdpa_engine/plans/SdpaFwdPlanBuilder.cpp
// Commit: 50b5549f5c84fc40c37c7d5452d31ed3f0de439f
// Excerpt: getKernelNameKey(), getDataTypeIdentifier() and SdpaFwdPlanBuilder::isApplicable().
// Copyright © Advanced Micro Devices, Inc., or its affiliates.
// SPDX-License-Identifier:  MIT

static std::string getKernelNameKey(const std::string& archId,
                                    const std::string& dataType,
                                    int hdim_q, // NOLINT(readability-identifier-naming)
                                    int hdim_v, // NOLINT(readability-identifier-naming)
                                    plan_utils::MaskType maskType,
                                    RoundingMode bf16_cvt, // NOLINT(readability-identifier-naming)
                                    BatchMode mode,
                                    const CFG* cfgs)
{
    std::string kernelNameKey{};
    for(const auto& el : *cfgs)
    {
        const auto& cfg = el.second;
        if(cfg.arch != archId)
        {
            continue;
        }

        if(cfg.dtype == dataType && cfg.hdim_q == hdim_q && cfg.hdim_v == hdim_v
           && cfg.mask == static_cast<int>(maskType) && static_cast<int>(cfg.mode) == mode)
        {
            if(archId == "gfx950")
            {
                kernelNameKey = el.first;
                break;
            }
            if(archId == "gfx942" && cfg.bf16_cvt == bf16_cvt)
            {
                kernelNameKey = el.first;
                break;
            }
        }
    }

    return kernelNameKey;
}

static std::string getDataTypeIdentifier(hipdnn_flatbuffers_sdk::data_objects::DataType qType,
                                         hipdnn_flatbuffers_sdk::data_objects::DataType kType,
                                         hipdnn_flatbuffers_sdk::data_objects::DataType vType,
                                         hipdnn_flatbuffers_sdk::data_objects::DataType oType)
{
    using namespace hipdnn_flatbuffers_sdk::data_objects;
    if(plan_utils::allDataTypesEqual(DataType::BFLOAT16, {qType, kType, vType, oType}))
    {
        return "bf16";
    }
    if(plan_utils::allDataTypesEqual(DataType::FP8_E4M3, {qType, kType, vType})
       && oType == DataType::BFLOAT16)
    {
        return "fp8bf16";
    }

    return "";
}

bool SdpaFwdPlanBuilder::isApplicable(
    const Handle& handle, const hipdnn_flatbuffers_sdk::flatbuffer_utilities::IGraph& opGraph) const
{
    using namespace hipdnn_flatbuffers_sdk::data_objects;
    // NOLINTNEXTLINE(readability-identifier-naming)
    static const char* HIP_KERNEL_LOG_PREFIX = "[SdpaFwdPlanBuilder::isApplicable] ";

    auto& nodeWrappers = opGraph.nodeWrappers();

    std::string deviceString;

    try
    {
        deviceString = hip_kernel_provider_common::getDeviceString(handle.getStream());
        HIP_KERNEL_RETURN_FALSE_IF(
            deviceString != "gfx942" && deviceString != "gfx950",
            "Device string does not match gfx942 or gfx950 (Actual value: " + deviceString + ")");
    }
    catch(const std::exception& e)
    {
        HIPDNN_PLUGIN_LOG_ERROR("Could not query device string: " << e.what());
        return false;
    }

    HIP_KERNEL_RETURN_FALSE_IF(nodeWrappers.size() != 1, "Graph has more than one node");
    HIP_KERNEL_RETURN_FALSE_IF(nodeWrappers.front()->attributesType()
                                   != NodeAttributes::SdpaAttributes,
                               "Node attribute type is not SdpaAttributes");

    const auto& attrs = nodeWrappers.front()->attributesAs<SdpaAttributes>();
    HIP_KERNEL_RETURN_FALSE_IF(attrs.dropout_probability().has_value()
                                   && attrs.dropout_probability().value() != 0.f,
                               "dropout_probability must be unset or zero (Actual value: "
                                   + std::to_string(attrs.dropout_probability().value()) + ")");
    HIP_KERNEL_RETURN_FALSE_IF(attrs.alibi_mask(), "alibi_mask must be false");
    HIP_KERNEL_RETURN_FALSE_IF(attrs.padding_mask(), "padding_mask must be false");
    HIP_KERNEL_RETURN_FALSE_IF(attrs.attn_mask_tensor_uid(), // Change to bias
                               "attn_mask tensor not supported");

    HIP_KERNEL_RETURN_FALSE_IF(attrs.page_table_k_tensor_uid(),
                               "page_table_k tensor not supported");
    HIP_KERNEL_RETURN_FALSE_IF(attrs.page_table_v_tensor_uid(),
                               "page_table_v tensor not supported");

    HIP_KERNEL_RETURN_FALSE_IF(attrs.generate_stats(), "Stats output not supported");

    const auto& tensorMap = opGraph.getTensorMap();

    const int64_t qUid = attrs.q_tensor_uid();
    const int64_t kUid = attrs.k_tensor_uid();
    const int64_t vUid = attrs.v_tensor_uid();
    const int64_t oUid = attrs.o_tensor_uid();

    auto* qTensor = tensorMap.at(qUid);
    auto* kTensor = tensorMap.at(kUid);
    auto* vTensor = tensorMap.at(vUid);
    auto* oTensor = tensorMap.at(oUid);

    HIP_KERNEL_RETURN_FALSE_IF(
        qTensor->dims()->size() != 4,
        "q tensor must be rank 4 (Actual rank: " + std::to_string(qTensor->dims()->size()) + ")");
    HIP_KERNEL_RETURN_FALSE_IF(
        vTensor->dims()->size() != 4,
        "v tensor must be rank 4 (Actual rank: " + std::to_string(vTensor->dims()->size()) + ")");
    HIP_KERNEL_RETURN_FALSE_IF(
        kTensor->dims()->size() != 4,
        "k tensor must be rank 4 (Actual rank: " + std::to_string(kTensor->dims()->size()) + ")");
    HIP_KERNEL_RETURN_FALSE_IF(
        oTensor->dims()->size() != 4,
        "o tensor must be rank 4 (Actual rank: " + std::to_string(oTensor->dims()->size()) + ")");

    HIP_KERNEL_RETURN_FALSE_IF(qTensor->data_type() != kTensor->data_type()
                                   || qTensor->data_type() != vTensor->data_type(),
                               "Input tensors must all share a type (q tensor: "
                                   + EnumNameDataType(qTensor->data_type())
                                   + ", k tensor: " + EnumNameDataType(kTensor->data_type())
                                   + ", v tensor: " + EnumNameDataType(vTensor->data_type()) + ")");

    HIP_KERNEL_RETURN_FALSE_IF(
        kTensor->dims()->Get(1) != vTensor->dims()->Get(1),
        "k tensor and v tensor must shared the same head count (Actual value: k = "
            + std::to_string(kTensor->dims()->Get(1))
            + " v = " + std::to_string(vTensor->dims()->Get(1)) + ")");

    auto dataTypeId = getDataTypeIdentifier(
        qTensor->data_type(), kTensor->data_type(), vTensor->data_type(), oTensor->data_type());

    HIP_KERNEL_RETURN_FALSE_IF(
        dataTypeId.empty(),
        "output tensor must have datatype BFLOAT16 (Actual type: "
            + EnumNameDataType(oTensor->data_type())
            + ") and input tensors must have datatype BFLOAT16 or FP8_E4M3 (Actual type: "
            + EnumNameDataType(qTensor->data_type()) + ")");

    // Classify the mask; contradictory mask attributes are an invalid-input
    // condition the engine declines rather than dispatches.
    plan_utils::MaskType maskType = plan_utils::MaskType::NO_MASK;
    try
    {
        maskType = plan_utils::getMaskType(attrs);
    }
    catch(const hipdnn_plugin_sdk::HipdnnPluginException& e)
    {
        HIPDNN_PLUGIN_LOG_INFO(std::string{HIP_KERNEL_LOG_PREFIX} + e.what());
        return false;
    }

    auto key = getKernelNameKey(deviceString,
                                dataTypeId,
                                static_cast<int>(qTensor->dims()->Get(3)),
                                static_cast<int>(vTensor->dims()->Get(3)),
                                maskType,
                                getRoundingMode(attrs),
                                getBatchMode(attrs),
                                &cfg_fmha_fwd);

    HIP_KERNEL_RETURN_FALSE_IF(key.empty(),
                               "Could not find matching kernel for parameter combination");

    return true;
}
