// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A GEMM that uses the policy's threads: one CBLAS call (the BLAS threads it itself) when found,
/// otherwise the blocked loop split into row tiles over `parallel_for`.

#include <xsoftmax/detail/host/gemm.hpp>
#include <xsoftmax/detail/primitives/parallel_for.hpp>

namespace xsoftmax::detail {

template <class Policy>
void gemm_parallel(const Policy& policy, const host::gemm_args& g) {
  if (g.m == 0 || g.n == 0) return;
  if constexpr (host::has_cblas()) {
    host::gemm(g);
  } else {
    constexpr index_t tile = 16;
    const index_t tiles = (g.m + tile - 1) / tile;
    parallel_for(policy, tiles, [g](index_t t) {
      host::gemm_blocked_rows(g, t * tile, t * tile + tile < g.m ? t * tile + tile : g.m);
    });
  }
}

}  // namespace xsoftmax::detail
