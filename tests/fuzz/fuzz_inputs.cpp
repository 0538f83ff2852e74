// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the validation layer and the tree builders (tests/fuzz/README.md).
//
// The fuzzer's bytes choose one of six probes and its arguments:
//   0. runtime_tree<>::huffman over fuzzed counts (negative, NaN, huge, many equal) and arity;
//   1. runtime_tree<>::from_parents over a fuzzed parent array, leaf-class list (or none) and class
//      count (extreme ones too);
//   2. a full_softmax verb with fuzzed shapes, strides, null pointers, targets, ignore_index,
//      reduction (any int), grad_output sizes, k and class ranges;
//   3. apply_sgd with fuzzed gradient rows, values (NaN, inf, huge), bias values and lr;
//   4. a sparse optimizer's step (momentum, Adagrad, Adam, LARS, LAMB) on a fuzzed weights view (null
//      data, short stride, other shapes), gradient and lr: a step that threw changed nothing;
//   5. densify over fuzzed workers (negative sizes, bad indices and values): a throw changed nothing.
// A probe may throw one of the library's typed exceptions (bad input) or succeed; anything else —
// a crash, a sanitizer report, another exception type, weights changed by a call that threw, a
// tree that violates its own contract — aborts the run.

#include <xsoftmax/optim/large_batch.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>
#include <xsoftmax/optim/topk_sparsifier.hpp>
#include <xsoftmax/xsoftmax.hpp>

#include <algorithm>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

/// Reads typed values off the fuzzer's bytes (zeros once they run out).
class bytes {
 public:
  bytes(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
  template <class T>
  T take() {
    T v{};
    const std::size_t k = n_ - at_ < sizeof(T) ? n_ - at_ : sizeof(T);
    std::memcpy(&v, d_ + at_, k);
    at_ += k;
    return v;
  }
  /// A small count in [0, limit).
  index_t small(index_t limit) { return static_cast<index_t>(take<std::uint16_t>() % limit); }
  /// An int64 that is often extreme.
  index_t any_index() {
    switch (take<std::uint8_t>() % 6) {
      case 0: return std::numeric_limits<index_t>::min();
      case 1: return std::numeric_limits<index_t>::max();
      case 2: return -1;
      case 3: return -100;
      default: return take<std::int64_t>();
    }
  }
  float any_float() {
    switch (take<std::uint8_t>() % 8) {
      case 0: return std::numeric_limits<float>::quiet_NaN();
      case 1: return std::numeric_limits<float>::infinity();
      case 2: return -std::numeric_limits<float>::infinity();
      case 3: return 3e38f;
      default: return static_cast<float>(take<std::int16_t>()) / 256.f;
    }
  }
  bool done() const { return at_ >= n_; }

 private:
  const std::uint8_t* d_;
  std::size_t n_, at_ = 0;
};

[[noreturn]] void contract_broken(const char* what) {
  std::fprintf(stderr, "fuzz_inputs: %s\n", what);
  std::abort();
}

/// Runs f; the library's typed errors are fine, anything else is a finding.
template <class F>
void probe(F&& f) {
  try {
    f();
  } catch (const xs::shape_error&) {
  } catch (const xs::out_of_range&) {
  } catch (const xs::non_finite_error&) {
  } catch (const xs::tree_error&) {
  } catch (const xs::invalid_argument&) {
  }
}

void check_tree(const xs::runtime_tree<>& t) {
  // Every class has a path whose steps stay inside the weight rows.
  const auto v = t.view();
  for (index_t c = 0; c < v.num_classes(); ++c)
    for (int l = 0; l < v.depth(c); ++l) {
      const xs::path_step s = v.step(c, l);
      if (s.block_begin < 0 || s.block_size < 1 || s.child < 0 || s.child >= s.block_size ||
          s.block_begin + s.block_size > v.num_rows())
        contract_broken("a tree path leaves the weight rows");
    }
}

void fuzz_huffman(bytes& in) {
  const index_t n = in.small(300);
  const int arity = static_cast<int>(in.take<std::int8_t>());
  std::vector<double> counts(static_cast<std::size_t>(n));
  for (auto& c : counts) c = in.any_float();
  probe([&] { check_tree(xs::runtime_tree<>::huffman(counts, arity)); });
}

void fuzz_from_parents(bytes& in) {
  const index_t nodes = in.small(64);
  // A class count far beyond the parent array now and then (2^40, INT64_MAX: issue 28 found
  // bad_alloc there): it must be a tree_error before anything is sized by it.
  const index_t classes = in.take<std::uint8_t>() % 8 == 0 ? in.any_index() : in.small(40);
  std::vector<index_t> parent(static_cast<std::size_t>(nodes)), leaf(static_cast<std::size_t>(nodes));
  for (auto& p : parent) p = in.take<std::uint8_t>() % 4 == 0 ? in.any_index() : in.small(nodes + 1) - 1;
  for (auto& l : leaf) l = in.take<std::uint8_t>() % 4 == 0 ? in.any_index() : in.small(classes > 0 && classes < 40 ? classes + 1 : 41) - 1;
  if (in.take<std::uint8_t>() % 2 == 0) probe([&] { check_tree(xs::runtime_tree<>::from_parents(parent, leaf, classes)); });
  else probe([&] { check_tree(xs::runtime_tree<>::from_parents(parent, classes)); });
}

void fuzz_full_verbs(bytes& in) {
  const index_t n = 1 + in.small(20), d = 1 + in.small(6);
  xs::full_softmax<xs::fp32, xs::serial> head(n, d, in.take<std::uint8_t>() % 2 == 0);
  const std::vector<float> before(head.weights().data, head.weights().data + n * d);
  const index_t rows = in.take<std::uint8_t>() % 6 == 0 ? in.any_index() % 8 : in.small(8);
  const index_t cols = in.take<std::uint8_t>() % 6 == 0 ? in.small(9) : d;
  const index_t stride = cols + (in.take<std::uint8_t>() % 5 == 0 ? in.small(3) - 1 : 0);
  const index_t safe_rows = rows > 0 ? rows : 0;
  std::vector<float> h(static_cast<std::size_t>(safe_rows * (stride > 0 ? stride : 1) + 8));
  for (auto& x : h) x = in.take<std::uint8_t>() % 16 == 0 ? in.any_float() : 0.5f;
  std::vector<index_t> t(static_cast<std::size_t>(safe_rows + 1));
  for (auto& x : t) x = in.take<std::uint8_t>() % 5 == 0 ? in.any_index() : in.small(n);
  const bool null_h = in.take<std::uint8_t>() % 9 == 0, null_t = in.take<std::uint8_t>() % 9 == 0;
  const xs::matrix_view<const float> hv(null_h ? nullptr : h.data(), rows, cols, stride);
  const xs::vector_view<const index_t> tv(null_t ? nullptr : t.data(), rows + (in.small(4) == 0 ? 1 : 0));
  xs::loss_options o;
  o.reduce = static_cast<xs::reduction>(in.take<std::uint8_t>() % 5);
  o.ignore_index = in.take<std::uint8_t>() % 3 == 0 ? in.any_index() : -100;
  std::vector<float> per(static_cast<std::size_t>(safe_rows + 1)), gh(h.size()), go(static_cast<std::size_t>(safe_rows + 1));
  for (auto& x : go) x = in.take<std::uint8_t>() % 8 == 0 ? in.any_float() : 1.f;
  const index_t go_size = in.small(4) == 0 ? in.small(static_cast<index_t>(go.size()) + 1) : 0;
  const bool null_out = in.take<std::uint8_t>() % 9 == 0;
  xs::full_softmax<xs::fp32, xs::serial>::gradient_type grad;
  const bool threw_expected = [&] {
    bool threw = true;
    probe([&] {
      switch (in.take<std::uint8_t>() % 5) {
        case 0: (void)head.forward(hv, tv, o, xs::vector_view<float>(null_out ? nullptr : per.data(), safe_rows)); break;
        case 1:
          (void)head.forward_backward(hv, tv, xs::matrix_view<float>(null_out ? nullptr : gh.data(), rows, cols, stride),
                                      grad, o, {}, xs::vector_view<const float>(go.data(), go_size));
          break;
        case 2: head.log_prob(hv, tv, xs::vector_view<float>(null_out ? nullptr : per.data(), safe_rows)); break;
        case 3: {
          const index_t k = in.any_index() % 5;
          std::vector<index_t> c(static_cast<std::size_t>(safe_rows * 5 + 1));
          std::vector<float> lp(c.size());
          head.topk(hv, k, xs::matrix_view<index_t>(null_out ? nullptr : c.data(), rows, k),
                    xs::matrix_view<float>(lp.data(), rows, k));
          break;
        }
        default: {
          const index_t b = in.any_index() % 30, e = in.any_index() % 30;
          std::vector<float> out(static_cast<std::size_t>(safe_rows * 30 + 1));
          head.log_distribution(hv, b, e, xs::matrix_view<float>(null_out ? nullptr : out.data(), rows, e - b));
        }
      }
      threw = false;
    });
    return threw;
  }();
  (void)threw_expected;
  if (std::memcmp(before.data(), head.weights().data, before.size() * sizeof(float)) != 0)
    contract_broken("a verb changed the weights");
}

/// A fuzzed sparse gradient for an n x d layer: rows in and out of range, repeated, extreme; values
/// and bias values NaN, inf, huge; sizes that disagree with the rows.
xs::sparse_gradient<xs::serial, float> fuzzed_gradient(bytes& in, index_t n, index_t d) {
  xs::sparse_gradient<xs::serial, float> g;
  const index_t m = in.small(6);
  g.dim = in.take<std::uint8_t>() % 7 == 0 ? in.small(8) : d;
  // Built in std::vectors, then assigned (Thrust's host_vector::push_back on an empty vector binds a
  // reference to its null storage, which UBSan reports: a harness artefact, not a library finding).
  std::vector<index_t> rows;
  std::vector<float> values, bias_values;
  for (index_t i = 0; i < m; ++i) rows.push_back(in.take<std::uint8_t>() % 5 == 0 ? in.any_index() : in.small(n));
  const index_t count = in.take<std::uint8_t>() % 7 == 0 ? in.small(20) : m * d;
  for (index_t i = 0; i < count; ++i) values.push_back(in.take<std::uint8_t>() % 10 == 0 ? in.any_float() : 0.1f);
  if (in.take<std::uint8_t>() % 3 == 0)
    for (index_t i = 0; i < m; ++i) bias_values.push_back(in.any_float());
  g.rows.assign(rows.begin(), rows.end());
  g.values.assign(values.begin(), values.end());
  g.bias_values.assign(bias_values.begin(), bias_values.end());
  return g;
}

void fuzz_apply_sgd(bytes& in) {
  const index_t n = 1 + in.small(20), d = 1 + in.small(6);
  xs::full_softmax<xs::fp32, xs::serial> head(n, d, in.take<std::uint8_t>() % 2 == 0);
  const std::vector<float> before(head.weights().data, head.weights().data + n * d);
  const auto g = fuzzed_gradient(in, n, d);
  const float lr = in.take<std::uint8_t>() % 6 == 0 ? in.any_float() : 0.5f;
  bool threw = true;
  probe([&] {
    head.apply_sgd(g, lr);
    threw = false;
  });
  const bool same = std::memcmp(before.data(), head.weights().data, before.size() * sizeof(float)) == 0;
  if (threw && !same) contract_broken("apply_sgd threw but changed the weights");
  if (!threw)
    for (index_t i = 0; i < n * d; ++i)
      if (!std::isfinite(head.weights().data[i])) contract_broken("apply_sgd left a non-finite weight");
}

/// One step of optimizer `Opt` (rows x d, bias) on a fuzzed weights view (null data with a size, a
/// stride smaller than its columns, other shapes), gradient and learning rate: a step that threw
/// changed neither the weights, nor the bias, nor the optimizer's state and counts.
template <class Opt>
void step_probe(bytes& in, Opt& opt, index_t n, index_t d, const float* state, const std::int64_t* counts,
                std::size_t state_size) {
  // Room for the largest view the probe makes ((n + 2) x (d + 2) with a stride up to d + 1): a view
  // must never claim memory the harness did not allocate.
  std::vector<float> w(static_cast<std::size_t>((n + 3) * (d + 3)), 0.25f), bias(static_cast<std::size_t>(n + 3), 0.f);
  index_t rows = n, cols = d, stride = d;
  float* data = w.data();
  switch (in.take<std::uint8_t>() % 8) {
    case 0: data = nullptr; break;
    case 1: stride = in.small(d + 2); break;
    case 2: rows = in.small(n + 3); break;
    case 3: cols = in.small(d + 3); break;
    default: break;
  }
  const bool with_bias = in.take<std::uint8_t>() % 2 == 0;
  const auto g = fuzzed_gradient(in, n, d);
  const float lr = in.take<std::uint8_t>() % 6 == 0 ? in.any_float() : 0.5f;
  const std::vector<float> w0 = w, b0 = bias, s0(state, state + state_size);
  const std::vector<std::int64_t> c0(counts, counts + n);
  bool threw = true;
  probe([&] {
    opt.step(xs::matrix_view<float>(data, rows, cols, stride), with_bias ? bias.data() : nullptr, g, lr);
    threw = false;
  });
  if (threw && (w != w0 || bias != b0 || !std::equal(s0.begin(), s0.end(), state) ||
                !std::equal(c0.begin(), c0.end(), counts)))
    contract_broken("an optimizer step threw but changed the weights or its state");
}

void fuzz_optimizer_step(bytes& in) {
  const index_t n = 1 + in.small(12), d = 1 + in.small(5);
  switch (in.take<std::uint8_t>() % 5) {
    case 0: { xs::sparse_momentum<> o(n, d, true); step_probe(in, o, n, d, o.state(), o.update_counts(), std::size_t(n * d)); break; }
    case 1: { xs::sparse_adagrad<> o(n, d, true); step_probe(in, o, n, d, o.state(), o.update_counts(), std::size_t(n * d)); break; }
    case 2: { xs::sparse_adam<> o(n, d, true); step_probe(in, o, n, d, o.state(), o.update_counts(), std::size_t(2 * n * d)); break; }
    case 3: {
      xs::sparse_lars<> o(n, d, true);
      step_probe(in, o, n, d, o.base().state(), o.base().update_counts(), std::size_t(n * d));
      break;
    }
    default: {
      xs::sparse_lamb<> o(n, d, true);
      step_probe(in, o, n, d, o.base().state(), o.base().update_counts(), std::size_t(2 * n * d));
    }
  }
}

/// densify over 1-3 fuzzed workers (sizes, negative ones too; indices unsorted, repeated, out of
/// range, extreme; values NaN / inf): a call that threw left the dense gradient as it was.
void fuzz_densify(bytes& in) {
  const index_t size = in.take<std::uint8_t>() % 6 == 0 ? in.any_index() % 40 : in.small(40);
  const int workers = 1 + in.take<std::uint8_t>() % 3;
  std::vector<xs::compressed_gradient<xs::serial>> parts(static_cast<std::size_t>(workers));
  std::vector<const xs::compressed_gradient<xs::serial>*> pointers;
  for (auto& p : parts) {
    p.size = in.take<std::uint8_t>() % 8 == 0 ? in.any_index() % 50 : size;
    const index_t k = in.small(8);
    std::vector<std::int64_t> idx;
    std::vector<float> val;
    index_t at = in.small(4);
    for (index_t i = 0; i < k; ++i) {
      idx.push_back(in.take<std::uint8_t>() % 6 == 0 ? in.any_index() : at);
      at += 1 + in.small(3);
      val.push_back(in.take<std::uint8_t>() % 8 == 0 ? in.any_float() : 1.f);
    }
    if (in.take<std::uint8_t>() % 9 == 0) val.push_back(2.f);  // one value more than indices
    p.indices.assign(idx.begin(), idx.end());
    p.values.assign(val.begin(), val.end());
    pointers.push_back(in.take<std::uint8_t>() % 16 == 0 ? nullptr : &p);
  }
  std::vector<float> dense(64, 7.f);
  const std::vector<float> before = dense;
  bool threw = true;
  probe([&] {
    xs::densify<xs::serial>(pointers, xs::vector_view<float>(in.take<std::uint8_t>() % 10 == 0 ? nullptr : dense.data(),
                                                             size),
                            in.take<std::uint8_t>() % 2 ? xs::worker_reduction::sum : xs::worker_reduction::mean);
    threw = false;
  });
  if (threw && dense != before) contract_broken("densify threw but changed the dense gradient");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  bytes in(data, size);
  switch (in.take<std::uint8_t>() % 6) {
    case 0: fuzz_huffman(in); break;
    case 1: fuzz_from_parents(in); break;
    case 2: fuzz_full_verbs(in); break;
    case 3: fuzz_apply_sgd(in); break;
    case 4: fuzz_optimizer_step(in); break;
    default: fuzz_densify(in); break;
  }
  return 0;
}
