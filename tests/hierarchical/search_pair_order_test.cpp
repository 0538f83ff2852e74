// SPDX-License-Identifier: Apache-2.0
// The sigmoid tree's exact search expands a popped node's internal children at once and pushes
// their children in their place (sigmoid_pair_search.hpp). That keeps the one-level search's
// result only when each such child's key is above its children's keys; a runtime_tree numbers
// rows breadth-first, so a child's rows always come after its parent's and the test is never
// false there. Here the tree is numbered the other way (every non-root block reversed: a child's
// rows come before its parent's) and the weights saturated, so children tie their parents in
// log-probability and lose the tie on the row: the search must then keep the child whole. Checked
// against the plain one-row best-first search (a std::priority_queue, no pruning), class for class
// and bit for bit, and against the same search on the breadth-first tree; fails when the key test
// is dropped (checked once by hand).

#include "hierarchical/reference_search.hpp"
#include "support/head_checks.hpp"

#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;

/// A binary runtime tree's view with its non-root blocks stored in reverse order (the root's block
/// stays rows [0, 2)): `old_of_new` / `new_of_old` map the rows.
struct reversed_view {
  xsoftmax::runtime_tree_view<64> base;
  const index_t* old_of_new;
  const index_t* new_of_old;
  [[nodiscard]] index_t root_block_size() const { return base.root_block_size(); }
  [[nodiscard]] index_t num_rows() const { return base.num_rows(); }
  [[nodiscard]] xsoftmax::child_ref child(index_t row) const {
    xsoftmax::child_ref c = base.child(old_of_new[row]);
    if (!c.is_leaf) c.block_begin = new_of_old[c.block_begin];
    return c;
  }
};

/// kind 0: saturated random weights (scores in the tens); kind 1: zero weights and a bias of 0 or
/// +-100 per node: equal siblings (bias 0) whose likely children tie them (+-100), so many open
/// entries share one log-probability and only the rows order them.
template <class B>
void check_reversed(int kind) {
  const index_t n = 300, d = 16, batch = 37;
  std::vector<double> freq(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c) freq[static_cast<size_t>(c)] = 1.0 / double(c + 1);
  const auto tree = xsoftmax::runtime_tree<>::huffman(freq, 2);
  const auto tv = tree.view();
  const index_t rows = tree.num_rows();  // weight rows: rows / 2 (one per internal node)
  // New block start of each old block (blocks are [2i, 2i + 2): the tree is binary).
  std::vector<index_t> old_of_new(static_cast<size_t>(rows)), new_of_old(static_cast<size_t>(rows));
  for (index_t r = 0; r < rows; ++r) {
    const index_t nr = r < 2 ? r : 2 + (rows - (r / 2 * 2 + 2)) + r % 2;
    new_of_old[static_cast<size_t>(r)] = nr;
    old_of_new[static_cast<size_t>(nr)] = r;
  }
  const reversed_view rv{tv, old_of_new.data(), new_of_old.data()};
  index_t against_order = 0;  // internal children numbered before their parent row
  for (index_t r = 0; r < rows; ++r) {
    const xsoftmax::child_ref c = rv.child(r);
    if (!c.is_leaf && c.block_begin < r) ++against_order;
  }
  REQUIRE(against_order > 0);

  test_rng rng(29);
  problem p = make_problem(rng, rows / 2, n, d, batch, true);
  for (auto& x : p.w) x *= kind == 0 ? 60.f : 0.f;  // saturated: a likely child's value rounds to its parent's
  if (kind == 1)
    for (auto& x : p.b) x = x < -0.33f ? -100.f : x > 0.33f ? 100.f : 0.f;
  // The same node's weights and bias under either numbering.
  std::vector<float> w2(p.w.size()), b2(p.b.size());
  for (index_t i = 0; i < rows / 2; ++i) {
    const index_t j = new_of_old[static_cast<size_t>(2 * i)] / 2;
    for (index_t c = 0; c < d; ++c) w2[static_cast<size_t>(j * d + c)] = p.w[static_cast<size_t>(i * d + c)];
    b2[static_cast<size_t>(j)] = p.b[static_cast<size_t>(i)];
  }
  const xsoftmax::matrix_view<const float> w(p.w.data(), rows / 2, d), wr(w2.data(), rows / 2, d);
  const xsoftmax::matrix_view<const float> h(p.h.data(), batch, d);
  xsoftmax::backend_resources<B> res{};
  const xsoftmax::detail::execution<B> ex{res};
  index_t ties = 0;
  for (const index_t k : {index_t(1), index_t(5), index_t(40), n}) {
    std::vector<index_t> cls(static_cast<size_t>(batch * k)), cls2(cls.size()), rc(static_cast<size_t>(k));
    std::vector<float> lps(cls.size()), lps2(cls.size()), rl(static_cast<size_t>(k));
    xsoftmax::detail::tree_topk<true>(ex, rv, h, wr, b2.data(), 2, k, 0, xsoftmax::matrix_view<index_t>(cls.data(), batch, k),
                                      xsoftmax::matrix_view<float>(lps.data(), batch, k));
    xsoftmax::detail::tree_topk<true>(ex, tv, h, w, p.b.data(), 2, k, 0,
                                      xsoftmax::matrix_view<index_t>(cls2.data(), batch, k),
                                      xsoftmax::matrix_view<float>(lps2.data(), batch, k));
    for (index_t i = 0; i < batch; ++i) {
      plain_search<true>(rv, p.h.data() + i * d, wr, b2.data(), k, rc.data(), rl.data(), &ties);
      for (index_t j = 0; j < k; ++j) {
        INFO("k = ", k, ", row ", i, ", rank ", j);
        const size_t o = static_cast<size_t>(i * k + j);
        CHECK(cls[o] == rc[static_cast<size_t>(j)]);
        CHECK(bits(lps[o]) == bits(rl[static_cast<size_t>(j)]));
      }
      // The breadth-first tree's search sees the same values; only tied entries may come in
      // another order (the rows differ), so compare the multiset of log-probabilities' bits.
      std::vector<std::uint32_t> a, b;
      for (index_t j = 0; j < k; ++j) {
        a.push_back(bits(lps[static_cast<size_t>(i * k + j)]));
        b.push_back(bits(lps2[static_cast<size_t>(i * k + j)]));
      }
      CHECK(a == b);
    }
  }
  CHECK(ties > 0);
}

TEST_CASE_TEMPLATE("hs search: the two-level sigmoid search keeps a child that ties above its children", B,
                   xsoftmax::serial, xsoftmax::omp) {
  for (const int kind : {0, 1}) {
    INFO("kind ", kind);
    check_reversed<B>(kind);
  }
}

}  // namespace
