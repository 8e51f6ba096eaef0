// The optional compiled lean path (runtime/native/__init__.py builds and loads it).
//
// A LeanPlan holds an entry's forward (and backward) cuDNN graphs, deserialized from the bytes the
// Python frontend serialized, and the geometry of the tensors the lean path allocates. Calling it
// runs what runtime/lean.py runs (lean_forward, LeanAttention, lean_backward) without Python: the
// outputs are allocated by torch's caching allocator on the caller's device, the graph executes on
// the current stream through a cuDNN handle of this thread and device, and training calls get a C++
// autograd node, so the backward runs on autograd's device thread without taking the GIL. The node is
// made as torch's generated ones are (next edges, saved variables, history set on the output), which
// costs less host time than a torch::autograd::Function (README has the figures).
//
// cudnn-frontend is header-only; its namespace is renamed here so that no other copy in the process
// (torch's, the Python frontend's) can be bound to these definitions, and it loads cuDNN itself.

#define cudnn_frontend fusedattn_select_cudnn_frontend
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING 1
#include "cudnn_frontend.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/custom_class.h>
#include <torch/extension.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
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

struct Geometry {
    std::vector<int64_t> shape, strides;
};

}  // namespace

// How an entry's plans take a call's tensors (runtime/lean.py's Lean), with its graphs.
struct LeanPlan : torch::CustomClassHolder {
    std::shared_ptr<Graph> forward_graph, backward_graph;
    Geometry out;
    at::ScalarType out_dtype = at::kBFloat16;
    bool out_like_q          = false;
    bool has_stats           = false;
    Geometry stats;
    bool has_grads = false;
    Geometry dq, dk, dv;
    std::vector<int64_t> do_strides;
    bool grads_like_qkv = false;
    std::vector<at::Tensor> ragged_forward, ragged_backward;

    // (out, stats or undefined) of a call.
    std::pair<at::Tensor, at::Tensor> forward(at::Tensor const &q, at::Tensor const &k, at::Tensor const &v) {
        auto options = q.options();
        at::Tensor o = out_like_q ? at::empty_like(q) : at::empty_strided(out.shape, out.strides, options.dtype(out_dtype));
        at::Tensor st;
        if (has_stats) {
            st = at::empty_strided(stats.shape, stats.strides, options.dtype(at::kFloat));
        }
        void *buffers[kMaxBuffers];
        buffers[0] = q.data_ptr();
        buffers[1] = k.data_ptr();
        buffers[2] = v.data_ptr();
        buffers[3] = o.data_ptr();
        buffers[4] = has_stats ? st.data_ptr() : nullptr;
        size_t n = 5;
        for (auto const &t : ragged_forward) {
            buffers[n++] = t.data_ptr();
        }
        run(*forward_graph, buffers, q);
        return {o, st};
    }

    std::vector<at::Tensor> backward(at::Tensor grad_out, at::Tensor const &q, at::Tensor const &k,
                                     at::Tensor const &v, at::Tensor const &o, at::Tensor const &st) {
        if (grad_out.strides() != c10::IntArrayRef(do_strides)) {  // into the memory the plan declared
            grad_out = at::empty_strided(grad_out.sizes(), do_strides, grad_out.options()).copy_(grad_out);
        }
        at::Tensor gq, gk, gv;
        if (grads_like_qkv) {
            gq = at::empty_like(q);
            gk = at::empty_like(k);
            gv = at::empty_like(v);
        } else {
            gq = at::empty_strided(dq.shape, dq.strides, q.options());
            gk = at::empty_strided(dk.shape, dk.strides, k.options());
            gv = at::empty_strided(dv.shape, dv.strides, v.options());
        }
        void *buffers[kMaxBuffers];
        at::Tensor const *given[] = {&q, &k, &v, &o, &st, &grad_out, &gq, &gk, &gv};
        size_t n = 0;
        for (auto const *t : given) {
            buffers[n++] = t->data_ptr();
        }
        for (auto const &t : ragged_backward) {
            buffers[n++] = t.data_ptr();
        }
        run(*backward_graph, buffers, q);
        return {gq, gk, gv};
    }
};

namespace {

namespace ta = torch::autograd;

// The backward of a training call: the plan's backward graph on the saved q, k, v, o and stats.
struct LeanBackward : public ta::Node {
    c10::intrusive_ptr<LeanPlan> plan;
    ta::SavedVariable q, k, v, o, stats;

    std::string name() const override { return "LeanAttentionBackward"; }

    void release_variables() override {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto *saved : {&q, &k, &v, &o, &stats}) {
            saved->reset_data();
        }
    }

    ta::variable_list apply(ta::variable_list &&grads) override {
        return plan->backward(grads[0], q.unpack(), k.unpack(), v.unpack(), o.unpack(), stats.unpack());
    }
};

// Torch releases hold autograd nodes in std::shared_ptr (deleted by torch's deleteNode, which frees
// long graphs without deep recursion) or, later ones, in c10::intrusive_ptr.
using NodePtr = decltype(ta::Edge().function);

template <typename T>
NodePtr make_node() {
    if constexpr (std::is_same_v<NodePtr, std::shared_ptr<ta::Node>>) {
        return std::shared_ptr<T>(new T(), [](T *node) { deleteNode(node); });  // found by ADL in ta
    } else {
        return c10::make_intrusive<T>();
    }
}

at::Tensor call(c10::intrusive_ptr<LeanPlan> const &plan, at::Tensor const &q, at::Tensor const &k,
                at::Tensor const &v) {
    TORCH_CHECK(!q._fw_grad(0).defined() && !k._fw_grad(0).defined() && !v._fw_grad(0).defined(),
                "fusedattn_select attention(): forward-mode AD (dual tensors) is not supported");
    auto [o, st] = plan->forward(q, k, v);
    if (!(plan->has_grads && ta::GradMode::is_enabled() &&
          (q.requires_grad() || k.requires_grad() || v.requires_grad()))) {
        return o;
    }
    NodePtr node = make_node<LeanBackward>();
    auto *backward = static_cast<LeanBackward *>(node.get());
    backward->set_next_edges(ta::collect_next_edges(q, k, v));
    backward->plan  = plan;
    backward->q     = ta::SavedVariable(q, false);
    backward->k     = ta::SavedVariable(k, false);
    backward->v     = ta::SavedVariable(v, false);
    backward->o     = ta::SavedVariable(o.detach(), false);  // o's data (and version), not its history
    backward->stats = ta::SavedVariable(st, false);
    ta::set_history(o, node);
    return o;
}

Geometry geometry(std::vector<int64_t> shape, std::vector<int64_t> strides) {
    return Geometry{std::move(shape), std::move(strides)};
}

// What the build's self-test runs first: the frontend formats numbers through std::ostream, which
// crashes where the module's C++ runtime is not the one the process loaded (a compiler wrapper that
// links libstdc++ statically).
std::string stream_check(int64_t value) {
    std::ostringstream text;
    text << "eng" << value;
    return text.str();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "fusedattn_select's optional compiled lean path";
    // The caller has made torch load cuDNN; this finds that same library (never a second copy).
    fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
    if (fe::cudnn_dlhandle == nullptr) {
        throw std::runtime_error("fusedattn_select native: libcudnn.so.9 is not loaded in this process");
    }
    pybind11::class_<Graph, std::shared_ptr<Graph>>(m, "Graph")
        .def_readonly("workspace", &Graph::workspace)
        .def_readonly("uids", &Graph::uids);
    m.def("executes", [] { return executes.load(std::memory_order_relaxed); }, "Graphs run so far");
    m.def("stream_check", &stream_check, "Format a number through std::ostream (the build's self-test)");
    m.def("load_graph", &load_graph, "Deserialize a graph on a device, with the call position of each uid");
    m.def("run_tensors", &run_tensors, "Run a graph on the current stream with tensors in its call positions");
    pybind11::class_<LeanPlan, c10::intrusive_ptr<LeanPlan>>(m, "LeanPlan")
        .def(pybind11::init([](std::shared_ptr<Graph> forward_graph, std::vector<int64_t> out_shape,
                               std::vector<int64_t> out_strides, at::ScalarType out_dtype, bool out_like_q,
                               std::vector<at::Tensor> ragged_forward) {
            auto plan            = c10::make_intrusive<LeanPlan>();
            plan->forward_graph  = std::move(forward_graph);
            plan->out            = geometry(std::move(out_shape), std::move(out_strides));
            plan->out_dtype      = out_dtype;
            plan->out_like_q     = out_like_q;
            plan->ragged_forward = std::move(ragged_forward);
            return plan;
        }))
        .def("set_stats", [](LeanPlan &plan, std::vector<int64_t> shape, std::vector<int64_t> strides) {
            plan.has_stats = true;
            plan.stats     = geometry(std::move(shape), std::move(strides));
        })
        .def("set_backward",
             [](LeanPlan &plan, std::shared_ptr<Graph> graph, std::vector<std::vector<int64_t>> grads,
                std::vector<int64_t> do_strides, bool grads_like_qkv, std::vector<at::Tensor> ragged_backward) {
                 TORCH_CHECK(grads.size() == 6, "set_backward: grads takes dq, dk, dv shapes and strides");
                 plan.backward_graph  = std::move(graph);
                 plan.dq              = geometry(grads[0], grads[1]);
                 plan.dk              = geometry(grads[2], grads[3]);
                 plan.dv              = geometry(grads[4], grads[5]);
                 plan.do_strides      = std::move(do_strides);
                 plan.grads_like_qkv  = grads_like_qkv;
                 plan.ragged_backward = std::move(ragged_backward);
                 plan.has_grads       = true;
             })
        .def("__call__", &call, "The call's output (a C++ autograd node where grads are wanted)");
}
