// SPDX-License-Identifier: Apache-2.0
#pragma once
// The body of every operator of the PyTorch bindings (schemas in ops.cpp), written once for every
// device: `loss_op<Backend>`, `loss_fused_op`, `backward_op`, `topk_op`, `loss_topk_op`, templates on
// the library's backend, instantiated for CPU tensors (`omp`, ops.cpp) and for CUDA tensors
// (`cuda`, ops_cuda.cu, when the extension is built with its CUDA operators). What differs per
// device is only `torch_backend<Backend>` (specialised beside each instantiation): the resources a
// head runs with (on CUDA: torch's current stream, caching allocator and cuBLAS handle).
//
// Every body: checks its tensors (all on the weight's device), makes the device current, picks the
// head the handle names (built over the weight tensor, cached per handle), runs the library's
// `_async` verb (on CUDA queued on torch's stream: no wait at the end; on CPU done on return), and
// returns tensors on the weight's device. The loss stays on the device.

#include "gradient_pool.hpp"
#include "head_states.hpp"
#include "tensor_args.hpp"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/sampled_negatives.hpp>
#include <xsoftmax/selective_softmax.hpp>

#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>

namespace xsoftmax_torch {

/// What a head on `Backend` runs with, from torch's state of the calling thread:
///   static xs::backend_resources<Backend> resources();   // for a head built now
///   static void refresh(const xs::backend_resources<Backend>&);  // before each call of a cached head
///   static const void* stream();                          // what a cached head is keyed on
template <class Backend>
struct torch_backend;

template <>
struct torch_backend<xs::omp> {
  static xs::backend_resources<xs::omp> resources() { return {}; }
  static void refresh(const xs::backend_resources<xs::omp>&) {}
  static const void* stream() { return nullptr; }
};

/// Calls `f(head)` with the head `handle` names, attached to `weight` / `bias`, on `Backend`.
/// Selective heads (sampled, KNN) only when `Selective`; the others are full softmax (handle 0) and
/// hierarchical. `f` also learns whether the head produces every weight row in order (the full
/// softmax: its gradient values are the dense gradient).
template <class Backend, bool Selective, class F>
void with_head(int64_t handle, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
               const c10::optional<at::Tensor>& step, const char* op, F&& f) {
  using device = torch_backend<Backend>;
  dispatch_precision(weight.scalar_type(), op, [&](auto precision) {
    using P = decltype(precision);
    using S = typename P::storage_type;
    const xs::matrix_view<S> w = weight_view<S>(weight);
    S* const b = bias_pointer<S>(bias);
    if (handle == 0) {
      xs::full_softmax<P, Backend> head(w, b, device::resources());
      f(head, true);
      return;
    }
    const std::shared_ptr<state> st = find_state(handle, op);
    if (auto* full = dynamic_cast<full_state*>(st.get())) {
      xs::full_softmax<P, Backend> head(w, b, device::resources());
      if (full->score_cache_bytes) head.set_score_cache_bytes(*full->score_cache_bytes);
      if (full->row_block) head.set_row_block(*full->row_block);
      f(head, true);
      return;
    }
    std::lock_guard<std::mutex> lock(st->mu);
    const head_key key = key_of(weight, bias, device::stream());
    // A cached head, built on first use and whenever the key changes; torch's per-call state (the
    // CUDA cuBLAS handle of this thread) refreshed before every call.
    auto cached = [&](auto make) -> auto& {
      using head_t = std::remove_pointer_t<decltype(make())>;
      head_t& h = st->cache.get<head_t>(key, make);
      device::refresh(h.resources());
      return h;
    };
    if (auto* t = dynamic_cast<tree_state*>(st.get())) {
      if (t->sigmoid) {
        using head_t = xs::hierarchical_softmax<tree_type, P, Backend, xs::sigmoid_nodes>;
        f(cached([&] { return new head_t(t->tree, w, b, device::resources()); }), false);
      } else {
        using head_t = xs::hierarchical_softmax<tree_type, P, Backend, xs::softmax_nodes>;
        f(cached([&] { return new head_t(t->tree, w, b, device::resources()); }), false);
      }
      return;
    }
    if constexpr (Selective) {
      if (auto* s = dynamic_cast<sampled_state*>(st.get())) {
        using head_t = xs::selective_softmax<xs::sampled_negatives, P, Backend>;
        head_t& head = cached([&] { return new head_t(s->sampler, w, b, device::resources()); });
        head.selector().set_step(static_cast<unsigned long long>(step_value(step)));
        f(head, false);
        return;
      }
      if (auto* k = dynamic_cast<knn_state*>(st.get())) {
        using head_t = xs::knn_softmax<P, Backend>;
        const int64_t now = step_value(step);
        head_t& head = cached([&] { return new head_t(w, k->options, b, device::resources()); });
        if (st->cache.fresh) {
          k->built_step = now;
          st->cache.rebuild = [&head] { head.rebuild_graph(); };
        } else if (k->options.rebuild_every > 0 && now - k->built_step >= k->options.rebuild_every) {
          // From the current weights (after the optimiser's updates): a refresh between rebuilds
          // on the schedule of `refreshes_between_rebuilds`, else a rebuild.
          if (head.selector().next_update_refreshes()) {
            head.refresh_graph();
          } else {
            head.rebuild_graph();
          }
          k->built_step = now;
        }
        f(head, false);
        return;
      }
      TORCH_CHECK_VALUE(false, "xsoftmax::", op, ": head = ", handle, " is not a head handle");
    } else {
      TORCH_CHECK_VALUE(false, "xsoftmax::", op, ": head = ", handle,
                        " is a sampled or KNN head; this operator takes a full (0) or hierarchical head");
    }
  });
}

/// The call's options with the loss terms of handle `head` (none for handle 0) and the class
/// weights `class_weight` (a float32 tensor on the weight's device, or undefined), which must stay
/// alive for the call.
inline xs::loss_options with_loss_terms(xs::loss_options o, int64_t head, const at::Tensor& class_weight,
                                        const char* op) {
  if (class_weight.defined()) o.class_weight = {class_weight.data_ptr<float>(), class_weight.numel()};
  if (head == 0) return o;
  const xs::loss_options& t = find_state(head, op)->terms;
  o.label_smoothing = t.label_smoothing;
  o.z_loss = t.z_loss;
  o.margin = t.margin;
  o.softcap = t.softcap;
  o.gradient_filter = t.gradient_filter;
  return o;
}

/// class_weight: None, or a 1-D tensor on the weight's device, as float32 (the library checks its
/// size and values).
inline at::Tensor prepare_class_weight(const c10::optional<at::Tensor>& class_weight, const at::Tensor& weight,
                                       const char* op) {
  if (!class_weight.has_value() || !class_weight->defined()) return {};
  check_same_device(*class_weight, weight, op, "class_weight");
  TORCH_CHECK_VALUE(class_weight->dim() == 1, "xsoftmax::", op, ": class_weight must be 1-D (one weight per class), ",
                    "got shape ", class_weight->sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(class_weight->scalar_type()), "xsoftmax::", op, ": class_weight.dtype = ",
                    class_weight->scalar_type(), " must be a floating-point type");
  return class_weight->to(at::kFloat).contiguous();
}

inline at::TensorOptions float_on(const at::Tensor& weight) {
  return at::TensorOptions().dtype(at::kFloat).device(weight.device());
}

inline xs::vector_view<float> vector_of(at::Tensor& t) { return {t.data_ptr<float>(), t.numel()}; }

template <class Head>
struct is_full_softmax : std::false_type {};
template <class P, class B>
struct is_full_softmax<xs::full_softmax<P, B>> : std::true_type {};

/// Where a full softmax's dense weight gradient goes: straight into a tensor of the weight's dtype
/// (the library's `dense_gradient`: no fp32 N x d buffer beside it, no conversion pass, memory from
/// torch's allocator), on CUDA always and on CPU for bf16 / fp16 weights. fp32 weights on CPU keep
/// the pooled gradient buffers (gradient_pool.hpp: a fresh N x d tensor a step costs page faults).
struct dense_weight_gradient {
  const at::Tensor& weight;
  bool has_bias, wanted;
  at::Tensor weights, bias;  // once written: (N x d, weight's dtype), (N or 0, float32)

  dense_weight_gradient(const at::Tensor& w, bool with_bias, bool sparse_grad)
      : weight(w), has_bias(with_bias), wanted(!sparse_grad && (w.is_cuda() || w.scalar_type() != at::kFloat)) {}
  [[nodiscard]] bool written() const { return weights.defined(); }
  /// The tensors, made now (only for a full softmax head: no other head's step holds them), as the
  /// library's view of storage type S.
  template <class S>
  [[nodiscard]] xs::dense_gradient<S> make() {
    weights = at::empty({weight.size(0), weight.size(1)}, weight.options().memory_format(at::MemoryFormat::Contiguous));
    bias = at::empty({has_bias ? weight.size(0) : 0}, at::TensorOptions().dtype(at::kFloat).device(weight.device()));
    return {xs::matrix_view<S>(reinterpret_cast<S*>(weights.data_ptr()), weights.size(0), weights.size(1)),
            xs::vector_view<float>(bias.numel() ? bias.data_ptr<float>() : nullptr, bias.numel())};
  }
};

inline xs::matrix_view<float> matrix_of(at::Tensor& t) { return {t.data_ptr<float>(), t.size(0), t.size(1)}; }

template <class Backend>
at::Tensor loss_op(const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                     const at::Tensor& targets, int64_t reduction, int64_t ignore_index, int64_t head,
                     const c10::optional<at::Tensor>& step, bool /*sparse_grad: used by the backward*/,
                     const c10::optional<at::Tensor>& class_weight) {
  return guarded([&] {
    const char* op = "loss";
    const loss_args a = prepare(hidden, weight, bias, targets, reduction, ignore_index, op);
    const at::Tensor cw = prepare_class_weight(class_weight, weight, op);
    const c10::DeviceGuard on_device(weight.device());
    const xs::loss_options options = with_loss_terms(a.options, head, cw, op);
    at::Tensor per_sample = at::empty({a.hidden.size(0)}, float_on(weight));
    at::Tensor loss = at::empty({}, float_on(weight));
    with_head<Backend, true>(head, weight, bias, step, op, [&](auto& h, bool) {
      h.forward_async(hidden_view(a.hidden), targets_view(a.targets), vector_of(loss), options,
                      vector_of(per_sample));
    });
    if (a.options.reduce == xs::reduction::none) return per_sample;
    return nan_if_nothing_counts(loss, a, cw);
  });
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> loss_fused_op(
    const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t reduction, int64_t ignore_index, int64_t head,
    const c10::optional<at::Tensor>& step, bool sparse_grad, const c10::optional<at::Tensor>& class_weight) {
  return guarded([&] {
    const char* op = "loss_fused";
    const loss_args a = prepare(hidden, weight, bias, targets, reduction, ignore_index, op);
    TORCH_CHECK_VALUE(a.options.reduce != xs::reduction::none, "xsoftmax::", op,
                      ": reduction none needs the upstream gradient; use loss + backward");
    const at::Tensor cw = prepare_class_weight(class_weight, weight, op);
    const c10::DeviceGuard on_device(weight.device());
    const xs::loss_options options = with_loss_terms(a.options, head, cw, op);
    at::Tensor grad_hidden = at::empty({a.hidden.size(0), a.hidden.size(1)}, float_on(weight));
    at::Tensor loss = at::empty({}, float_on(weight));
    const bool has_bias = bias.has_value() && bias->defined();
    dense_weight_gradient dense(weight, has_bias, sparse_grad);
    auto g = call_gradient<Backend>();
    bool every_row = false;
    with_head<Backend, true>(head, weight, bias, step, op, [&](auto& h, bool every_row_in_order) {
      using head_t = std::decay_t<decltype(h)>;
      if constexpr (is_full_softmax<head_t>::value) {
        if (dense.wanted) {
          h.forward_backward_async(hidden_view(a.hidden), targets_view(a.targets), matrix_of(grad_hidden),
                                   dense.make<typename head_t::storage_type>(), vector_of(loss), options);
          return;
        }
      }
      every_row = every_row_in_order;
      h.forward_backward_async(hidden_view(a.hidden), targets_view(a.targets), matrix_of(grad_hidden), *g,
                               vector_of(loss), options);
    });
    const at::Tensor out_loss = nan_if_nothing_counts(loss, a, cw);
    if (dense.written()) return std::make_tuple(out_loss, grad_hidden, no_rows(weight), dense.weights, dense.bias);
    auto [rows, values, gbias] = gradient_tensors<Backend>(g, weight, has_bias, sparse_grad, every_row);
    return std::make_tuple(out_loss, grad_hidden, rows, values, gbias);
  });
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_op(
    const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t reduction, int64_t ignore_index, int64_t head,
    const c10::optional<at::Tensor>& step, bool sparse_grad, const at::Tensor& grad_output,
    const c10::optional<at::Tensor>& class_weight) {
  return guarded([&] {
    const char* op = "backward";
    const loss_args a = prepare(hidden, weight, bias, targets, reduction, ignore_index, op);
    check_same_device(grad_output, weight, op, "grad_output");
    const at::Tensor cw = prepare_class_weight(class_weight, weight, op);
    const c10::DeviceGuard on_device(weight.device());
    const at::Tensor go = grad_output.to(at::kFloat).contiguous();
    const xs::loss_options options = with_loss_terms(a.options, head, cw, op);
    at::Tensor grad_hidden = at::empty({a.hidden.size(0), a.hidden.size(1)}, float_on(weight));
    const bool has_bias = bias.has_value() && bias->defined();
    dense_weight_gradient dense(weight, has_bias, sparse_grad);
    const xs::vector_view<const float> upstream(go.data_ptr<float>(), go.numel());
    auto g = call_gradient<Backend>();
    bool every_row = false;
    with_head<Backend, true>(head, weight, bias, step, op, [&](auto& h, bool every_row_in_order) {
      using head_t = std::decay_t<decltype(h)>;
      if constexpr (is_full_softmax<head_t>::value) {
        if (dense.wanted) {
          h.backward_async(hidden_view(a.hidden), targets_view(a.targets), matrix_of(grad_hidden),
                           dense.make<typename head_t::storage_type>(), options, upstream);
          return;
        }
      }
      every_row = every_row_in_order;
      h.backward_async(hidden_view(a.hidden), targets_view(a.targets), matrix_of(grad_hidden), *g, options, upstream);
    });
    if (dense.written()) return std::make_tuple(grad_hidden, no_rows(weight), dense.weights, dense.bias);
    auto [rows, values, gbias] = gradient_tensors<Backend>(g, weight, has_bias, sparse_grad, every_row);
    return std::make_tuple(grad_hidden, rows, values, gbias);
  });
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor> topk_op(const at::Tensor& hidden, const at::Tensor& weight,
                                                         const c10::optional<at::Tensor>& bias, int64_t k,
                                                         int64_t head, int64_t beam_width) {
  return guarded([&] {
    const char* op = "topk";
    check_weight(weight, bias, op);
    const at::Tensor h = prepare_hidden(hidden, weight, op);
    const int64_t b = h.size(0);
    TORCH_CHECK_VALUE(k >= 1, "xsoftmax::topk: k = ", k, " must be >= 1");
    TORCH_CHECK_VALUE(beam_width >= 0, "xsoftmax::topk: beam_width = ", beam_width, " must be >= 0");
    const c10::DeviceGuard on_device(weight.device());
    at::Tensor log_probs = at::empty({b, k}, float_on(weight));
    at::Tensor classes = at::empty({b, k}, at::TensorOptions().dtype(at::kLong).device(weight.device()));
    // A tree search's expansions per row (search_options::expansions); -1 for a head without one.
    at::Tensor expansions = at::empty({b}, at::TensorOptions().dtype(at::kLong).device(weight.device()));
    with_head<Backend, false>(head, weight, bias, c10::nullopt, op, [&](auto& hd, bool) {
      using head_t = std::decay_t<decltype(hd)>;
      const xs::matrix_view<index_t> cv(classes.data_ptr<int64_t>(), b, k);
      const xs::matrix_view<float> lv(log_probs.data_ptr<float>(), b, k);
      if constexpr (std::is_same_v<typename head_t::search_options_type, xs::search_options>) {
        xs::search_options so;
        so.beam_width = beam_width;
        so.expansions = xs::vector_view<index_t>(expansions.data_ptr<int64_t>(), b);
        hd.topk_async(hidden_view(h), k, cv, lv, so);
      } else {
        expansions.fill_(-1);
        hd.topk_async(hidden_view(h), k, cv, lv);
      }
    });
    return std::make_tuple(log_probs, classes, expansions);
  });
}

/// The loss and the top-k of the full softmax from one pass over the scores (the library's
/// `forward_topk`): (loss, log_probs, classes); the loss as `loss_op` returns it. Forward only.
template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor> loss_topk_op(const at::Tensor& hidden, const at::Tensor& weight,
                                                              const c10::optional<at::Tensor>& bias,
                                                              const at::Tensor& targets, int64_t reduction,
                                                              int64_t ignore_index, int64_t head, int64_t k,
                                                              const c10::optional<at::Tensor>& class_weight) {
  return guarded([&] {
    const char* op = "loss_topk";
    const loss_args a = prepare(hidden, weight, bias, targets, reduction, ignore_index, op);
    TORCH_CHECK_VALUE(k >= 1, "xsoftmax::loss_topk: k = ", k, " must be >= 1");
    const at::Tensor cw = prepare_class_weight(class_weight, weight, op);
    const c10::DeviceGuard on_device(weight.device());
    const xs::loss_options options = with_loss_terms(a.options, head, cw, op);
    const int64_t b = a.hidden.size(0);
    at::Tensor per_sample = at::empty({b}, float_on(weight));
    at::Tensor loss = at::empty({}, float_on(weight));
    at::Tensor log_probs = at::empty({b, k}, float_on(weight));
    at::Tensor classes = at::empty({b, k}, at::TensorOptions().dtype(at::kLong).device(weight.device()));
    with_head<Backend, false>(head, weight, bias, c10::nullopt, op, [&](auto& h, bool) {
      using head_t = std::decay_t<decltype(h)>;
      if constexpr (std::is_same_v<typename head_t::search_options_type, xs::exact_search>) {
        h.forward_topk_async(hidden_view(a.hidden), targets_view(a.targets), k,
                             xs::matrix_view<index_t>(classes.data_ptr<int64_t>(), b, k), matrix_of(log_probs),
                             vector_of(loss), options, vector_of(per_sample));
      } else {
        TORCH_CHECK_VALUE(false, "xsoftmax::loss_topk: head = ", head,
                          " is a hierarchical head; the loss and top-k in one pass are the full softmax's ",
                          "(call loss and topk)");
      }
    });
    at::Tensor out = a.options.reduce == xs::reduction::none ? per_sample : nan_if_nothing_counts(loss, a, cw);
    return std::make_tuple(out, log_probs, classes);
  });
}

}  // namespace xsoftmax_torch
