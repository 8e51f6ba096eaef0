// The optional compiled lean path (runtime/native/__init__.py builds and loads it).
//
// A LeanPlan holds an entry's forward (and backward) cuDNN graphs, deserialized from the bytes the
// Python frontend serialized, and the geometry of the tensors the lean path allocates. Calling it
// runs what runtime/lean.py runs (lean_forward, LeanAttention, lean_backward) without Python: the
// outputs are allocated by torch's caching allocator on the caller's device, the graph executes on
// the current stream through a cuDNN handle of this thread and device, and training calls get a C++
// autograd node, so the backward runs on autograd's device thread without taking the GIL. The node is
// made as torch's generated ones are (next edges, saved variables, history set on the output), which
// costs less host time than a torch::autograd::Function (docs/performance.md has the figures).
//
// The module also holds the hot path's table: attention() hands it a call first, and a call whose
// signature it holds (a compiled lean entry, filed after its first call) runs with no Python of ours.
// Graphs, handles and execution are in graphs.h.

#include "graphs.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/custom_class.h>
#include <torch/extension.h>

#include <dlfcn.h>

#include <array>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

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

// Torch releases hold autograd nodes in std::shared_ptr (deleted by torch's deleteNode, which frees
// long graphs without deep recursion) or, later ones, in c10::intrusive_ptr.
using NodePtr = decltype(ta::Edge().function);

template <typename T, typename... Args>
NodePtr make_node(Args &&...args) {
    if constexpr (std::is_same_v<NodePtr, std::shared_ptr<ta::Node>>) {
        return std::shared_ptr<T>(new T(std::forward<Args>(args)...),
                                  [](T *node) { deleteNode(node); });  // found by ADL in ta
    } else {
        return c10::make_intrusive<T>(std::forward<Args>(args)...);
    }
}

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
        if (!ta::GradMode::is_enabled()) {  // (autograd runs a backward so, unless create_graph=True)
            return plan->backward(grads[0], q.unpack(), k.unpack(), v.unpack(), o.unpack(), stats.unpack());
        }
        at::Tensor const q_ = q.unpack(), k_ = k.unpack(), v_ = v.unpack();
        ta::variable_list out;
        {
            at::NoGradGuard no_grad;
            out = plan->backward(grads[0], q_, k_, v_, o.unpack(), stats.unpack());
        }
        // cuDNN's backward is no torch op: gradients that autograd may differentiate again carry a
        // node that raises, as runtime/lean.py's differentiable_once does, rather than losing terms. Its
        // edges lead to what they came from: autograd.grad(..., inputs=...) runs only nodes on such paths.
        auto error = make_node<ta::Error>(
            "attention(): a double backward is not supported (cuDNN's backward is not differentiable)",
            ta::collect_next_edges(grads[0], q_, k_, v_));
        for (size_t i = 0; i < out.size(); ++i) {
            if (should_compute_output(i)) {
                out[i] = out[i].detach();
                ta::set_history(out[i], error);
            }
        }
        return out;
    }
};

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

// ----- the hot path's table (runtime/api.py's attention() asks it first) ---------------------------
// A call's LeanPlan found from attention()'s non-tensor arguments as given and the properties of its
// q, k and v that runtime/entries.py's fast_key holds, without running Python. Every use holds the GIL
// (each is a Python call into this module), which guards the table.

// The kinds of attention()'s leading arguments that key a call, in order, as runtime/args.py's
// TABLE_ARGUMENTS declares them (set_argument_kinds, when the module is loaded): the table holds
// arguments of plain types only, so hashing and comparing them runs no Python code, and a bool never
// stands for a number (True == 1: its key would find the number's entry and skip the check that
// refuses it). Empty until set: no call is then held.
enum class ArgumentKind { Str, StrOrNone, Number, NumberOrNone, Bool, IntTuple };

std::vector<ArgumentKind> &argument_kinds() {
    static auto *kinds = new std::vector<ArgumentKind>();
    return *kinds;
}

void set_argument_kinds(std::vector<std::string> const &names) {
    static std::unordered_map<std::string, ArgumentKind> const known = {
        {"str", ArgumentKind::Str},       {"str?", ArgumentKind::StrOrNone}, {"number", ArgumentKind::Number},
        {"number?", ArgumentKind::NumberOrNone}, {"bool", ArgumentKind::Bool}, {"int-tuple", ArgumentKind::IntTuple},
    };
    std::vector<ArgumentKind> kinds;
    for (auto const &name : names) {
        auto found = known.find(name);
        if (found == known.end()) {
            throw std::invalid_argument("unknown argument kind '" + name + "'");
        }
        kinds.push_back(found->second);
    }
    argument_kinds() = std::move(kinds);
}

bool plain_argument(PyObject *o, ArgumentKind kind) {
    auto number = [](PyObject *x) { return PyLong_CheckExact(x) || PyFloat_CheckExact(x); };
    switch (kind) {
    case ArgumentKind::Str: return PyUnicode_CheckExact(o);
    case ArgumentKind::StrOrNone: return o == Py_None || PyUnicode_CheckExact(o);
    case ArgumentKind::Number: return number(o);
    case ArgumentKind::NumberOrNone: return o == Py_None || number(o);
    case ArgumentKind::Bool: return PyBool_Check(o);
    case ArgumentKind::IntTuple:
        if (!PyTuple_CheckExact(o)) {
            return false;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); ++i) {
            if (!PyLong_CheckExact(PyTuple_GET_ITEM(o, i))) {
                return false;
            }
        }
        return true;
    }
    return false;
}

bool plain_arguments(PyObject *arguments) {
    auto const &kinds = argument_kinds();
    if (kinds.empty() || !PyTuple_CheckExact(arguments) ||
        PyTuple_GET_SIZE(arguments) != static_cast<Py_ssize_t>(kinds.size())) {
        return false;
    }
    for (size_t i = 0; i < kinds.size(); ++i) {
        if (!plain_argument(PyTuple_GET_ITEM(arguments, static_cast<Py_ssize_t>(i)), kinds[i])) {
            return false;
        }
    }
    return true;
}

struct TensorFacts {
    std::array<int64_t, 4> sizes{}, strides{};
    int dtype = 0, device_type = 0, device_index = 0;

    bool operator==(TensorFacts const &other) const {
        return sizes == other.sizes && strides == other.strides && dtype == other.dtype &&
               device_type == other.device_type && device_index == other.device_index;
    }
};

struct CallKey {
    pybind11::object arguments;
    std::array<TensorFacts, 3> tensors;  // q, k, v
    bool training  = false;
    bool capturing = false;
    size_t hash    = 0;

    bool operator==(CallKey const &other) const {
        if (hash != other.hash || training != other.training || capturing != other.capturing ||
            tensors != other.tensors) {
            return false;
        }
        int same = PyObject_RichCompareBool(arguments.ptr(), other.arguments.ptr(), Py_EQ);
        if (same < 0) {  // not reached with plain arguments
            PyErr_Clear();
        }
        return same == 1;
    }
};

struct CallKeyHash {
    size_t operator()(CallKey const &key) const { return key.hash; }
};

size_t mix(size_t seed, size_t value) { return seed ^ (value + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2)); }

// The key of a call; false where the table cannot hold it (the Python path then decides): arguments
// of other types, tensors that are not plain 4-D strided torch.Tensors (subclasses, nested,
// symbolic sizes).
bool call_key(PyObject *q, PyObject *k, PyObject *v, PyObject *arguments, CallKey &key) {
    if (!plain_arguments(arguments)) {
        return false;
    }
    Py_hash_t arguments_hash = PyObject_Hash(arguments);
    if (arguments_hash == -1) {
        PyErr_Clear();
        return false;
    }
    size_t hash = static_cast<size_t>(arguments_hash);
    PyObject *given[] = {q, k, v};
    bool wants_grad = false;
    for (int i = 0; i < 3; ++i) {
        if (!THPVariable_CheckExact(given[i])) {
            return false;
        }
        at::Tensor const &t = THPVariable_Unpack(given[i]);
        if (t.is_nested() || t.layout() != at::kStrided || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
            t.dim() != 4) {
            return false;
        }
        TensorFacts &facts = key.tensors[i];
        for (int d = 0; d < 4; ++d) {
            facts.sizes[d]   = t.sizes()[d];
            facts.strides[d] = t.strides()[d];
            hash             = mix(mix(hash, facts.sizes[d]), facts.strides[d]);
        }
        facts.dtype        = static_cast<int>(t.scalar_type());
        facts.device_type  = static_cast<int>(t.device().type());
        facts.device_index = t.device().index();
        hash               = mix(mix(mix(hash, facts.dtype), facts.device_type), facts.device_index);
        wants_grad         = wants_grad || t.requires_grad();
    }
    key.training  = wants_grad && at::GradMode::is_enabled();
    key.capturing = THPVariable_Unpack(q).is_cuda() &&
                    c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
    key.hash      = mix(mix(hash, key.training), key.capturing);
    key.arguments = pybind11::reinterpret_borrow<pybind11::object>(arguments);
    return true;
}

struct CallTable {
    std::unordered_map<CallKey, c10::intrusive_ptr<LeanPlan>, CallKeyHash> plans;
    int64_t calls = 0;  // calls it ran (dispatch_info's "calls" and "fused_calls" add them)
};

CallTable &table() {
    static auto *calls = new CallTable();  // never destroyed: it holds Python objects past finalization
    return *calls;
}

// Whether a functorch transform (vmap, grad, ...) wraps this call (torch's own test of it).
bool functorch_active() {
    auto included = c10::impl::tls_local_dispatch_key_set().included_;
    return included.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
           included.has(c10::DispatchKey::FuncTorchDynamicLayerBackMode);
}

// The output of a call whose signature the table holds, or None (then attention() decides in Python).
pybind11::object table_call(pybind11::handle q, pybind11::handle k, pybind11::handle v, pybind11::handle arguments) {
    CallKey key;
    if (functorch_active() || !call_key(q.ptr(), k.ptr(), v.ptr(), arguments.ptr(), key)) {
        return pybind11::none();
    }
    auto &plans = table().plans;
    auto found  = plans.find(key);
    if (found == plans.end()) {
        return pybind11::none();
    }
    c10::intrusive_ptr<LeanPlan> plan = found->second;
    ++table().calls;
    PyObject *out =
        THPVariable_Wrap(call(plan, THPVariable_Unpack(q.ptr()), THPVariable_Unpack(k.ptr()), THPVariable_Unpack(v.ptr())));
    if (out == nullptr) {
        throw pybind11::error_already_set();
    }
    return pybind11::reinterpret_steal<pybind11::object>(out);
}

bool table_remember(pybind11::handle q, pybind11::handle k, pybind11::handle v, pybind11::handle arguments,
                    c10::intrusive_ptr<LeanPlan> plan) {
    CallKey key;
    if (!call_key(q.ptr(), k.ptr(), v.ptr(), arguments.ptr(), key)) {
        return false;
    }
    table().plans.insert_or_assign(std::move(key), std::move(plan));
    return true;
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
    m.def("set_argument_kinds", &set_argument_kinds,
          "The kinds of the leading arguments a call's key holds, in order (runtime/args.py TABLE_ARGUMENTS)");
    m.def("call", &table_call, "The output of a call whose signature the table holds, else None");
    m.def("remember", &table_remember, "File a LeanPlan under a call's signature (False: one it cannot hold)");
    m.def("forget", [] { table().plans.clear(); table().calls = 0; }, "Empty the table");
    m.def("calls", [] { return table().calls; }, "Calls the table ran");
    m.def("size", [] { return table().plans.size(); }, "Signatures the table holds");
}
