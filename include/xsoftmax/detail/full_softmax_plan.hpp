// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The full softmax's automatic layout of a training step: which rows are solved together (row
/// blocks), how many scores are kept for the backward (the score cache) and how many classes are
/// scored per GEMM (the chunk).
///
/// Device backends: chosen from what an H200 measured at 8192 x 2304 x 256K bf16 (bench/RESULTS.md,
/// "the third GPU session"): one block, a 64 MiB cache and ~32 MiB chunks took 85.0 ms a step
/// there; blocks of 2048 rows that keep every score in 16384-column chunks took 59.8 ms in 6.3 GB,
/// blocks of 4096 took 56.4 ms in 9.9 GB, PyTorch 50.3 ms in 12.9 GB.
///
/// Host backends: blocks that keep every score of a block, so that the backward recomputes no
/// score (three GEMMs a step instead of four), sized so that a block's scores take no more memory
/// than the step's own N x d fp32 weight gradient (bench/RESULTS.md, "Full softmax on the CPU:
/// blocks that keep every score").

#include <xsoftmax/config.hpp>

#include <algorithm>

namespace xsoftmax {

/// How a full softmax solves a batch in `forward_backward` / `backward` (see
/// `full_softmax::training_plan`).
struct dense_step_plan {
  index_t row_block = 0;          ///< packed rows solved together (0: the whole batch at once)
  index_t score_cache_bytes = 0;  ///< scores kept for the backward, per block
  index_t chunk = 0;              ///< classes scored per GEMM
};

namespace detail {

/// The automatic score-cache budget of a device backend's training step: 2 GiB.
inline constexpr index_t device_score_cache_bytes = index_t(2) << 30;
/// Fewer rows than this a block do not pay for the extra pass over the weight gradient on a GPU:
/// blocks pay above about 4 F / W rows (GEMM rate over bandwidth; bench/RESULTS.md, "Row blocks"),
/// ~660 on an H200 and ~940 on an H100.
inline constexpr index_t device_min_row_block = 1024;
/// Chunk width when a block keeps every score (no work buffer then): wide GEMMs, few launches and
/// few fp32 accumulations of grad_h (16384 columns measured 10-20 % faster than 1024-4096).
inline constexpr index_t device_kept_chunk_columns = 16384;

/// Default chunk width on a device backend when chunks go through the work buffer: about 256 MiB
/// of fp32 scores, at most 16384 columns (1024-column chunks cost an 8192-row step 8 ms of grad_h
/// accumulation on an H200).
[[nodiscard]] inline index_t device_chunk_columns(index_t rows) {
  return std::clamp<index_t>((index_t(64) << 20) / std::max<index_t>(rows, 1), 256, device_kept_chunk_columns);
}

/// The automatic training-step plan of a device backend for `rows` packed rows over `classes`
/// classes: every score kept when the batch's fit `device_score_cache_bytes`; else blocks of the
/// most rows (a multiple of 256) whose scores fit it, when that is at least `device_min_row_block`;
/// else one block, `default_cache_bytes` of cache, and work-buffer chunks. `chunk` > 0 overrides
/// the chunk width.
[[nodiscard]] inline dense_step_plan automatic_device_plan(index_t rows, index_t classes, index_t chunk,
                                                           index_t default_cache_bytes) {
  dense_step_plan p;
  const index_t row_bytes = std::max<index_t>(classes, 1) * static_cast<index_t>(sizeof(float));
  const index_t fit = device_score_cache_bytes / row_bytes;
  if (fit >= rows) {
    p.score_cache_bytes = std::max<index_t>(rows, 1) * row_bytes;
    p.chunk = device_kept_chunk_columns;
  } else if (fit / 256 * 256 >= device_min_row_block) {
    p.row_block = fit / 256 * 256;
    p.score_cache_bytes = p.row_block * row_bytes;
    p.chunk = device_kept_chunk_columns;
  } else {
    p.score_cache_bytes = default_cache_bytes;
    p.chunk = device_chunk_columns(rows);
  }
  if (chunk > 0) p.chunk = chunk;
  p.chunk = std::max<index_t>(1, std::min(p.chunk, classes));
  return p;
}

/// Fewer rows than this a host block do not pay for the extra read and write of the N x d weight
/// gradient per block (and narrow GEMMs run below the BLAS's rate): the host plan then keeps one
/// block and the default cache.
inline constexpr index_t host_min_row_block = 128;
/// Host blocks are a multiple of this many rows (whole GEMM register tiles, any BLAS).
inline constexpr index_t host_row_block_step = 64;

/// The automatic training-step plan of a host backend for `rows` packed rows over `classes`
/// classes of `dim` features: blocks that keep every score of a block, of the most rows (a
/// multiple of `host_row_block_step`) whose scores fit the larger of `default_cache_bytes` and the
/// N x dim fp32 weight gradient; the whole batch as one block when it fits; one block with
/// `default_cache_bytes` of cache when the blocks would be under `host_min_row_block` rows. The
/// chunk is left 0: the head sizes it for a block's rows (`full_softmax::chunk_size_for`).
[[nodiscard]] inline dense_step_plan automatic_host_plan(index_t rows, index_t classes, index_t dim,
                                                         index_t default_cache_bytes) {
  dense_step_plan p;
  const index_t row_bytes = std::max<index_t>(classes, 1) * static_cast<index_t>(sizeof(float));
  const index_t budget = std::max(default_cache_bytes, std::max<index_t>(classes, 1) * std::max<index_t>(dim, 1) *
                                                           static_cast<index_t>(sizeof(float)));
  const index_t fit = budget / row_bytes;
  if (fit >= rows) {
    p.score_cache_bytes = std::max<index_t>(rows, 1) * row_bytes;
  } else if (fit / host_row_block_step * host_row_block_step >= host_min_row_block) {
    p.row_block = fit / host_row_block_step * host_row_block_step;
    p.score_cache_bytes = p.row_block * row_bytes;
  } else {
    p.score_cache_bytes = default_cache_bytes;
  }
  return p;
}

}  // namespace detail
}  // namespace xsoftmax
