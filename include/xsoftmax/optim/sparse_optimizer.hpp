// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `sparse_optimizer<Rule, Backend, State>`: applies a head's sparse weight gradient with an update
/// rule that keeps state (momentum, Adagrad's accumulator, Adam's moments), touching only the rows
/// the gradient lists — the weights and the state of the other rows are neither read nor written,
/// so a step costs O(touched rows x dim) whatever the number of classes. One implementation for
/// every backend (a Thrust for_each over the touched rows with the rule's `__host__ __device__`
/// members); deterministic (each row is updated by one thread, in a fixed order).
///
/// State memory, per weight row of `dim` elements: `Rule::slots x dim x sizeof(State)` bytes, plus
/// `Rule::slots x sizeof(State)` for its bias when the head has one, plus 8 bytes for the row's
/// update count (`state_bytes(rows, dim, with_bias)`). For 100M rows x 512 in fp32 that is 205 GB
/// for Adam (two moments) and 102 GB for momentum or Adagrad; bf16 state (`State = bf16` storage)
/// halves it, at the cost of rounding the state on every update.
///
/// Every step checks its arguments first and throws a typed error naming the argument and the
/// value; nothing is written then. The weights go through the heads' output checks
/// (detail/validation.hpp: `shape_error` for a shape other than rows x dim or a stride smaller than
/// dim, `invalid_argument` for null data); the learning rate must be finite and >= 0, the rule of
/// every optimizer of the library, sparse or dense (`non_finite_error` for NaN or +-Inf,
/// `invalid_argument` for lr < 0); the whole gradient is checked (rows in range and unique, shapes,
/// finite values times the learning rate; see detail/sparse_gradient_checks.hpp).
///
/// What is not checked, by decision: the optimizer's own arithmetic. A finite gradient so large that
/// its square overflows (|g| > 1.8e19 in fp32: Adam's second moment, Adagrad's sum) makes that
/// state Inf and the step's weights NaN or unchanged, as in PyTorch's optimizers, which do not check
/// either. Catching it would take a second pass over the touched rows (the update computed twice, or
/// every row kept until all are known finite). A training loop that can see such gradients clips
/// them first (`clip_grad_norm_`); a step the caller suspects can be verified afterwards with the
/// heads' finite checks of the weights.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/sparse_gradient_checks.hpp>
#include <xsoftmax/detail/validation.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/optim/update_rules.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <thrust/fill.h>

#include <cmath>
#include <cstdint>

namespace xsoftmax {

template <class Rule, class Backend, class State>
class sparse_trust_ratio_optimizer;

namespace detail {

/// Every state value of an element block starts at the rule's initial value of its slot.
template <class State, int Slots>
struct initial_state_fill {
  State* state;
  float init[Slots];
  XSOFTMAX_HD void operator()(index_t e) const { state[e] = from_float<State>(init[e % Slots]); }
};

/// One touched row's update: its count advances, then every element (and its bias) goes through
/// the rule with its state loaded into registers and stored back.
template <class Rule, class T, class State, class Accum>
struct sparse_rule_update {
  Rule rule;
  matrix_view<T> w;
  T* bias;
  const index_t* rows;
  const Accum* values;
  const Accum* bias_values;
  State* state;
  State* bias_state;
  std::int64_t* counts;
  float lr;

  XSOFTMAX_HD void element(T& target, float g, State* sp, const typename Rule::row_factors& f) const {
    float s[Rule::slots];
    for (int k = 0; k < Rule::slots; ++k) s[k] = to_float(sp[k]);
    float wv = to_float(target);
    rule.apply(wv, g, s, f);
    target = from_float<T>(wv);
    for (int k = 0; k < Rule::slots; ++k) sp[k] = from_float<State>(s[k]);
  }
  XSOFTMAX_HD void operator()(index_t i) const {
    const index_t r = rows[i], d = w.cols;
    const typename Rule::row_factors f = rule.row(++counts[r], lr);
    T* wr = w.row(r);
    State* sr = state + r * d * Rule::slots;
    const Accum* g = values + i * d;
    for (index_t j = 0; j < d; ++j) element(wr[j], static_cast<float>(g[j]), sr + j * Rule::slots, f);
    if (bias_values) element(bias[r], static_cast<float>(bias_values[i]), bias_state + r * Rule::slots, f);
  }
};

/// The learning-rate rule of every optimizer step (sparse, trust-ratio, dense): finite and >= 0.
/// Throws `non_finite_error` for NaN or +-Inf and `invalid_argument` for lr < 0, naming the value.
inline void check_learning_rate(const char* where, float lr) {
  expects<non_finite_error>(std::isfinite(lr), where, ": learning rate ", lr, " is not finite");
  expects(lr >= 0, where, ": learning rate ", lr, " must be >= 0");
}

}  // namespace detail

/// A stateful sparse optimizer over a `rows x dim` weight matrix (and optional bias): `Rule` is
/// `momentum_rule`, `adagrad_rule` or `adam_rule` (or any type with their members); `State` is
/// `float` or a 16-bit storage type (`__nv_bfloat16`, `__half`).
template <class Rule, class Backend = serial, class State = float>
class sparse_optimizer {
 public:
  using rule_type = Rule;
  using state_type = State;

  /// Owns zero-initialised state (the rule's initial values) for `rows x dim` weights, and for a
  /// bias of `rows` entries when `with_bias`. Throws `invalid_argument` for a size that is not
  /// positive or whose state would not fit in memory's address range.
  sparse_optimizer(index_t rows, index_t dim, bool with_bias, Rule rule = {}, backend_resources<Backend> resources = {})
      : rule_(rule), rows_(rows), dim_(dim), resources_(resources) {
    const char* where = "sparse_optimizer";
    detail::expects(rows > 0, where, ": rows = ", rows, " must be > 0");
    detail::expects(dim > 0, where, ": dim = ", dim, " must be > 0");
    const index_t elements = detail::checked_product(
        where, "rows x dim x slots", detail::checked_product(where, "rows x dim", rows, dim), index_t(Rule::slots),
        sizeof(State));
    owned_state_.resize(static_cast<std::size_t>(elements));
    if (with_bias) owned_bias_state_.resize(static_cast<std::size_t>(rows * Rule::slots));
    owned_counts_.resize(static_cast<std::size_t>(rows));
    state_ = detail::raw(owned_state_);
    bias_state_ = with_bias ? detail::raw(owned_bias_state_) : nullptr;
    counts_ = detail::raw(owned_counts_);
    reset();
  }

  /// Attaches to caller buffers in the backend's memory (a checkpoint, a framework's tensors):
  /// `state` of rows x dim x slots values (element-major: the slots of one element are adjacent),
  /// `bias_state` of rows x slots (or null: no bias), `counts` of rows update counts. Nothing is
  /// initialised: call `reset()` for a fresh start.
  sparse_optimizer(index_t rows, index_t dim, Rule rule, State* state, State* bias_state, std::int64_t* counts,
                   backend_resources<Backend> resources = {})
      : rule_(rule), rows_(rows), dim_(dim), resources_(resources), state_(state), bias_state_(bias_state),
        counts_(counts) {
    const char* where = "sparse_optimizer";
    detail::expects(rows > 0 && dim > 0, where, ": rows = ", rows, ", dim = ", dim, " must both be > 0");
    detail::expects(state != nullptr && counts != nullptr, where, ": state and counts must not be null");
  }

  sparse_optimizer(const sparse_optimizer&) = delete;  // the pointers would alias the copy's buffers
  sparse_optimizer& operator=(const sparse_optimizer&) = delete;
  sparse_optimizer(sparse_optimizer&&) noexcept = default;
  sparse_optimizer& operator=(sparse_optimizer&&) noexcept = default;

  /// Bytes of state for `rows x dim` weights (see the file comment).
  [[nodiscard]] static std::size_t state_bytes(index_t rows, index_t dim, bool with_bias) {
    const std::size_t r = static_cast<std::size_t>(rows), d = static_cast<std::size_t>(dim);
    return r * d * Rule::slots * sizeof(State) + (with_bias ? r * Rule::slots * sizeof(State) : 0) +
           r * sizeof(std::int64_t);
  }

  /// Every state value back to the rule's initial one, every row's update count to 0.
  void reset() {
    const detail::execution<Backend> ex{resources_};
    detail::initial_state_fill<State, Rule::slots> fill{state_, {}};
    for (int k = 0; k < Rule::slots; ++k) fill.init[k] = rule_.initial_state(k);
    detail::parallel_for(ex, rows_ * dim_ * Rule::slots, fill);
    if (bias_state_) {
      fill.state = bias_state_;
      detail::parallel_for(ex, rows_ * Rule::slots, fill);
    }
    thrust::fill(ex.policy(), counts_, counts_ + rows_, std::int64_t(0));
    detail::backend_ops<Backend>::synchronize(resources_);
    steps_ = 0;
  }

  /// One update of `head`'s weights (and bias) with its gradient `g` at learning rate `lr`
  /// (`schedule(opt.steps())` for a schedule). On a device backend it first waits for the head's
  /// stream (an `_async` verb may still be writing `g`). Blocking.
  template <class Head>
  void step(Head& head, const typename Head::gradient_type& g, float lr) {
    detail::backend_ops<Backend>::synchronize(head.resources());
    step(head.weights(), head.bias(), g, lr);
  }

  /// One update of `weights` (rows x dim, the backend's memory) and `bias` (rows entries or null).
  /// Throws (nothing written then): `shape_error` when `weights` is not rows x dim or its stride is
  /// smaller than dim; `invalid_argument` when `weights.data` is null, lr < 0, or a gradient row is
  /// repeated; `non_finite_error` for a non-finite lr or gradient value (times lr); `out_of_range`
  /// for a gradient row outside [0, rows).
  template <class T, class Accum>
  void step(matrix_view<T> weights, detail::non_deduced<T>* bias, const sparse_gradient<Backend, Accum>& g,
            float lr) {
    check_step("sparse_optimizer::step", weights, bias, g, lr);
    apply_checked_step(weights, bias, g, lr);
  }

  [[nodiscard]] const Rule& rule() const { return rule_; }
  /// Calls of `step` since construction or `reset`.
  [[nodiscard]] std::int64_t steps() const { return steps_; }
  /// The most steps (and updates of one row) an optimizer counts: 2^62, far beyond any run (a
  /// step a nanosecond for 146 years), and far enough from 2^63 that counting on cannot overflow.
  /// Checkpoint loaders refuse counts beyond it.
  static constexpr std::int64_t max_steps = std::int64_t(1) << 62;
  /// Sets the step count `steps()` reports (a schedule's position), as `load_checkpoint` does when
  /// it restores a saved optimizer. Throws `invalid_argument` when `steps` is outside [0, max_steps].
  void set_steps(std::int64_t steps) {
    detail::expects(steps >= 0 && steps <= max_steps, "sparse_optimizer::set_steps: steps = ", steps,
                    " must be in [0, 2^62]");
    steps_ = steps;
  }
  [[nodiscard]] index_t rows() const { return rows_; }
  [[nodiscard]] index_t dim() const { return dim_; }
  /// The state (rows x dim x slots, element-major), bias state (rows x slots, or null) and per-row
  /// update counts, in the backend's memory: for checkpoints and inspection.
  [[nodiscard]] State* state() const { return state_; }
  [[nodiscard]] State* bias_state() const { return bias_state_; }
  [[nodiscard]] std::int64_t* update_counts() const { return counts_; }

 private:
  // The trust-ratio optimizers (large_batch.hpp) check a step once, take their norms, then apply it
  // at a scaled rate: the check and the update are separate for them.
  template <class, class, class>
  friend class sparse_trust_ratio_optimizer;

  template <class T, class Accum>
  void check_step(const char* where, matrix_view<T> weights, const T* bias, const sparse_gradient<Backend, Accum>& g,
                  float lr) const {
    detail::expects<shape_error>(weights.rows == rows_ && weights.cols == dim_, where, ": weights are ",
                                 weights.rows, " x ", weights.cols, " but the optimizer was made for ", rows_, " x ",
                                 dim_);
    detail::check_output(where, "weights", weights, rows_, dim_);  // null data, stride < cols
    detail::check_learning_rate(where, lr);
    detail::expects(!bias || !g.bias_values.size() || bias_state_, where,
                    ": the gradient updates a bias but the optimizer has no bias state (with_bias = false)");
    const detail::execution<Backend> ex{resources_};
    detail::check_sparse_gradient(where, ex, g, rows_, dim_, bias != nullptr, lr);
  }

  template <class T, class Accum>
  void apply_checked_step(matrix_view<T> weights, T* bias, const sparse_gradient<Backend, Accum>& g, float lr) {
    const detail::execution<Backend> ex{resources_};
    detail::parallel_for(ex, g.num_rows(),
                         detail::sparse_rule_update<Rule, T, State, Accum>{
                             rule_, weights, bias, thrust::raw_pointer_cast(g.rows.data()),
                             thrust::raw_pointer_cast(g.values.data()),
                             g.bias_values.empty() ? nullptr : thrust::raw_pointer_cast(g.bias_values.data()), state_,
                             bias_state_, counts_, lr});
    detail::backend_ops<Backend>::synchronize(resources_);
    ++steps_;
  }

  Rule rule_;
  index_t rows_ = 0, dim_ = 0;
  backend_resources<Backend> resources_;
  backend_vector<Backend, State> owned_state_, owned_bias_state_;
  backend_vector<Backend, std::int64_t> owned_counts_;
  State* state_ = nullptr;
  State* bias_state_ = nullptr;
  std::int64_t* counts_ = nullptr;
  std::int64_t steps_ = 0;
};

/// SGD with momentum (or Nesterov), sparse: `sparse_momentum<omp>(rows, dim, bias, momentum_rule(0.9f))`.
template <class Backend = serial, class State = float>
using sparse_momentum = sparse_optimizer<momentum_rule, Backend, State>;
/// Adagrad, sparse.
template <class Backend = serial, class State = float>
using sparse_adagrad = sparse_optimizer<adagrad_rule, Backend, State>;
/// Adam / AdamW in the lazy form (per-row bias correction), sparse.
template <class Backend = serial, class State = float>
using sparse_adam = sparse_optimizer<adam_rule, Backend, State>;

}  // namespace xsoftmax
