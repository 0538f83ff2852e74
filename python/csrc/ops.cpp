// SPDX-License-Identifier: Apache-2.0
//
// PyTorch bindings of xsoftmax: the operators' schemas and their CPU registration (the `omp`
// backend), the head handles (module functions), `build_info` and `release_cached_gradients` (the
// idle host gradients of gradient_pool.hpp). The operators' bodies are
// op_bodies.hpp, one per verb for every device; ops_cuda.cu registers them for CUDA tensors when the
// extension is built with its CUDA operators (XSOFTMAX_TORCH_WITH_CUDA).
//
// Operators (TORCH_LIBRARY(xsoftmax)); `head` is 0 for the full softmax or a handle made by one of
// the `create_*` functions of the Python module (a full softmax's score-cache budget, a tree, a
// sampler, a KNN configuration), `step`
// an optional int64 scalar tensor (the training step of the sampled and KNN heads):
//
//   loss(hidden, weight, bias?, targets, reduction, ignore_index, head, step?, sparse_grad, class_weight?) -> loss
//       reduction 0 none (loss: B values), 1 mean, 2 sum (loss: a scalar); class_weight: one float per
//       class (F.cross_entropy's weight), or None.
//   loss_fused(...same...) -> (loss, grad_hidden, grad_rows, grad_values, grad_bias)
//       the library's fused forward_backward with an upstream gradient of 1.
//   backward(...same but class_weight..., grad_output, class_weight?) -> (grad_hidden, grad_rows, grad_values, grad_bias)
//       the library's backward with the upstream gradient `grad_output` (a scalar or B values).
//   topk(hidden, weight, bias?, k, head, beam_width) -> (log_probs, classes, expansions)
//       expansions: B int64, a tree search's node expansions per row; -1 for heads without one.
//   loss_topk(hidden, weight, bias?, targets, reduction, ignore_index, head, k, class_weight?) -> (loss, log_probs, classes)
//       the full softmax's forward_topk: loss's value and topk's outputs from one pass over the
//       scores (not differentiable; a full softmax head only). Ignored rows: classes -1, log_probs -inf.
//
// Weight gradients: with sparse_grad = false, grad_values is the dense (rows x dim) gradient and
// grad_rows is empty; with sparse_grad = true, grad_rows holds the touched rows and grad_values
// their gradients (grad_bias likewise). All gradients are float32.
//
// The weights (and bias) are read and written in place: a head is a view of the tensor's memory.
// The library's exceptions become Python exceptions: out_of_range -> IndexError, invalid_argument
// (shape, non-finite, tree errors) -> ValueError, anything else -> RuntimeError; the message is
// the library's, which names the verb, the argument and the offending value.

#include "head_states.hpp"
#include "op_bodies.hpp"
#include "tensor_args.hpp"

#include <torch/extension.h>
#include <torch/library.h>

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/sampled_negatives.hpp>
#include <xsoftmax/selective_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using namespace xsoftmax_torch;

#if !defined(XSOFTMAX_TORCH_WITH_CUDA)
/// The CUDA dispatch key of a build without CUDA operators: say so, and how to get them, instead of
/// torch's "could not run ... with arguments from the 'CUDA' backend".
[[noreturn]] void no_cuda_operators(const char* op) {
  C10_THROW_ERROR(NotImplementedError,
                  c10::str("xsoftmax::", op, ": this build of xsoftmax has no CUDA operators (xsoftmax.build_info() ",
                           "says what was built); reinstall with a CUDA build of torch and nvcc on PATH or ",
                           "CUDA_HOME set (XSOFTMAX_WITH_CUDA=1 makes a failed CUDA build an error), or use CPU ",
                           "tensors"));
}
#endif

// ------------------------------------------------------------------------------------------------
// Handles (Python module functions; not traced)
// ------------------------------------------------------------------------------------------------

std::vector<index_t> to_index_vector(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == 1, "xsoftmax: ", name, " must be 1-D, got shape ", t.sizes());
  TORCH_CHECK_VALUE(!at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type()) &&
                        t.scalar_type() != at::kBool,
                    "xsoftmax: ", name, " must hold integers, got dtype ", t.scalar_type());
  const at::Tensor c = t.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<index_t>(p, p + c.numel());
}

/// A full softmax handle with this training-step layout (None: the head's automatic choice).
int64_t create_full(std::optional<int64_t> score_cache_bytes, std::optional<int64_t> row_block) {
  return guarded([&] {
    xs::full_softmax<xs::fp32, host_backend> check(1, 1);  // validate now (throw naming the value)
    if (score_cache_bytes) check.set_score_cache_bytes(*score_cache_bytes);
    if (row_block) check.set_row_block(*row_block);
    return register_state(std::make_shared<full_state>(score_cache_bytes, row_block));
  });
}

/// Sets the loss terms of a head handle (see `state::terms`): label smoothing, z-loss, a margin
/// (0 none, 1 ArcFace, 2 CosFace, with scale s and margin m), a soft cap and the gradient filter
/// (full softmax handles only). Checked here as the library checks them, so a module fails at
/// construction, not at its first step.
void set_loss_terms(int64_t head, double label_smoothing, double z_loss, int64_t margin, double margin_scale,
                    double margin_m, double softcap, double gradient_filter) {
  guarded([&] {
    TORCH_CHECK_VALUE(label_smoothing >= 0.0 && label_smoothing <= 1.0, "xsoftmax: label_smoothing = ",
                      label_smoothing, " must be in [0, 1]");
    TORCH_CHECK_VALUE(z_loss >= 0.0 && std::isfinite(z_loss), "xsoftmax: z_loss = ", z_loss,
                      " must be finite and >= 0");
    TORCH_CHECK_VALUE(margin >= 0 && margin <= 2, "xsoftmax: margin = ", margin, " must be 0 (none), 1 (ArcFace) or ",
                      "2 (CosFace)");
    TORCH_CHECK_VALUE(softcap >= 0.0 && std::isfinite(softcap), "xsoftmax: softcap = ", softcap,
                      " must be finite and >= 0");
    TORCH_CHECK_VALUE(softcap == 0.0 || margin == 0, "xsoftmax: softcap = ", softcap, " with a margin is not defined");
    TORCH_CHECK_VALUE(gradient_filter >= 0.0 && gradient_filter < 1.0, "xsoftmax: gradient_filter = ", gradient_filter,
                      " must be in [0, 1)");
    xs::loss_options t;
    t.label_smoothing = static_cast<float>(label_smoothing);
    t.z_loss = static_cast<float>(z_loss);
    t.margin.kind = margin == 1 ? xs::margin_kind::arcface : margin == 2 ? xs::margin_kind::cosface
                                                                         : xs::margin_kind::none;
    t.margin.scale = static_cast<float>(margin_scale);
    t.margin.m = static_cast<float>(margin_m);
    t.softcap = static_cast<float>(softcap);
    t.gradient_filter = static_cast<float>(gradient_filter);
    const std::shared_ptr<state> st = find_state(head, "set_loss_terms");
    TORCH_CHECK_VALUE(gradient_filter == 0.0 || dynamic_cast<full_state*>(st.get()) != nullptr,
                      "xsoftmax: gradient_filter = ", gradient_filter, " is defined for the full softmax only");
    TORCH_CHECK_VALUE(dynamic_cast<tree_state*>(st.get()) == nullptr || (label_smoothing == 0.0 && z_loss == 0.0 &&
                                                                         margin == 0 && softcap == 0.0),
                      "xsoftmax: label smoothing, z-loss, margins and soft-capping are not defined for the ",
                      "hierarchical softmax");
    std::lock_guard<std::mutex> lock(st->mu);
    st->terms = t;
    return 0;
  });
}

int64_t create_tree(const at::Tensor& parent, const c10::optional<at::Tensor>& leaf_class, int64_t num_classes,
                    bool sigmoid) {
  return guarded([&] {
    std::vector<index_t> p = to_index_vector(parent, "parent");
    tree_type tree;
    {
      pybind11::gil_scoped_release no_gil;
      tree = leaf_class.has_value() && leaf_class->defined()
                 ? tree_type::from_parents(std::move(p), to_index_vector(*leaf_class, "leaf_class"), num_classes)
                 : tree_type::from_parents(std::move(p), num_classes);
    }
    if (sigmoid)
      TORCH_CHECK_VALUE(tree.is_binary(), "xsoftmax: node='sigmoid' needs a binary tree (every internal node with ",
                        "exactly 2 children); this tree is not binary");
    return register_state(std::make_shared<tree_state>(std::move(tree), sigmoid));
  });
}

at::Tensor huffman_parents(const at::Tensor& counts, int64_t arity) {
  return guarded([&] {
    TORCH_CHECK_VALUE(counts.dim() == 1, "xsoftmax: huffman: counts must be 1-D, got shape ", counts.sizes());
    TORCH_CHECK_VALUE(arity >= 2 && arity <= std::numeric_limits<int>::max(), "xsoftmax: huffman: arity = ", arity,
                      " must be >= 2");
    const at::Tensor c = counts.to(at::kCPU).to(at::kDouble).contiguous();
    std::vector<double> v(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
    std::vector<index_t> p =
        xs::detail::huffman_parents(v, static_cast<int>(arity), "runtime_tree::huffman: ");
    at::Tensor out = at::empty({static_cast<int64_t>(p.size())}, at::TensorOptions().dtype(at::kLong));
    std::memcpy(out.data_ptr<int64_t>(), p.data(), p.size() * sizeof(int64_t));
    return out;
  });
}

/// The tree's layout arrays (see runtime_tree.hpp) and scalars.
pybind11::dict tree_arrays(int64_t handle) {
  const std::shared_ptr<state> st = find_state(handle, "tree_arrays");
  auto* t = dynamic_cast<tree_state*>(st.get());
  TORCH_CHECK_VALUE(t != nullptr, "xsoftmax: tree_arrays: head = ", handle, " is not a tree");
  auto tensor = [](const std::vector<index_t>& v) {
    at::Tensor out = at::empty({static_cast<int64_t>(v.size())}, at::TensorOptions().dtype(at::kLong));
    if (!v.empty()) std::memcpy(out.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
    return out;
  };
  pybind11::dict d;
  d["num_classes"] = t->tree.num_classes();
  d["num_rows"] = t->tree.num_rows();
  d["num_internal_nodes"] = t->tree.num_internal_nodes();
  d["height"] = t->tree.height();
  d["is_binary"] = t->tree.is_binary();
  d["sigmoid"] = t->sigmoid;
  d["weight_rows"] = t->sigmoid ? t->tree.num_rows() / 2 : t->tree.num_rows();
  d["path_offset"] = tensor(t->tree.path_offsets());
  d["path_row"] = tensor(t->tree.path_rows());
  d["leaf_rank"] = tensor(t->tree.leaf_ranks());
  d["row_parent"] = tensor(t->tree.row_parents());
  d["row_child"] = tensor(t->tree.row_children());
  d["block_offset"] = tensor(t->tree.block_offsets());
  return d;
}

int64_t create_sampled(int64_t num_classes, const std::string& distribution, const c10::optional<at::Tensor>& counts,
                       double power, int64_t num_sampled, bool unique, bool subtract_log_q, int64_t seed) {
  return guarded([&] {
    xs::sampling_options o;
    o.num_sampled = num_sampled;
    o.unique = unique;
    o.subtract_log_q = subtract_log_q;
    o.seed = static_cast<unsigned long long>(seed);
    if (distribution == "uniform")
      return register_state(std::make_shared<sampled_state>(xs::sampled_negatives::uniform(num_classes, o)));
    if (distribution == "log_uniform")
      return register_state(std::make_shared<sampled_state>(xs::sampled_negatives::log_uniform(num_classes, o)));
    TORCH_CHECK_VALUE(distribution == "counts", "xsoftmax: sampler = '", distribution,
                      "' must be 'uniform', 'log_uniform' or 'counts'");
    TORCH_CHECK_VALUE(counts.has_value() && counts->defined(), "xsoftmax: sampler = 'counts' needs counts");
    TORCH_CHECK_VALUE(counts->dim() == 1 && counts->size(0) == num_classes, "xsoftmax: counts has shape ",
                      counts->sizes(), ", expected [", num_classes, "]");
    const at::Tensor c = counts->to(at::kCPU).to(at::kDouble).contiguous();
    std::vector<double> v(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
    return register_state(std::make_shared<sampled_state>(xs::sampled_negatives::from_counts(v, o, power)));
  });
}

int64_t create_knn(int64_t k, const std::string& metric, const std::string& method, int64_t neighbors_used,
                   int64_t rebuild_every, int64_t ivf_lists, int64_t nprobe, int64_t refreshes_between_rebuilds,
                   int64_t refine_passes, int64_t refresh_passes, double refresh_moved) {
  return guarded([&] {
    xs::knn_options o;
    o.graph.k = k;
    TORCH_CHECK_VALUE(metric == "cosine" || metric == "inner_product", "xsoftmax: metric = '", metric,
                      "' must be 'cosine' or 'inner_product'");
    o.graph.metric = metric == "cosine" ? xs::similarity::cosine : xs::similarity::inner_product;
    TORCH_CHECK_VALUE(method == "exact" || method == "ivf" || method == "ivf_class_probes", "xsoftmax: method = '",
                      method, "' must be 'exact', 'ivf' or 'ivf_class_probes'");
    o.graph.method = method == "exact" ? xs::knn_build_method::exact
                     : method == "ivf" ? xs::knn_build_method::ivf
                                       : xs::knn_build_method::ivf_class_probes;
    if (ivf_lists > 0) o.graph.ivf.num_lists = ivf_lists;
    if (nprobe > 0) o.graph.nprobe = nprobe;
    o.neighbors_used = neighbors_used;
    o.rebuild_every = rebuild_every;
    o.refreshes_between_rebuilds = refreshes_between_rebuilds;
    o.graph.refine.build_passes = refine_passes;
    o.graph.refine.refresh_passes = refresh_passes;
    o.graph.refine.moved = refresh_moved;
    (void)xs::knn_selector(o);  // validates the options now (throws naming the value)
    return register_state(std::make_shared<knn_state>(o));
  });
}

/// Rebuilds a KNN head's graph now (from the weights it is attached to), if it has been used.
void knn_rebuild(int64_t handle) {
  const std::shared_ptr<state> st = find_state(handle, "knn_rebuild");
  TORCH_CHECK_VALUE(dynamic_cast<knn_state*>(st.get()) != nullptr, "xsoftmax: knn_rebuild: head = ", handle,
                    " is not a KNN head");
  std::lock_guard<std::mutex> lock(st->mu);
  if (!st->cache.rebuild) return;
  const c10::DeviceGuard on_device(c10::Device(static_cast<c10::DeviceType>(st->cache.key.device_type),
                                               static_cast<c10::DeviceIndex>(st->cache.key.device_index)));
  guarded([&] { st->cache.rebuild(); });
}

bool has_cblas() { return xs::detail::host::has_cblas(); }

/// What this build holds: CPU operators (always), CUDA operators, the BLAS of the CPU operators
/// (xsoftmax.build_info() adds the CUDA architectures setup.py compiled for).
pybind11::dict build_info() {
  pybind11::dict d;
  d["cpu"] = true;
#if defined(XSOFTMAX_TORCH_WITH_CUDA)
  d["cuda"] = true;
#else
  d["cuda"] = false;
#endif
  d["blas"] = xs::detail::host::has_cblas() ? std::string("cblas") : std::string("built-in blocked GEMM");
  return d;
}

}  // namespace

TORCH_LIBRARY(xsoftmax, m) {
  m.def("loss(Tensor hidden, Tensor weight, Tensor? bias, Tensor targets, int reduction, int ignore_index, "
        "int head, Tensor? step, bool sparse_grad, Tensor? class_weight=None) -> Tensor");
  m.def("loss_fused(Tensor hidden, Tensor weight, Tensor? bias, Tensor targets, int reduction, int ignore_index, "
        "int head, Tensor? step, bool sparse_grad, Tensor? class_weight=None) -> (Tensor, Tensor, Tensor, Tensor, "
        "Tensor)");
  m.def("backward(Tensor hidden, Tensor weight, Tensor? bias, Tensor targets, int reduction, int ignore_index, "
        "int head, Tensor? step, bool sparse_grad, Tensor grad_output, Tensor? class_weight=None) -> (Tensor, Tensor, "
        "Tensor, Tensor)");
  m.def("topk(Tensor hidden, Tensor weight, Tensor? bias, int k, int head, int beam_width) -> (Tensor, Tensor, Tensor)");
  m.def("loss_topk(Tensor hidden, Tensor weight, Tensor? bias, Tensor targets, int reduction, int ignore_index, "
        "int head, int k, Tensor? class_weight=None) -> (Tensor, Tensor, Tensor)");
}

// CPU tensors: the bodies of op_bodies.hpp on the `omp` backend (CUDA tensors: ops_cuda.cu).
TORCH_LIBRARY_IMPL(xsoftmax, CPU, m) {
  m.impl("loss", &loss_op<host_backend>);
  m.impl("loss_fused", &loss_fused_op<host_backend>);
  m.impl("backward", &backward_op<host_backend>);
  m.impl("topk", &topk_op<host_backend>);
  m.impl("loss_topk", &loss_topk_op<host_backend>);
}

#if !defined(XSOFTMAX_TORCH_WITH_CUDA)
TORCH_LIBRARY_IMPL(xsoftmax, CUDA, m) {
  using optional_tensor = c10::optional<at::Tensor>;
  m.impl("loss", [](const at::Tensor&, const at::Tensor&, const optional_tensor&, const at::Tensor&, int64_t, int64_t,
                    int64_t, const optional_tensor&, bool, const optional_tensor&) -> at::Tensor {
    no_cuda_operators("loss");
  });
  m.impl("loss_fused",
         [](const at::Tensor&, const at::Tensor&, const optional_tensor&, const at::Tensor&, int64_t, int64_t, int64_t,
            const optional_tensor&, bool,
            const optional_tensor&) -> std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> {
           no_cuda_operators("loss_fused");
         });
  m.impl("backward",
         [](const at::Tensor&, const at::Tensor&, const optional_tensor&, const at::Tensor&, int64_t, int64_t, int64_t,
            const optional_tensor&, bool, const at::Tensor&,
            const optional_tensor&) -> std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> {
           no_cuda_operators("backward");
         });
  m.impl("topk", [](const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&, int64_t, int64_t,
                    int64_t) -> std::tuple<at::Tensor, at::Tensor, at::Tensor> { no_cuda_operators("topk"); });
  m.impl("loss_topk",
         [](const at::Tensor&, const at::Tensor&, const optional_tensor&, const at::Tensor&, int64_t, int64_t, int64_t,
            int64_t, const optional_tensor&) -> std::tuple<at::Tensor, at::Tensor, at::Tensor> {
           no_cuda_operators("loss_topk");
         });
}
#endif

namespace xsoftmax_torch {
/// The torch.distributed operators (sharded_ops.cpp).
void register_sharded_ops(pybind11::module& m);
/// Label trees from class vectors (tree_builders.cpp).
void register_tree_builders(pybind11::module& m);
}  // namespace xsoftmax_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "xsoftmax PyTorch operators (CPU, and CUDA when built with them) and head handles";
  m.def("create_full", &create_full, pybind11::arg("score_cache_bytes"), pybind11::arg("row_block"));
  m.def("default_score_cache_bytes", [] { return xs::full_softmax<xs::fp32, host_backend>::default_score_cache_bytes; });
  m.def("create_tree", &create_tree, pybind11::arg("parent"), pybind11::arg("leaf_class"),
        pybind11::arg("num_classes"), pybind11::arg("sigmoid"));
  m.def("huffman_parents", &huffman_parents, pybind11::arg("counts"), pybind11::arg("arity"));
  m.def("tree_arrays", &tree_arrays, pybind11::arg("head"));
  m.def("create_sampled", &create_sampled, pybind11::arg("num_classes"), pybind11::arg("distribution"),
        pybind11::arg("counts"), pybind11::arg("power"), pybind11::arg("num_sampled"), pybind11::arg("unique"),
        pybind11::arg("subtract_log_q"), pybind11::arg("seed"));
  m.def("create_knn", &create_knn, pybind11::arg("k"), pybind11::arg("metric"), pybind11::arg("method"),
        pybind11::arg("neighbors_used"), pybind11::arg("rebuild_every"), pybind11::arg("ivf_lists"),
        pybind11::arg("nprobe"), pybind11::arg("refreshes_between_rebuilds"), pybind11::arg("refine_passes"),
        pybind11::arg("refresh_passes"), pybind11::arg("refresh_moved"));
  m.def("knn_rebuild", &knn_rebuild, pybind11::arg("head"));
  m.def("release", &release_state, pybind11::arg("head"));
  m.def("set_loss_terms", &set_loss_terms, pybind11::arg("head"), pybind11::arg("label_smoothing"),
        pybind11::arg("z_loss"), pybind11::arg("margin"), pybind11::arg("margin_scale"), pybind11::arg("margin_m"),
        pybind11::arg("softcap"), pybind11::arg("gradient_filter"));
  m.def("release_cached_gradients", [] { return xsoftmax_torch::release_idle_gradients<host_backend>(); });
  m.def("has_cblas", &has_cblas);
  m.def("build_info", &build_info);
  xsoftmax_torch::register_sharded_ops(m);
  xsoftmax_torch::register_tree_builders(m);
}
