// SPDX-License-Identifier: Apache-2.0
// The full softmax's training-step layout (full_softmax::training_plan, detail/full_softmax_plan.hpp):
// the device backends' automatic plan at the shapes it was chosen from (bench/RESULTS.md, the H200
// session) and at its edges (every score kept, blocks, one block when blocks would be too small,
// a caller's chunk, fewer classes than a chunk); the host backends' automatic plan (blocks whose
// scores fit the weight gradient's size, the 64 MiB floor, too-small blocks) and what the setters say;
// the setters ending the automatic plan and use_automatic_plan returning to it. On cuda (the GPU
// test binary) the head's plan is the automatic one and its results match the serial head's.

#include "support/head_checks.hpp"

#include <xsoftmax/detail/full_softmax_plan.hpp>
#include <xsoftmax/full_softmax.hpp>

#include <doctest/doctest.h>

#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::detail::automatic_device_plan;
using xsoftmax::detail::automatic_host_plan;
constexpr index_t mib = index_t(1) << 20, default_cache = xsoftmax::full_softmax<>::default_score_cache_bytes;

}  // namespace

TEST_CASE("automatic device plan: blocks that keep every score where they fit 2 GiB and pay") {
  // The measured shape, 8192 x 256K: blocks of 2048 rows (2 GiB of scores each), 16384-column chunks.
  auto p = automatic_device_plan(8192, 262144, 0, default_cache);
  CHECK(p.row_block == 2048);
  CHECK(p.score_cache_bytes == index_t(2048) * 262144 * 4);
  CHECK(p.chunk == 16384);
  // A small call's every score fits: one block, all kept.
  p = automatic_device_plan(1024, 32768, 0, default_cache);
  CHECK(p.row_block == 0);
  CHECK(p.score_cache_bytes == index_t(1024) * 32768 * 4);
  CHECK(p.chunk == 16384);
  // Exactly the budget's rows: still one block.
  p = automatic_device_plan(2048, 262144, 0, default_cache);
  CHECK(p.row_block == 0);
  CHECK(p.score_cache_bytes == 2048 * mib);
  // 1M classes: 512 rows fit, too few to pay for a block: one block, the default cache, chunks
  // through the work buffer (~256 MiB of scores, at most 16384 columns).
  p = automatic_device_plan(4096, 1 << 20, 0, default_cache);
  CHECK(p.row_block == 0);
  CHECK(p.score_cache_bytes == default_cache);
  CHECK(p.chunk == 16384);
  p = automatic_device_plan(8192, 10000000, 0, default_cache);
  CHECK(p.row_block == 0);
  CHECK(p.chunk == 8192);
  // Blocks are multiples of 256 rows: 2 GiB / (700000 x 4) = 766 rows -> 768 < 1024: no blocks;
  // at 400000 classes 1342 rows fit -> blocks of 1280.
  CHECK(automatic_device_plan(8192, 700000, 0, default_cache).row_block == 0);
  CHECK(automatic_device_plan(8192, 400000, 0, default_cache).row_block == 1280);
  // A caller's chunk is kept; no chunk is wider than the classes; empty batches plan too.
  CHECK(automatic_device_plan(8192, 262144, 4096, default_cache).chunk == 4096);
  CHECK(automatic_device_plan(8192, 1000, 0, default_cache).chunk == 1000);
  CHECK(automatic_device_plan(0, 1000, 0, default_cache).chunk == 1000);
  CHECK(xsoftmax::detail::device_chunk_columns(1) == 16384);
  CHECK(xsoftmax::detail::device_chunk_columns(1 << 20) == 256);
}

TEST_CASE("automatic host plan: blocks whose scores fit the weight gradient's size keep every score") {
  // The measured shapes (bench/RESULTS.md): B = 1024, d = 256, N = 1e5 and 1e6: blocks of 256 rows,
  // each keeping all its scores (N x 256 x 4 bytes: the weight gradient's size).
  for (index_t n : {index_t(100000), index_t(1000000)}) {
    const auto p = automatic_host_plan(1024, n, 256, default_cache);
    CHECK(p.row_block == 256);
    CHECK(p.score_cache_bytes == 256 * n * 4);
    CHECK(p.chunk == 0);  // sized by the head for a block's rows
  }
  // The whole batch fits: one block keeping every score (exactly B x N x 4 bytes).
  auto p = automatic_host_plan(200, 100000, 256, default_cache);
  CHECK(p.row_block == 0);
  CHECK(p.score_cache_bytes == 200 * 100000 * 4);
  // 64 MiB is the least budget: a small d does not shrink the blocks below what 64 MiB holds.
  p = automatic_host_plan(1024, 50000, 16, default_cache);
  CHECK(p.row_block == 320);  // 64 MiB / 200,000 bytes = 335 rows, down to a multiple of 64
  // Blocks under 128 rows do not pay: one block with the default cache.
  p = automatic_host_plan(1024, 10000000, 64, default_cache);
  CHECK(p.row_block == 0);
  CHECK(p.score_cache_bytes == default_cache);
  // Empty shapes.
  CHECK(automatic_host_plan(0, 1000, 8, default_cache).row_block == 0);
  CHECK(automatic_host_plan(10, 0, 8, default_cache).score_cache_bytes == 10 * 4);
}

TEST_CASE_TEMPLATE("full_softmax training_plan: the setters end the automatic plan; use_automatic_plan returns",
                   B, XSOFTMAX_TEST_BACKENDS) {
  const index_t n = 40, d = 4;
  test_vector<float> w(static_cast<std::size_t>(n * d), 0.25f);
  xsoftmax::full_softmax<xsoftmax::fp32, B> head(mview(w, n, d));
  CHECK(head.automatic_plan());
  auto p = head.training_plan(100);
  if constexpr (xsoftmax::is_host_backend<B>) {
    CHECK(p.row_block == 0);
    CHECK(p.score_cache_bytes == 100 * n * 4);  // every score: 16 KB fit 64 MiB
    CHECK(p.chunk == n);  // ~32 MiB of scores is more than 40 classes
    const auto a = automatic_host_plan(100, n, d, default_cache);
    CHECK(p.score_cache_bytes == a.score_cache_bytes);
  } else {
    const auto a = automatic_device_plan(100, n, 0, default_cache);
    CHECK(p.row_block == a.row_block);
    CHECK(p.score_cache_bytes == a.score_cache_bytes);
    CHECK(p.chunk == a.chunk);
  }
  head.set_chunk_size(7);  // the chunk alone leaves the automatic plan
  CHECK(head.automatic_plan());
  CHECK(head.training_plan(100).chunk == 7);
  head.set_row_block(30);
  CHECK_FALSE(head.automatic_plan());
  p = head.training_plan(100);
  CHECK(p.row_block == 30);
  CHECK(p.score_cache_bytes == default_cache);
  CHECK(head.training_plan(30).row_block == 0);  // a block as large as the batch is the batch
  head.use_automatic_plan();
  CHECK(head.automatic_plan());
  CHECK(head.row_block() == 0);
  CHECK(head.score_cache_bytes() == default_cache);
  head.set_score_cache_bytes(0);
  CHECK_FALSE(head.automatic_plan());
  CHECK(head.training_plan(100).score_cache_bytes == 0);
  head.use_automatic_plan();
  head.keep_scores_in_row_blocks(16);
  CHECK_FALSE(head.automatic_plan());
  p = head.training_plan(100);
  CHECK(p.row_block == 16);
  CHECK(p.score_cache_bytes == 16 * n * 4);
}

TEST_CASE_TEMPLATE("full_softmax automatic plan: loss and gradients match the float64 reference and finite differences",
                   B, XSOFTMAX_TEST_BACKENDS) {
  // Whatever the plan chooses (on cuda: every score kept, 16384-class chunks), the step is the
  // same function.
  test_rng rng(7);
  const index_t n = 300, d = 8, batch = 21;
  problem p = make_problem(rng, n, n, d, batch, true, 0.1);
  xsoftmax::full_softmax<xsoftmax::fp32, B> head(mview(p.w, p.rows, p.dim), p.b.data());
  REQUIRE(head.automatic_plan());
  const auto hb = make_hidden<float>(p.h, batch, d);
  check_gradients(head, full_reference(), p.params(), hb, p.targets, xsoftmax::loss_options{}, {},
                  "automatic plan, mean");
  xsoftmax::loss_options none;
  none.reduce = xsoftmax::reduction::none;
  check_gradients(head, full_reference(), p.params(), hb, p.targets, none, random_grad_output(rng, batch),
                  "automatic plan, per-sample upstream");
}
