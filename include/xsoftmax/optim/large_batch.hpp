// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Large-batch optimizers with a per-layer trust ratio, LARS and LAMB (rules in
/// trust_ratio_rules.hpp), in two forms:
///  * `large_batch_optimizer<Rule, Backend>` (`lars<B>`, `lamb<B>`) for dense layers — the
///    parameters of a data-parallel feature extractor: each layer is a contiguous float vector and
///    its gradient; the ratio is taken over the whole layer.
///  * `sparse_trust_ratio_optimizer<Rule, Backend, State>` (`sparse_lars<B>`, `sparse_lamb<B>`) for
///    a head's `sparse_gradient`: the "layer" is the set of rows the gradient touches (with their
///    bias entries), so the norms cost O(touched rows x dim), like the update. It is a
///    `sparse_optimizer` (same state layout, lazy per-row counts) stepped at lr x trust.
///
/// A step checks everything first (sizes, lr finite and >= 0, every gradient value finite, each
/// ratio finite), computes every layer's norms, and only then writes: a throwing step changes
/// nothing. Norms are sums in double in a fixed blocked order (detail/primitives/blocked_sum.hpp):
/// results are bitwise repeatable and do not depend on the thread count; serial and omp agree
/// bitwise. One implementation for every backend: Thrust transforms and for_each on
/// `execution<Backend>`'s policy with `__host__ __device__` function objects. A step costs two
/// passes over each layer (norms, then update) and one value read back per layer.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/host/backend_ops.hpp>
#include <xsoftmax/detail/primitives/blocked_sum.hpp>
#include <xsoftmax/detail/primitives/finite_scan.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>
#include <xsoftmax/optim/trust_ratio_rules.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace xsoftmax {

/// One dense layer of a step: its weights and their gradient, both `size` floats in the backend's
/// memory (`size` as the optimizer was made for).
struct dense_layer {
  vector_view<float> weights;
  vector_view<const float> gradient;
};

namespace detail {

/// Squares of the weights and of the rule's trust term, for one dense element.
template <class Rule>
struct dense_trust_terms {
  Rule rule;
  const float* w;
  const float* g;
  const float* state;
  typename Rule::row_factors f;
  XSOFTMAX_HD sum_pair operator()(index_t e) const {
    const float t = rule.trust_term(w[e], g[e], state + e * Rule::slots, f);
    return {static_cast<double>(w[e]) * w[e], static_cast<double>(t) * t};
  }
};

/// The update of one dense element, its state in registers.
template <class Rule>
struct dense_rule_update {
  Rule rule;
  float* w;
  const float* g;
  float* state;
  typename Rule::row_factors f;
  XSOFTMAX_HD void operator()(index_t e) const {
    float s[Rule::slots];
    for (int k = 0; k < Rule::slots; ++k) s[k] = state[e * Rule::slots + k];
    float wv = w[e];
    rule.apply(wv, g[e], s, f);
    w[e] = wv;
    for (int k = 0; k < Rule::slots; ++k) state[e * Rule::slots + k] = s[k];
  }
};

/// Squares of the weights and trust terms of one touched row (and its bias entry): one term per
/// row, so the rule's per-row factors (a pow for LAMB) are computed once per row.
template <class Rule, class T, class State, class Accum>
struct touched_row_trust_terms {
  Rule rule;
  matrix_view<const T> w;
  const T* bias;
  const index_t* rows;
  const Accum* values;
  const Accum* bias_values;
  const State* state;
  const State* bias_state;
  const std::int64_t* counts;

  XSOFTMAX_HD static void add(sum_pair& s, const Rule& rule, float wv, float g, const State* sp,
                              const typename Rule::row_factors& f) {
    float st[Rule::slots];
    for (int k = 0; k < Rule::slots; ++k) st[k] = to_float(sp[k]);
    const float t = rule.trust_term(wv, g, st, f);
    s.first += static_cast<double>(wv) * wv;
    s.second += static_cast<double>(t) * t;
  }
  XSOFTMAX_HD sum_pair operator()(index_t i) const {
    const index_t r = rows[i], d = w.cols;
    const typename Rule::row_factors f = rule.row(counts[r] + 1, 1.f);  // the count this step will give
    sum_pair s;
    const T* wr = w.row(r);
    for (index_t j = 0; j < d; ++j)
      add(s, rule, to_float(wr[j]), static_cast<float>(values[i * d + j]), state + (r * d + j) * Rule::slots, f);
    if (bias_values)
      add(s, rule, to_float(bias[r]), static_cast<float>(bias_values[i]), bias_state + r * Rule::slots, f);
    return s;
  }
};

/// The ratio of a layer from its sums of squares; throws `non_finite_error` (weights holding a
/// NaN or an infinity) before anything is written.
template <class Rule>
float checked_trust_ratio(const char* where, const Rule& rule, const sum_pair& sums, const char* layer, index_t l) {
  const double wn = std::sqrt(sums.first), tn = std::sqrt(sums.second);
  const float trust = rule.trust_ratio(wn, tn);
  expects<non_finite_error>(std::isfinite(wn) && std::isfinite(tn) && std::isfinite(trust), where, ": ", layer, " ",
                            l, ": ||w|| = ", wn, ", ||", Rule::name, " term|| = ", tn, " give trust ratio ", trust,
                            " (weights not finite?)");
  return trust;
}

}  // namespace detail

/// LARS or LAMB over a fixed list of dense layers. State, per layer of `size` floats:
/// `Rule::slots x size x 4` bytes (LARS 4, LAMB 8 bytes per parameter), element-major (the slots
/// of one element adjacent), layers one after the other; `state_bytes(sizes)`.
template <class Rule, class Backend = serial>
class large_batch_optimizer {
 public:
  using rule_type = Rule;

  /// Owns zero-initialised state for layers of `layer_sizes` floats. Throws `invalid_argument` for
  /// no layer, a size that is not positive, or a total whose state would not fit in memory.
  explicit large_batch_optimizer(std::vector<index_t> layer_sizes, Rule rule = {},
                                 backend_resources<Backend> resources = {})
      : rule_(rule), resources_(resources) {
    set_layers(std::move(layer_sizes));
    owned_state_.resize(static_cast<std::size_t>(total_ * Rule::slots));
    state_ = detail::raw(owned_state_);
    reset();
  }

  /// Attaches to caller state in the backend's memory: `state_bytes(layer_sizes) / 4` floats, laid
  /// out as above (a checkpoint, a framework's buffers). Nothing is initialised: `reset()` for a
  /// fresh start. Throws `invalid_argument` for bad sizes or a null `state`.
  large_batch_optimizer(std::vector<index_t> layer_sizes, Rule rule, float* state,
                        backend_resources<Backend> resources = {})
      : rule_(rule), resources_(resources), state_(state) {
    set_layers(std::move(layer_sizes));
    detail::expects(state != nullptr, "large_batch_optimizer: state must not be null");
  }

  large_batch_optimizer(const large_batch_optimizer&) = delete;  // the state pointer would alias
  large_batch_optimizer& operator=(const large_batch_optimizer&) = delete;
  large_batch_optimizer(large_batch_optimizer&&) noexcept = default;
  large_batch_optimizer& operator=(large_batch_optimizer&&) noexcept = default;

  /// Bytes of state for layers of these sizes.
  [[nodiscard]] static std::size_t state_bytes(const std::vector<index_t>& layer_sizes) {
    std::size_t total = 0;
    for (const index_t n : layer_sizes) total += static_cast<std::size_t>(n);
    return total * Rule::slots * sizeof(float);
  }

  /// Every state value to the rule's initial one; the step count to 0.
  void reset() {
    const detail::execution<Backend> ex{resources_};
    detail::initial_state_fill<float, Rule::slots> fill{state_, {}};
    for (int k = 0; k < Rule::slots; ++k) fill.init[k] = rule_.initial_state(k);
    detail::parallel_for(ex, total_ * Rule::slots, fill);
    detail::backend_ops<Backend>::synchronize(resources_);
    steps_ = 0;
  }

  /// One step of every layer (`layers[l]` is layer l, sizes as constructed) at learning rate `lr`
  /// (`schedule(opt.steps())` for a schedule from schedules.hpp). Throws `shape_error` (layer count
  /// or a size differs), `invalid_argument` (null data, negative lr), `non_finite_error` (lr, a
  /// gradient value, or a trust ratio not finite, naming the layer and the value); nothing is
  /// written then. Blocking.
  void step(const std::vector<dense_layer>& layers, float lr) {
    const char* where = "large_batch_optimizer::step";
    const detail::execution<Backend> ex{resources_};
    detail::check_learning_rate(where, lr);
    const index_t count = static_cast<index_t>(sizes_.size());
    detail::expects<shape_error>(static_cast<index_t>(layers.size()) == count, where, ": ", layers.size(),
                                 " layers given but the optimizer was made for ", count);
    for (index_t l = 0; l < count; ++l) {
      const dense_layer& layer = layers[static_cast<std::size_t>(l)];
      const index_t n = sizes_[static_cast<std::size_t>(l)];
      detail::expects<shape_error>(layer.weights.size == n && layer.gradient.size == n, where, ": layer ", l,
                                   " has ", layer.weights.size, " weights and ", layer.gradient.size,
                                   " gradient values but was made for ", n);
      detail::expects(layer.weights.data && layer.gradient.data, where, ": layer ", l, " has a null pointer");
      const index_t bad = detail::first_non_finite(ex, layer.gradient.data, n);
      if (bad != n)
        detail::expects<non_finite_error>(false, where, ": layer ", l, " gradient[", bad, "] = ",
                                          detail::backend_ops<Backend>::read(resources_, layer.gradient.data + bad),
                                          " is not finite");
    }
    // Every layer's ratio before any write, so that a non-finite one leaves all layers unchanged.
    const typename Rule::row_factors unit = rule_.row(steps_ + 1, 1.f);
    std::vector<float> trust(static_cast<std::size_t>(count));
    for (index_t l = 0; l < count; ++l) {
      const dense_layer& layer = layers[static_cast<std::size_t>(l)];
      const detail::sum_pair sums = detail::blocked_sum(
          ex, layer.weights.size,
          detail::dense_trust_terms<Rule>{rule_, layer.weights.data, layer.gradient.data, layer_state(l), unit});
      trust[static_cast<std::size_t>(l)] = detail::checked_trust_ratio(where, rule_, sums, "layer", l);
    }
    for (index_t l = 0; l < count; ++l) {
      const dense_layer& layer = layers[static_cast<std::size_t>(l)];
      const typename Rule::row_factors f = rule_.row(steps_ + 1, lr * trust[static_cast<std::size_t>(l)]);
      detail::parallel_for(ex, layer.weights.size,
                           detail::dense_rule_update<Rule>{rule_, layer.weights.data, layer.gradient.data,
                                                           layer_state(l), f});
    }
    detail::backend_ops<Backend>::synchronize(resources_);
    trust_ = std::move(trust);
    ++steps_;
  }

  [[nodiscard]] const Rule& rule() const { return rule_; }
  /// Calls of `step` since construction or `reset` (LAMB's bias correction uses steps() + 1).
  [[nodiscard]] std::int64_t steps() const { return steps_; }
  [[nodiscard]] index_t num_layers() const { return static_cast<index_t>(sizes_.size()); }
  [[nodiscard]] const std::vector<index_t>& layer_sizes() const { return sizes_; }
  /// The trust ratio of each layer at the last step (empty before the first), for logging.
  [[nodiscard]] const std::vector<float>& trust_ratios() const { return trust_; }
  /// All state (see the class comment), and layer l's (`slots x size` floats), in the backend's memory.
  [[nodiscard]] float* state() const { return state_; }
  [[nodiscard]] float* layer_state(index_t l) const {
    return state_ + offsets_[static_cast<std::size_t>(l)] * Rule::slots;
  }

 private:
  void set_layers(std::vector<index_t> sizes) {
    const char* where = "large_batch_optimizer";
    detail::expects(!sizes.empty(), where, ": no layers");
    for (std::size_t l = 0; l < sizes.size(); ++l) {
      detail::expects(sizes[l] > 0, where, ": layer ", l, " size = ", sizes[l], " must be > 0");
      offsets_.push_back(total_);
      detail::expects(!__builtin_add_overflow(total_, sizes[l], &total_), where, ": total size overflows");
    }
    (void)detail::checked_product(where, "parameters x slots", total_, index_t(Rule::slots), sizeof(float));
    sizes_ = std::move(sizes);
  }

  Rule rule_;
  backend_resources<Backend> resources_;
  std::vector<index_t> sizes_, offsets_;
  index_t total_ = 0;
  backend_vector<Backend, float> owned_state_;
  float* state_ = nullptr;
  std::vector<float> trust_;
  std::int64_t steps_ = 0;
};

/// LARS over dense layers: `xs::lars<omp> opt({n1, n2}, xs::lars_rule(0.9f, 1e-4f, 0.001f));`.
template <class Backend = serial>
using lars = large_batch_optimizer<lars_rule, Backend>;
/// LAMB over dense layers: `xs::lamb<omp> opt({n1, n2}, xs::lamb_rule(0.9f, 0.999f, 1e-6f, 0.01f));`.
template <class Backend = serial>
using lamb = large_batch_optimizer<lamb_rule, Backend>;

/// LARS or LAMB on a head's sparse gradient, the layer being the touched rows (and their bias
/// entries): trust from the norms over those rows, then the `sparse_optimizer<Rule>` update at
/// lr x trust (LAMB's bias correction per row, lazy, as sparse Adam). State and its memory are the
/// sparse optimizer's: `state_bytes(rows, dim, bias)` (`Rule::slots x dim x sizeof(State)` per row,
/// plus the bias state and 8 bytes of update count per row).
template <class Rule, class Backend = serial, class State = float>
class sparse_trust_ratio_optimizer {
 public:
  using rule_type = Rule;
  using base_type = sparse_optimizer<Rule, Backend, State>;

  /// Owns the state, as `sparse_optimizer(rows, dim, with_bias, rule, resources)` (same throws).
  sparse_trust_ratio_optimizer(index_t rows, index_t dim, bool with_bias, Rule rule = {},
                               backend_resources<Backend> resources = {})
      : base_(rows, dim, with_bias, rule, resources), resources_(resources) {}

  /// Attaches to caller state, as the attaching `sparse_optimizer` constructor.
  sparse_trust_ratio_optimizer(index_t rows, index_t dim, Rule rule, State* state, State* bias_state,
                               std::int64_t* counts, backend_resources<Backend> resources = {})
      : base_(rows, dim, rule, state, bias_state, counts, resources), resources_(resources) {}

  [[nodiscard]] static std::size_t state_bytes(index_t rows, index_t dim, bool with_bias) {
    return base_type::state_bytes(rows, dim, with_bias);
  }

  /// One update of `head`'s weights and bias with its gradient `g` at learning rate `lr`.
  template <class Head>
  void step(Head& head, const typename Head::gradient_type& g, float lr) {
    detail::backend_ops<Backend>::synchronize(head.resources());
    step(head.weights(), head.bias(), g, lr);
  }

  /// One update of `weights` (rows x dim) and `bias` (rows entries or null). Throws as
  /// `sparse_optimizer::step` (weights' shape, stride and null data, lr not finite or < 0, rows out
  /// of range or repeated, non-finite values), plus `non_finite_error` for a non-finite trust ratio;
  /// nothing is written then. An empty gradient changes nothing but the step count.
  template <class T, class Accum>
  void step(matrix_view<T> weights, detail::non_deduced<T>* bias, const sparse_gradient<Backend, Accum>& g,
            float lr) {
    const char* where = "sparse_trust_ratio_optimizer::step";
    base_.check_step(where, weights, bias, g, lr);  // weights, lr (finite, >= 0), gradient
    const detail::execution<Backend> ex{resources_};
    const bool with_bias = bias && !g.bias_values.empty();
    // One row per term; 8 rows per partial sum keeps a few thousand touched rows spread over threads.
    const detail::sum_pair sums = detail::blocked_sum(
        ex, g.num_rows(),
        detail::touched_row_trust_terms<Rule, T, State, Accum>{
            base_.rule(), matrix_view<const T>(weights), bias, thrust::raw_pointer_cast(g.rows.data()),
            thrust::raw_pointer_cast(g.values.data()),
            with_bias ? thrust::raw_pointer_cast(g.bias_values.data()) : nullptr, base_.state(), base_.bias_state(),
            base_.update_counts()},
        8);
    const float trust = detail::checked_trust_ratio(where, base_.rule(), sums, "touched rows of step", base_.steps());
    base_.apply_checked_step(weights, bias, g, lr * trust);
    trust_ = trust;
  }

  /// Every state value to its initial one, every row's update count and the step count to 0.
  void reset() { base_.reset(); }
  [[nodiscard]] const Rule& rule() const { return base_.rule(); }
  [[nodiscard]] std::int64_t steps() const { return base_.steps(); }
  /// The trust ratio of the last step (1 before the first).
  [[nodiscard]] float trust_ratio() const { return trust_; }
  /// The underlying sparse optimizer: its state, bias state and per-row update counts.
  [[nodiscard]] const base_type& base() const { return base_; }

 private:
  base_type base_;
  backend_resources<Backend> resources_;
  float trust_ = 1.f;
};

/// LARS on the touched rows of a head's sparse gradient.
template <class Backend = serial, class State = float>
using sparse_lars = sparse_trust_ratio_optimizer<lars_rule, Backend, State>;
/// LAMB on the touched rows of a head's sparse gradient (lazy per-row bias correction).
template <class Backend = serial, class State = float>
using sparse_lamb = sparse_trust_ratio_optimizer<lamb_rule, Backend, State>;

}  // namespace xsoftmax
