// cuDNN graphs for the compiled lean path (lean.cpp includes this once): a graph deserialized from
// the bytes the Python frontend serialized, a cuDNN handle per thread and device, and running a graph
// on the current stream with a call's buffers in the frontend's sorted order.
//
// cudnn-frontend is header-only; its namespace is renamed here so that no other copy in the process
// (torch's, the Python frontend's) can be bound to these definitions, and it loads cuDNN itself.

#pragma once

#define cudnn_frontend fusedattn_select_cudnn_frontend
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING 1
#include "cudnn_frontend.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace fe = fusedattn_select_cudnn_frontend;

// The frontend's dynamic loading reads cuDNN's symbols through this handle: the libcudnn torch loaded.
namespace fusedattn_select_cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

namespace {

constexpr int kMaxBuffers = 32;
std::atomic<int64_t> executes{0};  // graphs run (dispatch_info's "executes" adds them)

// One cuDNN handle per thread and device (cuDNN's rule), pointed at the stream of the last call.
struct HandleSlot {
    cudnnHandle_t handle = nullptr;
    cudaStream_t stream  = nullptr;
};

cudnnHandle_t handle_for(int device, cudaStream_t stream) {
    // Never destroyed: a thread's handles live as long as the thread, like torch's own pool.
    thread_local std::vector<HandleSlot> slots;
    if (static_cast<int>(slots.size()) <= device) {
        slots.resize(device + 1);
    }
    HandleSlot &slot = slots[device];
    if (slot.handle == nullptr) {
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        TORCH_CHECK(fe::detail::create_handle(&slot.handle) == CUDNN_STATUS_SUCCESS,
                    "fusedattn_select native: cudnnCreate failed on device ", device);
        slot.stream = nullptr;
        TORCH_CHECK(fe::detail::set_stream(slot.handle, stream) == CUDNN_STATUS_SUCCESS,
                    "fusedattn_select native: cudnnSetStream failed");
        slot.stream = stream;
    } else if (slot.stream != stream) {
        TORCH_CHECK(fe::detail::set_stream(slot.handle, stream) == CUDNN_STATUS_SUCCESS,
                    "fusedattn_select native: cudnnSetStream failed");
        slot.stream = stream;
    }
    return slot.handle;
}

void check(fe::error_t status, char const *what) {
    if (status.is_bad()) {
        throw std::runtime_error(std::string("fusedattn_select native: ") + what + ": " + status.get_message());
    }
}

// A deserialized graph and where its variant pack finds each tensor among a call's buffers.
struct Graph {
    std::shared_ptr<fe::graph::Graph> graph;
    std::vector<int64_t> uids;      // the graph's user tensors
    std::vector<int> call_index;    // the position in a call's buffers of each uid
    std::vector<int> sorted_pick;   // for each slot in the frontend's sorted uid order: a call position
    std::atomic<bool> ready{false};  // sorted_pick is set (by the first run, under `first`)
    std::mutex first;
    int64_t workspace = 0;
    int device        = 0;
};

std::shared_ptr<Graph> load_graph(int device, std::string const &bytes, std::vector<int64_t> uids,
                                  std::vector<int> call_index) {
    TORCH_CHECK(uids.size() == call_index.size() && uids.size() <= kMaxBuffers,
                "fusedattn_select native: uids and call positions differ in length");
    auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
    cudnnHandle_t handle = handle_for(device, stream.stream());
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    auto out   = std::make_shared<Graph>();
    out->graph = std::make_shared<fe::graph::Graph>();
    std::vector<uint8_t> data(bytes.begin(), bytes.end());
    check(out->graph->deserialize(handle, data, false, false), "deserialize");
    check(out->graph->get_workspace_size(out->workspace), "get_workspace_size");
    out->uids       = std::move(uids);
    out->call_index = std::move(call_index);
    out->device     = device;
    return out;
}

// Run `g` on the current stream with a call's buffers (`like`: a tensor on the graph's device).
void run(Graph &g, void *const *buffers, at::Tensor const &like) {
    c10::cuda::OptionalCUDAGuard guard;  // the graph's device current, as torch's ops make it
    if (c10::cuda::current_device() != g.device) {
        guard.set_index(static_cast<c10::DeviceIndex>(g.device));
    }
    auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(g.device));
    cudnnHandle_t handle = handle_for(g.device, stream.stream());
    at::Tensor workspace;
    void *workspace_ptr = nullptr;
    if (g.workspace > 0) {
        workspace     = at::empty({g.workspace}, like.options().dtype(at::kByte));
        workspace_ptr = workspace.data_ptr();
    }
    if (!g.ready.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> lock(g.first);
        if (!g.ready.load(std::memory_order_relaxed)) {
            // The first run binds by uid (the frontend checks every uid), then learns its slot order.
            std::unordered_map<int64_t, void *> pack;
            for (size_t i = 0; i < g.uids.size(); ++i) {
                pack[g.uids[i]] = buffers[g.call_index[i]];
            }
            check(g.graph->execute(handle, pack, workspace_ptr), "execute");
            executes.fetch_add(1, std::memory_order_relaxed);
            std::vector<int> pick;
            for (int64_t uid : g.graph->get_variant_pack_uids_sorted()) {
                auto at = std::find(g.uids.begin(), g.uids.end(), uid);
                TORCH_CHECK(at != g.uids.end(), "fusedattn_select native: the graph binds uid ", uid,
                            " it was not given");
                pick.push_back(g.call_index[at - g.uids.begin()]);
            }
            g.sorted_pick = std::move(pick);
            g.ready.store(true, std::memory_order_release);
            return;
        }
    }
    void *ptrs[kMaxBuffers];
    int const n = static_cast<int>(g.sorted_pick.size());
    for (int i = 0; i < n; ++i) {
        ptrs[i] = buffers[g.sorted_pick[i]];
    }
    check(g.graph->execute(handle, ptrs, n, workspace_ptr), "execute");
    executes.fetch_add(1, std::memory_order_relaxed);
}

// Run `g` with tensors in its call positions (a Python Plan's binding order: runtime/plans.py).
void run_tensors(std::shared_ptr<Graph> const &g, std::vector<at::Tensor> const &tensors) {
    int needed = 0;
    for (int position : g->call_index) {
        needed = std::max(needed, position + 1);
    }
    TORCH_CHECK(static_cast<int>(tensors.size()) >= needed && tensors.size() <= kMaxBuffers,
                "fusedattn_select native: the graph takes ", needed, " tensors, got ", tensors.size());
    void *buffers[kMaxBuffers];
    for (size_t i = 0; i < tensors.size(); ++i) {
        buffers[i] = tensors[i].data_ptr();
    }
    run(*g, buffers, tensors[0]);
}

}  // namespace
