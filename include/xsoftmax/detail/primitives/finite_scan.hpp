// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Finding the first non-finite value of a buffer, on any backend, fast enough to run on every
/// call: blocks of values are tested with a branch-free loop on the exponent bits (a float is NaN
/// or infinite exactly when all eight are set), which vectorises on the host; only the first bad
/// block is then searched element by element, on the error path.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/fast_exp.hpp>
#include <xsoftmax/detail/primitives/row_kernels.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <thrust/find.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstdint>
#include <type_traits>

namespace xsoftmax::detail {

/// 1 when `v` is NaN or +-inf, 0 otherwise, without a float comparison.
XSOFTMAX_HD inline std::uint32_t non_finite_bit(float v) {
  return (static_cast<std::uint32_t>(bits_of_float(v)) & 0x7F800000u) == 0x7F800000u ? 1u : 0u;
}

/// Whether scale * v[i] is NaN or infinite for some i < n, branch-free; the portable version.
template <class T>
XSOFTMAX_HD inline bool any_non_finite_scaled_portable(const T* v, index_t n, float scale) {
  std::uint32_t bad = 0;
  for (index_t i = 0; i < n; ++i) bad |= non_finite_bit(scale * to_float(v[i]));
  return bad != 0;
}

/// The same; fp32 on 8 AVX2 lanes when the host CPU has them (row_kernels.hpp; the same products,
/// so the same answer as the portable version, its oracle).
template <class T>
XSOFTMAX_HD inline bool any_non_finite_scaled(const T* v, index_t n, float scale) {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if constexpr (std::is_same_v<T, float>)
    if (row_simd::has_avx2) return any_non_finite_scaled_avx2(v, n, scale);
#endif
  return any_non_finite_scaled_portable(v, n, scale);
}

/// True for a block of `block` values (the last one shorter) holding a value whose `scale` times is
/// not finite.
template <class T>
struct block_has_non_finite {
  const T* values;
  index_t n, block;
  float scale;
  XSOFTMAX_HD bool operator()(index_t b) const {
    const index_t first = b * block, last = first + block < n ? first + block : n;
    return any_non_finite_scaled(values + first, last - first, scale);
  }
};

/// True for a row of `m` holding a NaN or an infinity (once widened to float).
template <class H>
struct row_has_non_finite {
  matrix_view<const H> m;
  XSOFTMAX_HD bool operator()(index_t r) const {
    const H* row = m.row(r);
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
    // fp32 rows on 8 AVX2 lanes when the host CPU has them: 1 * v keeps v's exponent bits (NaN and
    // infinities stay, a denormal flushed to 0 is finite either way), so the same answer. The
    // scalar loop below costs about two instructions a value (3.7 % of a top-1 call at d = 100).
    if constexpr (std::is_same_v<H, float>)
      if (row_simd::has_avx2) return any_non_finite_scaled_avx2(row, m.cols, 1.f);
#endif
    std::uint32_t bad = 0;
    for (index_t j = 0; j < m.cols; ++j) bad |= non_finite_bit(to_float(row[j]));
    return bad != 0;
  }
};

/// True for an element e (row e / cols, column e % cols) of `m` that is NaN or infinite.
template <class H>
struct element_is_non_finite {
  matrix_view<const H> m;
  XSOFTMAX_HD bool operator()(index_t e) const { return non_finite_bit(to_float(m(e / m.cols, e % m.cols))) != 0; }
};

/// The first row of `m` (in the execution's memory) holding a NaN or an infinity, or m.rows when
/// there is none: a device tests one element per thread, a host thread a row at a time.
template <class Backend, class H>
index_t first_non_finite_row(const execution<Backend>& ex, matrix_view<const H> m) {
  if constexpr (runs_on_device<execution<Backend>>) {
    if (m.cols == 0) return m.rows;
    const thrust::counting_iterator<index_t> first(0);
    const index_t total = m.rows * m.cols;
    count_host_read();
    const index_t e = *thrust::find_if(ex.policy(), first, first + total, element_is_non_finite<H>{m});
    return e == total ? m.rows : e / m.cols;
  } else {
    count_host_read();
    return first_index_where(ex, 0, m.rows, row_has_non_finite<H>{m});
  }
}

/// The index of the first of `n` values (in the execution's memory) whose `scale` times is NaN or
/// infinite, or n when there is none.
template <class Backend, class T>
index_t first_non_finite(const execution<Backend>& ex, const T* values, index_t n, float scale = 1.f) {
  // A device tests one value per thread (threads walking 1024 values each left the H100 idle:
  // 0.3 ms a call in the first profile, bench/RESULTS.md); a host thread a block at a time,
  // vectorised.
  constexpr index_t block = runs_on_device<execution<Backend>> ? 1 : 1024;
  const index_t blocks = (n + block - 1) / block;
  count_host_read();
  const index_t b = first_index_where(ex, 0, blocks, block_has_non_finite<T>{values, n, block, scale});
  if (b == blocks) return n;
  for (index_t i = b * block; i < n; ++i)  // error path: this block's values one by one
    if (non_finite_bit(scale * to_float(backend_ops<Backend>::read(ex.res, values + i)))) return i;
  return n;
}

}  // namespace xsoftmax::detail
