// SPDX-License-Identifier: Apache-2.0
// The tuned parts of the CUDA dense softmax (detail/cuda/dense_tuned.cuh) against their oracles, the
// generic versions on the same backend: the bf16/fp16 tensor-core kernels (dense_softmax against
// dense_softmax_generic: loss, grad_h, grad_w and grad_b, over several chunks, with and without bias
// and score cache, in row blocks, over gathered columns with and without logit offsets, chunks narrow and wide (the row-wise gradient kernel, vectorised
// and not), within the storage type's tolerance, support.cuh), with gradient filtering (the tuned
// path's GEMMs over the kept columns only against the generic zeroed entries), and the block-per-row online
// log-sum-exp (online_lse_update against online_lse_update_generic, with -inf scores, rows read
// as scalars and as 16-byte vectors), and the
// block-per-row running top-k (detail/cuda/topk_tuned.cuh: row_topk_update against
// row_topk_update_generic, with ties, -inf scores and listed ids, over many chunks, and where a
// full heap's cutoff lets every column through; bit for bit).

#include "support.cuh"

#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

namespace xs = xsoftmax;

namespace {

using namespace xsoftmax_cuda_test;

/// The selective heads' form of the problem: the n columns are gathered weight rows of a larger
/// matrix (a contiguous run, then every third row: chunks both contiguous and not), with logit
/// offsets (some negatives removed by -inf, the targets' offsets finite).
struct gathered_columns {
  bool on = false;
  bool offsets = false;
};

template <class T>
void tuned_equals_generic(index_t rows, index_t n, index_t d, index_t chunk, bool with_bias, unsigned seed,
                          index_t score_cache_bytes = 0, index_t row_block = 0, gathered_columns gc = {},
                          float gradient_filter = 0.f, float weight_scale = 0.3f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const index_t weight_rows = gc.on ? 3 * n + 5 : n;
  std::vector<index_t> columns;
  for (index_t j = 0; gc.on && j < n; ++j) columns.push_back(j < n / 2 ? j : n / 2 + 3 * (j - n / 2) + 1);
  std::vector<float> h(static_cast<std::size_t>(rows * d)), up(static_cast<std::size_t>(rows));
  std::vector<T> w(static_cast<std::size_t>(weight_rows * d)), b(static_cast<std::size_t>(weight_rows));
  std::vector<index_t> t(static_cast<std::size_t>(rows));
  for (auto& x : h) x = nd(g);
  for (auto& x : w) x = xs::from_float<T>(weight_scale * nd(g));
  for (auto& x : b) x = xs::from_float<T>(0.1f * nd(g));
  for (auto& x : up) x = 1.f / static_cast<float>(rows);
  for (auto& x : t) x = static_cast<index_t>(g() % n);
  std::vector<float> negative(static_cast<std::size_t>(n)), target_off(static_cast<std::size_t>(n));
  for (index_t j = 0; j < n; ++j) {
    negative[static_cast<std::size_t>(j)] = j % 17 == 5 ? -INFINITY : 0.5f * nd(g);
    target_off[static_cast<std::size_t>(j)] = 0.5f * nd(g);
  }
  const auto dh = to_device(h), dup = to_device(up);
  const auto dw = to_device(w), db = to_device(b);
  const auto dt = to_device(t);
  const auto dcol = to_device(columns);
  const auto dneg = to_device(negative), dtoff = to_device(target_off);
  const xs::cuda_resources res;
  const xs::detail::execution<xs::cuda> ex{res};

  struct outputs {
    std::vector<float> loss, gh, gw, gb;
  };
  const auto solve = [&](bool tuned) {
    thrust::device_vector<float> loss(static_cast<std::size_t>(rows), 0.f), gh(static_cast<std::size_t>(rows * d), 0.f);
    thrust::device_vector<float> gw(static_cast<std::size_t>(n * d)), gb(static_cast<std::size_t>(n));
    xs::detail::dense_softmax_args a;
    a.h = matrix_view<const float>(thrust::raw_pointer_cast(dh.data()), rows, d);
    a.target = thrust::raw_pointer_cast(dt.data());
    a.n = n;
    a.chunk = chunk;
    a.score_cache_bytes = score_cache_bytes;
    a.row_block = row_block;
    a.loss = thrust::raw_pointer_cast(loss.data());
    a.upstream = thrust::raw_pointer_cast(dup.data());
    a.grad_h = thrust::raw_pointer_cast(gh.data());
    a.grad_w = thrust::raw_pointer_cast(gw.data());
    a.grad_b = with_bias ? thrust::raw_pointer_cast(gb.data()) : nullptr;
    a.gradient_filter = gradient_filter;
    if (gc.on) a.columns = thrust::raw_pointer_cast(dcol.data());
    if (gc.offsets) {
      a.negative_offset = thrust::raw_pointer_cast(dneg.data());
      a.target_offset = thrust::raw_pointer_cast(dtoff.data());
    }
    const matrix_view<const T> wv(thrust::raw_pointer_cast(dw.data()), weight_rows, d);
    const T* bias = with_bias ? thrust::raw_pointer_cast(db.data()) : nullptr;
    if (tuned) {
      REQUIRE(xs::detail::dense_softmax_tuning<xs::cuda, T>::applies(a));
      xs::detail::dense_softmax(ex, wv, bias, a);
    } else {
      xs::detail::dense_softmax_generic(ex, wv, bias, a);
    }
    res.synchronize();
    return outputs{to_host(loss), to_host(gh), to_host(gw), to_host(gb)};
  };
  const outputs tuned = solve(true), generic = solve(false);
  const double tol = tolerance_for<T>();
  CHECK(relative_gap(tuned.loss, generic.loss) < tol);
  CHECK(relative_gap(tuned.gh, generic.gh) < tol);
  CHECK(relative_gap(tuned.gw, generic.gw) < tol);
  if (with_bias) CHECK(relative_gap(tuned.gb, generic.gb) < tol);
}

}  // namespace

TEST_CASE("cuda dense_softmax: the tuned bf16/fp16 path equals the generic primitive (its oracle)") {
  static_assert(xs::detail::dense_softmax_tuning<xs::cuda, __nv_bfloat16>::available);
  static_assert(!xs::detail::dense_softmax_tuning<xs::cuda, float>::available);
  tuned_equals_generic<__nv_bfloat16>(33, 1000, 40, 256, true, 1);
  tuned_equals_generic<__nv_bfloat16>(7, 513, 130, 100, false, 2);
  tuned_equals_generic<__half>(33, 1000, 40, 256, true, 3);
  tuned_equals_generic<__half>(64, 2049, 17, 512, false, 4);
  tuned_equals_generic<__nv_bfloat16>(33, 1000, 40, 256, true, 5, 33 * 512 * 4);  // 2 of 4 chunks kept
  // Row blocks of 8 (the last of 1), each keeping all its scores: grad_w and grad_b added up
  tuned_equals_generic<__nv_bfloat16>(33, 1000, 40, 256, true, 6, 8 * 1000 * 4, 8);
  tuned_equals_generic<__half>(64, 2049, 17, 512, false, 7, 0, 20);  // blocks recomputing every chunk
  // Chunks of 1024 columns or more take the row-wise gradient kernel: vectorised (multiples of 4,
  // the narrow last chunk on the element-wise kernel), scalar (1250 columns), and in row blocks
  // that keep every score (chunks at offsets rows x 2052 floats in the cache).
  tuned_equals_generic<__nv_bfloat16>(40, 3001, 24, 1024, true, 8);
  tuned_equals_generic<__half>(33, 2500, 24, 1250, false, 9);
  tuned_equals_generic<__nv_bfloat16>(21, 4100, 16, 2052, true, 10, 8 * 4100 * 4, 8);
  // Gathered columns (the selective heads), with and without logit offsets, narrow and wide
  // chunks, with a bias and a score cache keeping the first chunk (the backward then re-gathers it).
  tuned_equals_generic<__nv_bfloat16>(33, 1000, 40, 256, true, 11, 0, 0, {true, false});
  tuned_equals_generic<__half>(19, 700, 24, 128, false, 12, 19 * 128 * 4, 0, {true, true});
  tuned_equals_generic<__nv_bfloat16>(24, 2600, 16, 1024, true, 13, 24 * 1024 * 4, 0, {true, true});
}

TEST_CASE("cuda dense_softmax: gradient filtering, the tuned path's kept columns equal the generic zeros") {
  // The generic path zeroes the filtered entries of G; the tuned one also leaves every column with
  // no kept entry out of its GEMMs when at most half a chunk's columns are kept. Peaked scores
  // (weights of scale 1.5, 40 dims) put most probabilities far below the cut. Filters from
  // Cut Cross-Entropy's bf16 value (2^-12: most columns kept, the dense GEMMs) to 0.9 (only the
  // targets' columns kept): narrow and wide chunks, a bias, row blocks accumulating into grad_w,
  // gathered columns with offsets, fp16.
  const float cce_bf16 = 1.f / 4096.f;
  tuned_equals_generic<__nv_bfloat16>(33, 1000, 40, 256, true, 31, 0, 0, {}, cce_bf16, 1.5f);
  tuned_equals_generic<__nv_bfloat16>(33, 1000, 40, 256, true, 32, 0, 0, {}, 0.02f, 1.5f);
  tuned_equals_generic<__nv_bfloat16>(40, 3001, 24, 1024, false, 33, 0, 0, {}, 0.9f, 1.5f);
  tuned_equals_generic<__nv_bfloat16>(21, 4100, 16, 2052, true, 34, 8 * 4100 * 4, 8, {}, 0.05f, 1.5f);
  tuned_equals_generic<__half>(64, 2049, 17, 512, false, 35, 0, 20, {}, 0.02f, 1.5f);
  tuned_equals_generic<__nv_bfloat16>(24, 2600, 16, 1024, true, 36, 24 * 1024 * 4, 0, {true, true}, 0.05f, 1.5f);
}

TEST_CASE("cuda online_lse_update: the block-per-row kernel equals the generic loop (its oracle)") {
  static_assert(xs::detail::online_lse_tuning<xs::cuda>::available);
  // Rows of an odd stride (scalar reads), then of a multiple of 4 (16-byte reads, with a tail).
  const std::tuple<index_t, index_t, index_t> layouts[] = {{700, 713, 300}, {2101, 2104, 1024}};
  for (const auto& layout : layouts) {
    const index_t cols = std::get<0>(layout), lds = std::get<1>(layout), chunk = std::get<2>(layout);
    CAPTURE(lds);
    const index_t rows = 37;
    std::mt19937 g(7);
    std::normal_distribution<float> nd(0.f, 3.f);
    std::vector<float> s(static_cast<std::size_t>(rows * lds));
    for (auto& x : s) x = nd(g);
    for (index_t j = 0; j < cols; ++j) s[static_cast<std::size_t>(3 * lds + j)] = -INFINITY;  // fully masked row
    for (index_t j = 0; j < chunk; ++j) s[static_cast<std::size_t>(5 * lds + j)] = -INFINITY;  // masked 1st chunk
    std::vector<index_t> t(static_cast<std::size_t>(rows));
    for (auto& x : t) x = static_cast<index_t>(g() % cols);
    const auto ds = to_device(s);
    const auto dt = to_device(t);
    const xs::cuda_resources res;
    const xs::detail::execution<xs::cuda> ex{res};
    const auto fold = [&](bool tuned) {
      xs::detail::basic_online_lse_state<xs::cuda> st(rows, ex);
      for (index_t c0 = 0; c0 < cols; c0 += chunk) {
        const float* sp = thrust::raw_pointer_cast(ds.data()) + c0;
        const index_t cn = std::min(chunk, cols - c0);
        if (tuned) xs::detail::online_lse_update(ex, sp, rows, cn, lds, c0, thrust::raw_pointer_cast(dt.data()), st);
        else xs::detail::online_lse_update_generic(ex, sp, rows, cn, lds, c0, thrust::raw_pointer_cast(dt.data()), st);
      }
      thrust::device_vector<float> lse(static_cast<std::size_t>(rows));
      xs::detail::online_lse_finish(ex, st, rows, thrust::raw_pointer_cast(lse.data()));
      res.synchronize();
      return std::make_pair(to_host(lse), to_host(st.target_logit));
    };
    auto tuned = fold(true), generic = fold(false);
    CHECK(std::isinf(tuned.first[3]));
    CHECK(std::isinf(generic.first[3]));
    tuned.first[3] = generic.first[3] = 0.f;
    CHECK(relative_gap(tuned.first, generic.first) < 1e-5);
    CHECK(tuned.second == generic.second);  // the target's score, copied
  }
}

TEST_CASE("cuda row_topk_update: the block-per-row kernel equals the generic loop (its oracle)") {
  static_assert(xs::detail::row_topk_tuning<xs::detail::execution<xs::cuda>>::available);
  const xs::cuda_resources res;
  const xs::detail::execution<xs::cuda> ex{res};
  // (rows, columns per chunk, chunks, k, distinct score values (0: continuous), listed ids, each
  // chunk's scores above every earlier chunk's)
  struct shape {
    index_t rows, cols, chunks, k, levels;
    bool listed, rising = false;
  };
  const shape shapes[] = {{37, 1000, 3, 10, 0, false}, {20, 5000, 2, 1, 0, false},  {9, 700, 2, 100, 0, true},
                          {12, 900, 2, 300, 0, false},  {15, 3000, 2, 5, 3, false}, {6, 2500, 1, 40, 1, true},
                          {4, 3000, 2, 300, 0, false},  // more candidates than the block's slots
                          // a full heap's cutoff alone in most chunks: the row read once
                          {30, 4000, 8, 10, 0, false}, {11, 2100, 6, 256, 0, true},
                          // the heap's cutoff lets every column through: narrowed again by the threads' bests
                          {7, 5000, 4, 10, 0, false, true}, {5, 3000, 3, 200, 0, true, true},
                          {6, 2600, 3, 10, 2, false, true}};
  unsigned seed = 20;
  for (const shape& sh : shapes) {
    std::mt19937 g(seed++);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> s(static_cast<std::size_t>(sh.rows * sh.cols));
    std::vector<index_t> ids(static_cast<std::size_t>(sh.cols));
    for (index_t j = 0; j < sh.cols; ++j) ids[static_cast<std::size_t>(j)] = (j * 7919) % (sh.cols * 3);  // distinct
    struct result {
      std::vector<float> score;
      std::vector<index_t> index, size;
    };
    const auto run = [&](bool tuned, unsigned data_seed) {
      std::mt19937 gd(data_seed);
      xs::detail::basic_row_topk_state<xs::cuda> st(sh.rows, sh.k, ex);
      for (index_t c = 0; c < sh.chunks; ++c) {
        for (auto& x : s) {
          // Few distinct values: ties everywhere (broken by id); every 17th score -inf (a masked class).
          x = sh.levels ? static_cast<float>(gd() % static_cast<unsigned>(sh.levels)) : nd(gd);
          if (sh.rising) x += 100.f * static_cast<float>(c);
          if (gd() % 17 == 0) x = -INFINITY;
        }
        const auto ds = to_device(s);
        const auto dids = to_device(ids);
        const index_t offset = c * sh.cols;
        if (sh.listed) {
          const xs::detail::listed_ids by{raw(dids)};
          if (tuned) xs::detail::row_topk_update_by(ex, raw(ds), sh.rows, sh.cols, sh.cols, by, st);
          else xs::detail::row_topk_update_generic(ex, raw(ds), sh.rows, sh.cols, sh.cols, by, st);
        } else {
          const xs::detail::offset_ids by{offset};
          if (tuned) xs::detail::row_topk_update_by(ex, raw(ds), sh.rows, sh.cols, sh.cols, by, st);
          else xs::detail::row_topk_update_generic(ex, raw(ds), sh.rows, sh.cols, sh.cols, by, st);
        }
        res.synchronize();
      }
      xs::detail::row_topk_finish(ex, sh.rows, st);
      res.synchronize();
      return result{to_host(st.score), to_host(st.index), to_host(st.size)};
    };
    const result tuned = run(true, seed * 31u), generic = run(false, seed * 31u);
    INFO("rows " << sh.rows << ", cols " << sh.cols << ", chunks " << sh.chunks << ", k " << sh.k << ", levels "
                 << sh.levels << (sh.rising ? ", rising" : ""));
    CHECK(tuned.size == generic.size);
    CHECK(tuned.index == generic.index);
    CHECK(bitwise_equal(tuned.score, generic.score));
  }
}
