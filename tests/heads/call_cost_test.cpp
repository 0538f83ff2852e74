// SPDX-License-Identifier: Apache-2.0
// What a training step costs besides its arithmetic (detail::call_counters): working-memory
// allocations, values read back to the host, waits, parallel loops (kernels on a GPU). On a GPU each
// is host-side time, and at small shapes host-side time was most of the gap to PyTorch (1.6 ms
// against 0.83 ms at 1024 x 2304 x 32K before the call's buffers became scratch_vectors:
// bench/RESULTS.md). The generic algorithm is the same on every backend, so the host backends' counts
// guard the device's: a change that adds a read-back, a buffer or a loop to a step fails here and
// must raise its budget on purpose. Each budget also holds the backend vectors a call makes (host
// backends: `counted_allocator`) at 0: a temporary must be scratch (a backend vector on a GPU is a
// cudaMalloc, a value-initialising fill and a device-synchronising cudaFree).
//
// The budgets are the counts measured when this test was written (2026-11-27). The full softmax
// step's 3 read-backs: the data checks (finite hidden rows and targets in range, one scan since
// stop 51; two before), the count of kept rows (it sizes the buffers), the loss; the HS step adds
// its planning's (the run list of each level; the deepest path of the batch unless every class
// sits at one depth). `uploads`: host lists sent to the backend (the HS gradient's
// row ids, a level's runs): a copy on the host, on a GPU queued through page-locked memory without
// a wait (detail/cuda/pinned_staging.cuh; they were waiting copies, counted as read-backs, until
// stop 50).

#include <xsoftmax/detail/call_counters.hpp>
#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selection/sampled_negatives.hpp>
#include <xsoftmax/selective_softmax.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/sharding/sharded_hierarchical_softmax.hpp>
#include <xsoftmax/sharding/solo_communicator.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include "support/per_sample_lists.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using xsoftmax::index_t;
using xsoftmax::matrix_view;
using xsoftmax::vector_view;
using xsoftmax::detail::call_counters;

// Without a CBLAS the blocked GEMM fallback runs parallel loops of its own (up to 4 more a call).
#if defined(XSOFTMAX_HAS_CBLAS)
constexpr std::int64_t extra_loops_without_cblas = 0;
#else
constexpr std::int64_t extra_loops_without_cblas = 4;
#endif

struct budget {
  std::int64_t allocations, host_reads, synchronizations, loops;
  std::int64_t vectors = 0;  // backend vectors made per call: temporaries that should be scratch
  std::int64_t uploads = 0;  // host lists sent to the backend (on a GPU queued, no wait)
};

// The second of two identical steps (the first sizes the gradient's buffers), counted.
template <class Head>
call_counters count_step(const Head& head, index_t rows, index_t dim, index_t classes) {
  std::vector<float> h(static_cast<std::size_t>(rows * dim)), gh(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = 0.01f * static_cast<float>(i % 23) - 0.1f;
  std::vector<index_t> t(static_cast<std::size_t>(rows));
  for (index_t r = 0; r < rows; ++r) t[static_cast<std::size_t>(r)] = (r * 37) % classes;
  typename Head::gradient_type g;
  const auto step = [&] {
    return head.forward_backward(matrix_view<const float>(h.data(), rows, dim),
                                 vector_view<const index_t>(t.data(), rows), matrix_view<float>(gh.data(), rows, dim), g);
  };
  (void)step();
  const call_counters before = call_counters::local();
  (void)step();
  return call_counters::since(before);
}

// The second of two identical calls of `verb` (the first warms every cache), counted.
template <class Verb>
call_counters count_call(Verb&& verb) {
  verb();
  const call_counters before = call_counters::local();
  verb();
  return call_counters::since(before);
}

void check_within(const char* what, const call_counters& c, const budget& b) {
  std::printf("%s: %lld allocations, %lld host reads, %lld synchronizations, %lld loops, %lld backend vectors, "
              "%lld uploads\n",
              what, static_cast<long long>(c.allocations), static_cast<long long>(c.host_reads),
              static_cast<long long>(c.synchronizations), static_cast<long long>(c.loops),
              static_cast<long long>(c.vectors), static_cast<long long>(c.uploads));
  const std::string name = what;  // (a char pointer would print as an address)
  CAPTURE(name);
  CHECK(c.allocations <= b.allocations);
  CHECK(c.host_reads <= b.host_reads);
  CHECK(c.synchronizations <= b.synchronizations);
  CHECK(c.loops <= b.loops + extra_loops_without_cblas);
  CHECK(c.vectors <= b.vectors);
  CHECK(c.uploads <= b.uploads);
  CHECK(c.loops > 0);  // the counters count: a step launches loops
}

TEST_CASE("call cost: a full softmax training step stays within its allocations, read-backs and loops") {
  const index_t rows = 64, dim = 16, classes = 500;
  const xsoftmax::full_softmax<xsoftmax::fp32, xsoftmax::serial> head(classes, dim);
  // 17 allocations: the 13 of every backend and the host's exponential-form buffers (the chunks'
  // shifts, a_r, E W and a H: backend vectors until 2026-11-29, uncounted; a GPU never makes them).
  check_within("full_softmax step", count_step(head, rows, dim, classes), {17, 3, 0, 14});
  // Into a dense gradient (the caller's memory): no gradient vectors, the same buffers otherwise
  // (fp32); a bf16 head's step into a bf16 gradient: its counts when this case was written.
  std::vector<float> h(static_cast<std::size_t>(rows * dim), 0.05f), gh(h.size()), gw(static_cast<std::size_t>(classes * dim));
  std::vector<index_t> t(static_cast<std::size_t>(rows));
  for (index_t r = 0; r < rows; ++r) t[static_cast<std::size_t>(r)] = (r * 37) % classes;
  const auto hv = matrix_view<const float>(h.data(), rows, dim);
  const auto tv = vector_view<const index_t>(t.data(), rows);
  check_within("full_softmax step, dense gradient", count_call([&] {
                 (void)head.forward_backward(hv, tv, matrix_view<float>(gh.data(), rows, dim),
                                             xsoftmax::dense_gradient<float>{matrix_view<float>(gw.data(), classes, dim)});
               }),
               {17, 3, 0, 14});
  using bf16_t = xsoftmax::bf16::storage_type;
  std::vector<bf16_t> w16(static_cast<std::size_t>(classes * dim), xsoftmax::from_float<bf16_t>(0.01f)), gw16(w16.size());
  const xsoftmax::full_softmax<xsoftmax::bf16, xsoftmax::serial> head16(matrix_view<bf16_t>(w16.data(), classes, dim));
  check_within("full_softmax bf16 step, dense bf16 gradient", count_call([&] {
                 (void)head16.forward_backward(hv, tv, matrix_view<float>(gh.data(), rows, dim),
                                               xsoftmax::dense_gradient<bf16_t>{matrix_view<bf16_t>(gw16.data(), classes, dim)});
               }),
               {19, 3, 0, 14});
}

TEST_CASE("call cost: a hierarchical softmax training step stays within its allocations, read-backs and loops") {
  const index_t rows = 64, dim = 16, classes = 500;
  xsoftmax::hierarchical_softmax<xsoftmax::uniform_tree<2, 32>, xsoftmax::fp32, xsoftmax::serial> head(
      xsoftmax::uniform_tree<2, 32>(classes), dim);
  // The GPU's default (the host's is 1 with a CBLAS, 16 without): runs of 16 rows or more through the
  // dense softmax, the others through gather-dot, whatever BLAS this build found.
  head.set_gemm_min_run(16);
  check_within("hierarchical_softmax step", count_step(head, rows, dim, classes), {25, 3, 0, 20, 0, 1});
}

TEST_CASE("call cost: the full softmax's forward, top-k and log_distribution stay within their budgets") {
  // The score-reading verbs (detail/primitives/score_chunks.hpp): their score buffer is a
  // scratch_vector (was a value-initialised backend vector, uncounted). The budgets are the serial
  // backend's counts when this case was written (2026-11-29): the forward reads back what the step
  // does but the upstream gradient (hidden finite, targets, kept rows, loss); top-k and
  // log_distribution only the finite check of the hidden rows, and wait once, at the end.
  const index_t rows = 64, dim = 16, classes = 500, k = 5;
  const xsoftmax::full_softmax<xsoftmax::fp32, xsoftmax::serial> head(classes, dim);
  std::vector<float> h(static_cast<std::size_t>(rows * dim));
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = 0.01f * static_cast<float>(i % 19) - 0.09f;
  std::vector<index_t> t(static_cast<std::size_t>(rows)), cls(static_cast<std::size_t>(rows * k));
  for (index_t r = 0; r < rows; ++r) t[static_cast<std::size_t>(r)] = (r * 41) % classes;
  std::vector<float> lp(cls.size()), dist(static_cast<std::size_t>(rows * 100));
  const matrix_view<const float> hv(h.data(), rows, dim);
  check_within("full_softmax forward",
               count_call([&] { (void)head.forward(hv, vector_view<const index_t>(t.data(), rows)); }), {11, 3, 0, 7});
  check_within("full_softmax topk", count_call([&] {
                 head.topk(hv, k, matrix_view<index_t>(cls.data(), rows, k), matrix_view<float>(lp.data(), rows, k));
               }),
               {11, 1, 1, 7});
  check_within("full_softmax log_distribution", count_call([&] {
                 head.log_distribution(hv, 100, 200, matrix_view<float>(dist.data(), rows, 100));
               }),
               {9, 1, 1, 5});
  // The loss and the top-k from one pass: the forward's read-backs and no wait before the loss is
  // read; three more buffers (the top-k state) and loops (its start, finish and output) than forward.
  check_within("full_softmax forward_topk", count_call([&] {
                 (void)head.forward_topk(hv, vector_view<const index_t>(t.data(), rows), k,
                                         matrix_view<index_t>(cls.data(), rows, k),
                                         matrix_view<float>(lp.data(), rows, k));
               }),
               {14, 3, 0, 10});
}

TEST_CASE("call cost: the hierarchical softmax's top-k and log_distribution stay within their budgets") {
  // Their working memory (the search's open lists and flags, the range's plan and log-probabilities)
  // is scratch (counted); budgets: the serial backend's counts when this case was written
  // (2026-11-29). The searches' two read-backs: the finite check and whether an open list
  // overflowed; log_distribution's two: the finite check, and the one copy of the range's plan (five
  // lists that were five device vectors, each copied on its own).
  const index_t rows = 64, dim = 16, classes = 500, k = 5;
  const xsoftmax::hierarchical_softmax<xsoftmax::uniform_tree<2, 32>, xsoftmax::fp32, xsoftmax::serial> head(
      xsoftmax::uniform_tree<2, 32>(classes), dim);
  std::vector<float> h(static_cast<std::size_t>(rows * dim));
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = 0.01f * static_cast<float>(i % 19) - 0.09f;
  std::vector<index_t> cls(static_cast<std::size_t>(rows * k));
  std::vector<float> lp(cls.size()), dist(static_cast<std::size_t>(rows * 100));
  const matrix_view<const float> hv(h.data(), rows, dim);
  xsoftmax::search_options beam;
  beam.beam_width = 4;
  check_within("hierarchical_softmax topk (exact)", count_call([&] {
                 head.topk(hv, k, matrix_view<index_t>(cls.data(), rows, k), matrix_view<float>(lp.data(), rows, k));
               }),
               {4, 2, 0, 5});
  check_within("hierarchical_softmax topk (beam 4)", count_call([&] {
                 head.topk(hv, k, matrix_view<index_t>(cls.data(), rows, k), matrix_view<float>(lp.data(), rows, k), beam);
               }),
               {4, 2, 0, 5});
  check_within("hierarchical_softmax log_distribution", count_call([&] {
                 head.log_distribution(hv, 100, 200, matrix_view<float>(dist.data(), rows, 100));
               }),
               {2, 1, 1, 2, 0, 1});
}

}  // namespace

TEST_CASE("call cost: the selective heads' training steps stay within their budgets") {
  // A step's active set is working memory of the call (detail/selection/scratch_active_set.hpp) and
  // so are the passes' buffers: no backend vector is made per step (sampled: 3 were, and 8 of the
  // pass's; KNN: 1 and 5). Budgets: the serial backend's counts when this case was written
  // (2026-11-29). The KNN step's 5 read-backs: the data checks (finite hidden values and valid
  // targets, one scan since stop 51), kept rows, the set's count (`sort_unique`; empty neighbour slots hold the target, not -1), every chunk's first and last
  // column (one copy for both passes; was two reads a chunk a pass), the loss; the library's
  // selectors' sets are not re-checked (`sets_valid_by_construction`: was two more). The sampled
  // step adds the copy of the host-drawn classes; the per-sample step has the lists' two counts
  // (`sorted_rows`), explicit_candidates' count of entries and sparse_accumulate's count of rows.
  const index_t rows = 64, dim = 16, classes = 500;
  xsoftmax::sampling_options so;
  so.num_sampled = 40;
  const xsoftmax::selective_softmax<xsoftmax::sampled_negatives, xsoftmax::fp32, xsoftmax::serial> sampled(
      xsoftmax::sampled_negatives::log_uniform(classes, so), classes, dim);
  check_within("sampled_softmax step", count_step(sampled, rows, dim, classes), {24, 5, 0, 19, 0, 1});
  xsoftmax::knn_options ko;
  ko.graph.k = 8;
  const xsoftmax::knn_softmax<xsoftmax::fp32, xsoftmax::serial> knn(classes, dim, ko);
  check_within("knn_softmax step", count_step(knn, rows, dim, classes), {21, 5, 0, 17, 0});
  // Per-sample lists (the per-sample pass and its sparse accumulation).
  const xsoftmax::explicit_candidates lists = xsoftmax_test::per_sample_lists(rows, classes, 6);
  const xsoftmax::selective_softmax<xsoftmax::explicit_candidates, xsoftmax::fp32, xsoftmax::serial> per_sample(
      lists, classes, dim);
  check_within("per-sample selective_softmax step", count_step(per_sample, rows, dim, classes), {22, 7, 0, 13, 0});
}

TEST_CASE("call cost: the class-sharded heads' steps and top-k (one rank) stay within their budgets") {
  // One rank (solo_communicator): the sharded algorithm's own buffers, without a transport's. Its
  // top-k packs every rank's candidates where they live (was a round trip through the host).
  const index_t rows = 64, dim = 16, classes = 500;
  using sharding = xsoftmax::class_sharding<xsoftmax::solo_communicator>;
  std::vector<float> w(static_cast<std::size_t>(classes * dim));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i % 29) - 0.14f;
  for (auto layout : {xsoftmax::hidden_layout::data_parallel, xsoftmax::hidden_layout::replicated}) {
    const bool gathered = layout == xsoftmax::hidden_layout::data_parallel;  // its rows all-gathered first
    CAPTURE(gathered);
    const xsoftmax::full_softmax<xsoftmax::fp32, xsoftmax::serial, sharding> head(
        sharding({}, classes, layout), matrix_view<float>(w.data(), classes, dim));
    check_within("sharded full_softmax step", count_step(head, rows, dim, classes),
                 {gathered ? 25 : 21, 3, 0, 13, 0});
    std::vector<float> h(static_cast<std::size_t>(rows * dim), 0.05f), lp(static_cast<std::size_t>(rows * 5));
    std::vector<index_t> cls(lp.size());
    check_within("sharded full_softmax topk", count_call([&] {
                   head.topk(matrix_view<const float>(h.data(), rows, dim), 5, matrix_view<index_t>(cls.data(), rows, 5),
                             matrix_view<float>(lp.data(), rows, 5));
                 }),
                 {gathered ? 19 : 17, 1, 1, 9, 0});
    std::vector<index_t> t(static_cast<std::size_t>(rows));
    for (index_t r = 0; r < rows; ++r) t[static_cast<std::size_t>(r)] = (r * 37) % classes;
    check_within("sharded full_softmax forward_topk", count_call([&] {
                   (void)head.forward_topk(matrix_view<const float>(h.data(), rows, dim),
                                           vector_view<const index_t>(t.data(), rows), 5,
                                           matrix_view<index_t>(cls.data(), rows, 5),
                                           matrix_view<float>(lp.data(), rows, 5));
                 }),
                 {gathered ? 24 : 22, 3, 0, 13, 0});
    xsoftmax::sampling_options so;
    so.num_sampled = 40;
    const xsoftmax::selective_softmax<xsoftmax::sampled_negatives, xsoftmax::fp32, xsoftmax::serial, sharding> sampled(
        xsoftmax::sampled_negatives::log_uniform(classes, so), sharding({}, classes, layout),
        matrix_view<float>(w.data(), classes, dim));
    check_within("sharded sampled_softmax step", count_step(sampled, rows, dim, classes),
                 {gathered ? 37 : 31, 7, 0, gathered ? 23 : 22, 0, 1});
  }
}

TEST_CASE("call cost: the sharded hierarchical softmax's step (one rank) stays within its budget") {
  // Binary Huffman with sigmoid nodes, cut at depth 3 (the top tree, then the subtrees' forest, on
  // the one rank). The top head's and the forest's gradients within the step are kept by the head
  // (were 4 backend vectors a step); the routing's buffers come from its pool. Budgets: the serial
  // backend's counts when this case was written (2026-11-29).
  const index_t rows = 64, dim = 16;
  std::vector<double> counts(257);
  for (std::size_t c = 0; c < counts.size(); ++c) counts[c] = 1.0 / static_cast<double>(c + 1);
  using tree = xsoftmax::runtime_tree<>;
  const tree full = tree::huffman(counts);
  using F = xsoftmax::sigmoid_nodes;
  using sharded = xsoftmax::sharded_hierarchical_softmax<xsoftmax::solo_communicator, F, xsoftmax::fp32, xsoftmax::serial>;
  xsoftmax::hs_shard_options o;
  o.cut_depth = 3;
  const xsoftmax::hs_shard_plan<64, F> plan(full, 1, o);
  const index_t top_rows = static_cast<index_t>(plan.top_rows().size()), local_rows = static_cast<index_t>(plan.local_rows(0).size());
  std::vector<float> top(static_cast<std::size_t>(top_rows * dim), 0.02f), local(static_cast<std::size_t>(local_rows * dim), -0.01f);
  const sharded head(plan, xsoftmax::solo_communicator{}, matrix_view<float>(top.data(), top_rows, dim),
                     matrix_view<float>(local.data(), local_rows, dim));
  std::vector<float> h(static_cast<std::size_t>(rows * dim)), gh(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = 0.01f * static_cast<float>(i % 23) - 0.1f;
  std::vector<index_t> t(static_cast<std::size_t>(rows));
  for (index_t r = 0; r < rows; ++r) t[static_cast<std::size_t>(r)] = (r * 37) % 257;
  typename sharded::gradient_type g_top, g_local;
  check_within("sharded hierarchical_softmax step", count_call([&] {
                 (void)head.forward_backward(matrix_view<const float>(h.data(), rows, dim),
                                             vector_view<const index_t>(t.data(), rows),
                                             matrix_view<float>(gh.data(), rows, dim), g_top, g_local);
               }),
               {47, 12, 6, 31, 0, 9});
}
