// SPDX-License-Identifier: Apache-2.0
//
// PyTorch bindings of xsoftmax: one translation unit (compile time), CPU tensors, the `omp` backend.
//
// Operators (TORCH_LIBRARY(xsoftmax)); `head` is 0 for the full softmax or a handle made by one of
// the `create_*` functions of the Python module (a full softmax's score-cache budget, a tree, a
// sampler, a KNN configuration), `step`
// an optional int64 scalar tensor (the training step of the sampled and KNN heads):
//
//   loss(hidden, weight, bias?, targets, reduction, ignore_index, head, step?, sparse_grad) -> loss
//       reduction 0 none (loss: B values), 1 mean, 2 sum (loss: a scalar).
//   loss_fused(...same...) -> (loss, grad_hidden, grad_rows, grad_values, grad_bias)
//       the library's fused forward_backward with an upstream gradient of 1.
//   backward(...same..., grad_output) -> (grad_hidden, grad_rows, grad_values, grad_bias)
//       the library's backward with the upstream gradient `grad_output` (a scalar or B values).
//   topk(hidden, weight, bias?, k, head, beam_width) -> (log_probs, classes)
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

// ------------------------------------------------------------------------------------------------
// Dispatch: weight dtype -> precision, handle -> head type
// ------------------------------------------------------------------------------------------------


/// Calls `f(head)` with the head `handle` names, attached to `weight` / `bias`. Selective heads
/// (sampled, KNN) only when `Selective`; the others are full softmax (handle 0) and hierarchical.
template <bool Selective, class F>
void with_head(int64_t handle, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
               const c10::optional<at::Tensor>& step, const char* op, F&& f) {
  dispatch_precision(weight.scalar_type(), op, [&](auto precision) {
    using P = decltype(precision);
    using S = typename P::storage_type;
    const xs::matrix_view<S> w = weight_view<S>(weight);
    S* const b = bias_pointer<S>(bias);
    if (handle == 0) {
      xs::full_softmax<P, backend> head(w, b);
      f(head);
      return;
    }
    const std::shared_ptr<state> st = find_state(handle, op);
    if (auto* full = dynamic_cast<full_state*>(st.get())) {
      xs::full_softmax<P, backend> head(w, b);
      head.set_score_cache_bytes(full->score_cache_bytes);
      head.set_row_block(full->row_block);
      f(head);
      return;
    }
    std::lock_guard<std::mutex> lock(st->mu);
    const head_key key = key_of(weight, bias);
    if (auto* t = dynamic_cast<tree_state*>(st.get())) {
      if (t->sigmoid) {
        using head_t = xs::hierarchical_softmax<tree_type, P, backend, xs::sigmoid_nodes>;
        f(st->cache.get<head_t>(key, [&] { return new head_t(t->tree, w, b); }));
      } else {
        using head_t = xs::hierarchical_softmax<tree_type, P, backend, xs::softmax_nodes>;
        f(st->cache.get<head_t>(key, [&] { return new head_t(t->tree, w, b); }));
      }
      return;
    }
    if constexpr (Selective) {
      if (auto* s = dynamic_cast<sampled_state*>(st.get())) {
        using head_t = xs::selective_softmax<xs::sampled_negatives, P, backend>;
        head_t& head = st->cache.get<head_t>(key, [&] { return new head_t(s->sampler, w, b); });
        head.selector().set_step(static_cast<unsigned long long>(step_value(step)));
        f(head);
        return;
      }
      if (auto* k = dynamic_cast<knn_state*>(st.get())) {
        using head_t = xs::knn_softmax<P, backend>;
        const int64_t now = step_value(step);
        head_t& head = st->cache.get<head_t>(key, [&] { return new head_t(w, k->options, b); });
        if (st->cache.fresh) {
          k->built_step = now;
        } else if (k->options.rebuild_every > 0 && now - k->built_step >= k->options.rebuild_every) {
          head.rebuild_graph();  // from the current weights (after the optimiser's updates)
          k->built_step = now;
        }
        f(head);
        return;
      }
      TORCH_CHECK_VALUE(false, "xsoftmax::", op, ": head = ", handle, " is not a head handle");
    } else {
      TORCH_CHECK_VALUE(false, "xsoftmax::", op, ": head = ", handle,
                        " is a sampled or KNN head; this operator takes a full (0) or hierarchical head");
    }
  });
}


/// The call's options with the loss terms of handle `head` (none for handle 0).
xs::loss_options with_loss_terms(xs::loss_options o, int64_t head, const char* op) {
  if (head == 0) return o;
  const xs::loss_options& t = find_state(head, op)->terms;
  o.label_smoothing = t.label_smoothing;
  o.z_loss = t.z_loss;
  o.margin = t.margin;
  return o;
}

// ------------------------------------------------------------------------------------------------
// Operators
// ------------------------------------------------------------------------------------------------


at::Tensor loss_op(const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                   const at::Tensor& targets, int64_t reduction, int64_t ignore_index, int64_t head,
                   const c10::optional<at::Tensor>& step, bool /*sparse_grad: used by the backward*/) {
  return guarded([&] {
    const char* op = "loss";
    const loss_args a = prepare(hidden, weight, bias, targets, reduction, ignore_index, op);
    const xs::loss_options options = with_loss_terms(a.options, head, op);
    const int64_t b = a.hidden.size(0);
    at::Tensor per_sample = at::empty({b}, at::TensorOptions().dtype(at::kFloat));
    float loss = 0;
    with_head<true>(head, weight, bias, step, op, [&](auto& h) {
      loss = h.forward(hidden_view(a.hidden), targets_view(a.targets), options,
                       xs::vector_view<float>(per_sample.data_ptr<float>(), b));
    });
    if (a.options.reduce == xs::reduction::none) return per_sample;
    return at::scalar_tensor(mean_of_nothing_is_nan(loss, a), at::TensorOptions().dtype(at::kFloat));
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> loss_fused_op(
    const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t reduction, int64_t ignore_index, int64_t head,
    const c10::optional<at::Tensor>& step, bool sparse_grad) {
  return guarded([&] {
    const char* op = "loss_fused";
    const loss_args a = prepare(hidden, weight, bias, targets, reduction, ignore_index, op);
    TORCH_CHECK_VALUE(a.options.reduce != xs::reduction::none, "xsoftmax::", op,
                      ": reduction none needs the upstream gradient; use loss + backward");
    const int64_t b = a.hidden.size(0), d = a.hidden.size(1);
    at::Tensor grad_hidden = at::empty({b, d}, at::TensorOptions().dtype(at::kFloat));
    auto g = std::make_shared<gradient>();
    float loss = 0;
    const xs::loss_options options = with_loss_terms(a.options, head, op);
    with_head<true>(head, weight, bias, step, op, [&](auto& h) {
      loss = h.forward_backward(hidden_view(a.hidden), targets_view(a.targets),
                                xs::matrix_view<float>(grad_hidden.data_ptr<float>(), b, d), *g, options);
    });
    const bool has_bias = bias.has_value() && bias->defined();
    auto [rows, values, gbias] = gradient_tensors(g, weight.size(0), weight.size(1), has_bias, sparse_grad);
    return std::make_tuple(at::scalar_tensor(mean_of_nothing_is_nan(loss, a), at::TensorOptions().dtype(at::kFloat)),
                           grad_hidden, rows,
                           values, gbias);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_op(
    const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t reduction, int64_t ignore_index, int64_t head,
    const c10::optional<at::Tensor>& step, bool sparse_grad, const at::Tensor& grad_output) {
  return guarded([&] {
    const char* op = "backward";
    const loss_args a = prepare(hidden, weight, bias, targets, reduction, ignore_index, op);
    check_cpu(grad_output, op, "grad_output");
    const at::Tensor go = grad_output.to(at::kFloat).contiguous();
    const int64_t b = a.hidden.size(0), d = a.hidden.size(1);
    at::Tensor grad_hidden = at::empty({b, d}, at::TensorOptions().dtype(at::kFloat));
    auto g = std::make_shared<gradient>();
    const xs::loss_options options = with_loss_terms(a.options, head, op);
    with_head<true>(head, weight, bias, step, op, [&](auto& h) {
      h.backward(hidden_view(a.hidden), targets_view(a.targets),
                 xs::matrix_view<float>(grad_hidden.data_ptr<float>(), b, d), *g, options,
                 xs::vector_view<const float>(go.data_ptr<float>(), go.numel()));
    });
    const bool has_bias = bias.has_value() && bias->defined();
    auto [rows, values, gbias] = gradient_tensors(g, weight.size(0), weight.size(1), has_bias, sparse_grad);
    return std::make_tuple(grad_hidden, rows, values, gbias);
  });
}

std::tuple<at::Tensor, at::Tensor> topk_op(const at::Tensor& hidden, const at::Tensor& weight,
                                           const c10::optional<at::Tensor>& bias, int64_t k, int64_t head,
                                           int64_t beam_width) {
  return guarded([&] {
    const char* op = "topk";
    check_weight(weight, bias, op);
    const at::Tensor h = prepare_hidden(hidden, op);
    const int64_t b = h.size(0);
    TORCH_CHECK_VALUE(k >= 1, "xsoftmax::topk: k = ", k, " must be >= 1");
    TORCH_CHECK_VALUE(beam_width >= 0, "xsoftmax::topk: beam_width = ", beam_width, " must be >= 0");
    at::Tensor log_probs = at::empty({b, k}, at::TensorOptions().dtype(at::kFloat));
    at::Tensor classes = at::empty({b, k}, at::TensorOptions().dtype(at::kLong));
    with_head<false>(head, weight, bias, c10::nullopt, op, [&](auto& hd) {
      using head_t = std::decay_t<decltype(hd)>;
      const xs::matrix_view<index_t> cv(classes.data_ptr<int64_t>(), b, k);
      const xs::matrix_view<float> lv(log_probs.data_ptr<float>(), b, k);
      if constexpr (std::is_same_v<typename head_t::search_options_type, xs::search_options>) {
        xs::search_options so;
        so.beam_width = beam_width;
        hd.topk(hidden_view(h), k, cv, lv, so);
      } else {
        hd.topk(hidden_view(h), k, cv, lv);
      }
    });
    return std::make_tuple(log_probs, classes);
  });
}

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

int64_t create_full(int64_t score_cache_bytes, int64_t row_block) {
  return guarded([&] {
    xs::full_softmax<xs::fp32, backend> check(1, 1);
    check.set_score_cache_bytes(score_cache_bytes);  // validate now (throw naming the value)
    check.set_row_block(row_block);
    return register_state(std::make_shared<full_state>(score_cache_bytes, row_block));
  });
}

/// Sets the loss terms of a head handle (see `state::terms`): label smoothing, z-loss and a margin
/// (0 none, 1 ArcFace, 2 CosFace, with scale s and margin m). Checked here as the library checks
/// them, so a module fails at construction, not at its first step.
void set_loss_terms(int64_t head, double label_smoothing, double z_loss, int64_t margin, double margin_scale,
                    double margin_m) {
  guarded([&] {
    TORCH_CHECK_VALUE(label_smoothing >= 0.0 && label_smoothing <= 1.0, "xsoftmax: label_smoothing = ",
                      label_smoothing, " must be in [0, 1]");
    TORCH_CHECK_VALUE(z_loss >= 0.0 && std::isfinite(z_loss), "xsoftmax: z_loss = ", z_loss,
                      " must be finite and >= 0");
    TORCH_CHECK_VALUE(margin >= 0 && margin <= 2, "xsoftmax: margin = ", margin, " must be 0 (none), 1 (ArcFace) or ",
                      "2 (CosFace)");
    xs::loss_options t;
    t.label_smoothing = static_cast<float>(label_smoothing);
    t.z_loss = static_cast<float>(z_loss);
    t.margin.kind = margin == 1 ? xs::margin_kind::arcface : margin == 2 ? xs::margin_kind::cosface
                                                                         : xs::margin_kind::none;
    t.margin.scale = static_cast<float>(margin_scale);
    t.margin.m = static_cast<float>(margin_m);
    const std::shared_ptr<state> st = find_state(head, "set_loss_terms");
    TORCH_CHECK_VALUE(dynamic_cast<tree_state*>(st.get()) == nullptr || (label_smoothing == 0.0 && z_loss == 0.0 &&
                                                                         margin == 0),
                      "xsoftmax: label smoothing, z-loss and margins are not defined for the hierarchical softmax");
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
                   int64_t rebuild_every, int64_t ivf_lists, int64_t nprobe) {
  return guarded([&] {
    xs::knn_options o;
    o.graph.k = k;
    TORCH_CHECK_VALUE(metric == "cosine" || metric == "inner_product", "xsoftmax: metric = '", metric,
                      "' must be 'cosine' or 'inner_product'");
    o.graph.metric = metric == "cosine" ? xs::similarity::cosine : xs::similarity::inner_product;
    TORCH_CHECK_VALUE(method == "exact" || method == "ivf", "xsoftmax: method = '", method,
                      "' must be 'exact' or 'ivf'");
    o.graph.method = method == "exact" ? xs::knn_build_method::exact : xs::knn_build_method::ivf;
    if (ivf_lists > 0) o.graph.ivf.num_lists = ivf_lists;
    if (nprobe > 0) o.graph.nprobe = nprobe;
    o.neighbors_used = neighbors_used;
    o.rebuild_every = rebuild_every;
    (void)xs::knn_selector(o);  // validates the options now (throws naming the value)
    return register_state(std::make_shared<knn_state>(o));
  });
}

/// Rebuilds a KNN head's graph now (from the weights it is attached to), if it has been used.
void knn_rebuild(int64_t handle) {
  const std::shared_ptr<state> st = find_state(handle, "knn_rebuild");
  auto* k = dynamic_cast<knn_state*>(st.get());
  TORCH_CHECK_VALUE(k != nullptr, "xsoftmax: knn_rebuild: head = ", handle, " is not a KNN head");
  std::lock_guard<std::mutex> lock(st->mu);
  if (!st->cache.head) return;
  guarded([&] {
    dispatch_precision(static_cast<at::ScalarType>(st->cache.key.dtype), "knn_rebuild", [&](auto precision) {
      using head_t = xs::knn_softmax<decltype(precision), backend>;
      static_cast<head_t*>(st->cache.head.get())->rebuild_graph();
    });
  });
}

bool has_cblas() { return xs::detail::host::has_cblas(); }

}  // namespace

TORCH_LIBRARY(xsoftmax, m) {
  m.def("loss(Tensor hidden, Tensor weight, Tensor? bias, Tensor targets, int reduction, int ignore_index, "
        "int head, Tensor? step, bool sparse_grad) -> Tensor");
  m.def("loss_fused(Tensor hidden, Tensor weight, Tensor? bias, Tensor targets, int reduction, int ignore_index, "
        "int head, Tensor? step, bool sparse_grad) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("backward(Tensor hidden, Tensor weight, Tensor? bias, Tensor targets, int reduction, int ignore_index, "
        "int head, Tensor? step, bool sparse_grad, Tensor grad_output) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("topk(Tensor hidden, Tensor weight, Tensor? bias, int k, int head, int beam_width) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(xsoftmax, CPU, m) {
  m.impl("loss", &loss_op);
  m.impl("loss_fused", &loss_fused_op);
  m.impl("backward", &backward_op);
  m.impl("topk", &topk_op);
}

namespace xsoftmax_torch {
/// The torch.distributed operators (sharded_ops.cpp).
void register_sharded_ops(pybind11::module& m);
}  // namespace xsoftmax_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "xsoftmax PyTorch operators (CPU) and head handles";
  m.def("create_full", &create_full, pybind11::arg("score_cache_bytes"), pybind11::arg("row_block"));
  m.def("default_score_cache_bytes", [] { return xs::full_softmax<xs::fp32, backend>::default_score_cache_bytes; });
  m.def("create_tree", &create_tree, pybind11::arg("parent"), pybind11::arg("leaf_class"),
        pybind11::arg("num_classes"), pybind11::arg("sigmoid"));
  m.def("huffman_parents", &huffman_parents, pybind11::arg("counts"), pybind11::arg("arity"));
  m.def("tree_arrays", &tree_arrays, pybind11::arg("head"));
  m.def("create_sampled", &create_sampled, pybind11::arg("num_classes"), pybind11::arg("distribution"),
        pybind11::arg("counts"), pybind11::arg("power"), pybind11::arg("num_sampled"), pybind11::arg("unique"),
        pybind11::arg("subtract_log_q"), pybind11::arg("seed"));
  m.def("create_knn", &create_knn, pybind11::arg("k"), pybind11::arg("metric"), pybind11::arg("method"),
        pybind11::arg("neighbors_used"), pybind11::arg("rebuild_every"), pybind11::arg("ivf_lists"),
        pybind11::arg("nprobe"));
  m.def("knn_rebuild", &knn_rebuild, pybind11::arg("head"));
  m.def("release", &release_state, pybind11::arg("head"));
  m.def("set_loss_terms", &set_loss_terms, pybind11::arg("head"), pybind11::arg("label_smoothing"),
        pybind11::arg("z_loss"), pybind11::arg("margin"), pybind11::arg("margin_scale"), pybind11::arg("margin_m"));
  m.def("has_cblas", &has_cblas);
  xsoftmax_torch::register_sharded_ops(m);
}
