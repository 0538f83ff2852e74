// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The scores of packed rows against a range of weight rows, a chunk of columns at a time, for the
/// verbs that only read scores (the full softmax's top-k and log-distributions, the class-sharded
/// top-k, the selective heads' exact candidate query). Each chunk is scored the way the loss
/// scores it: by the backend's tuned score GEMM when it has one for the storage type
/// (`dense_softmax_tuning`: on cuda, bf16/fp16 weights read in place by tensor-core GEMMs), else
/// by `dense_scores` (weight rows widened to fp32, the backend's fp32 GEMM). Why: the widening form cost the full softmax's top-10 a TF32 GEMM and a
/// widening pass per chunk where the forward runs a bf16 one: 45.3 ms against the forward's
/// 19.9 ms at 8192 x 2304 x 256K bf16 on an H200 (bench/RESULTS.md, stop 32).

#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>

#include <algorithm>
#include <optional>

namespace xsoftmax::detail {

/// Scores of `h` against weight rows [first, first + n), `chunk` columns at a time, handed to
/// `on_chunk(c0, cn, scores)` (scores: h.rows x cn in the execution's memory, relative column c0).
/// The buffer is reused, so the scores of a chunk are valid only inside its call. With a tuned
/// score GEMM the scores are those of the loss on that backend (on cuda the rows rounded to the
/// storage type once), not bitwise those of the generic form.
template <class Ex, class T, class OnChunk>
void for_each_score_chunk(const Ex& ex_in, matrix_view<const float> h, matrix_view<const T> w, const T* bias,
                          index_t first, index_t n, index_t chunk, OnChunk on_chunk) {
  if (h.rows == 0 || n == 0) return;
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  using backend = typename execution_type::backend;
  chunk = std::min(chunk, n);
  // Written by each chunk's GEMM (beta = 0) before it is read: no value-initialisation.
  scratch_buffer<backend, float> scores(static_cast<std::size_t>(h.rows * chunk), ex);
  float* sp = scores.data();
  // The backend's tuned score GEMM when it has one for T (as `dense_softmax_rows` takes it).
  dense_softmax_args a;  // forward only, the plain scores
  a.h = h;
  a.first = first;
  a.n = n;
  a.chunk = chunk;
  using tuning = dense_softmax_tuning<backend, T>;
  std::optional<tuning> tuned;  // holds `a` by reference: both live to the end of the loop
  if constexpr (tuning::available) {
    if (tuning::applies(a)) tuned.emplace(ex, a, chunk);
  }
  scratch_vector<backend, float> widened(0, ex);  // the generic form's rows widened to fp32 (sized per chunk)
  for (index_t c0 = 0; c0 < n; c0 += chunk) {
    const index_t cn = std::min(chunk, n - c0);
    bool scored = false;
    if constexpr (tuning::available) {
      if (tuned) tuned->scores(w, bias, c0, cn, sp), scored = true;
    }
    if (!scored) dense_scores(ex, h, w, bias, first + c0, cn, sp, cn, widened);
    on_chunk(c0, cn, static_cast<const float*>(sp));
  }
}

}  // namespace xsoftmax::detail
