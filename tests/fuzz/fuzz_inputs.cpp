// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the validation layer and the tree builders (tests/fuzz/README.md).
//
// The fuzzer's bytes choose one of four probes and its arguments:
//   0. runtime_tree<>::huffman over fuzzed counts (negative, NaN, huge, many equal) and arity;
//   1. runtime_tree<>::from_parents over a fuzzed parent array and leaf-class list;
//   2. a full_softmax verb with fuzzed shapes, strides, null pointers, targets, ignore_index,
//      reduction (any int), grad_output sizes, k and class ranges;
//   3. apply_sgd with fuzzed gradient rows, values (NaN, inf, huge), bias values and lr.
// A probe may throw one of the library's typed exceptions (bad input) or succeed; anything else —
// a crash, a sanitizer report, another exception type, weights changed by a call that threw, a
// tree that violates its own contract — aborts the run.

#include <xsoftmax/xsoftmax.hpp>

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
  const index_t nodes = in.small(64), classes = in.small(40);
  std::vector<index_t> parent(static_cast<std::size_t>(nodes)), leaf(static_cast<std::size_t>(nodes));
  for (auto& p : parent) p = in.take<std::uint8_t>() % 4 == 0 ? in.any_index() : in.small(nodes + 1) - 1;
  for (auto& l : leaf) l = in.take<std::uint8_t>() % 4 == 0 ? in.any_index() : in.small(classes + 1) - 1;
  probe([&] { check_tree(xs::runtime_tree<>::from_parents(parent, leaf, classes)); });
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

void fuzz_apply_sgd(bytes& in) {
  const index_t n = 1 + in.small(20), d = 1 + in.small(6);
  xs::full_softmax<xs::fp32, xs::serial> head(n, d, in.take<std::uint8_t>() % 2 == 0);
  const std::vector<float> before(head.weights().data, head.weights().data + n * d);
  xs::full_softmax<xs::fp32, xs::serial>::gradient_type g;
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  bytes in(data, size);
  switch (in.take<std::uint8_t>() % 4) {
    case 0: fuzz_huffman(in); break;
    case 1: fuzz_from_parents(in); break;
    case 2: fuzz_full_verbs(in); break;
    default: fuzz_apply_sgd(in); break;
  }
  return 0;
}
