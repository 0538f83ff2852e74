// SPDX-License-Identifier: Apache-2.0
// One expansion of the HS top-k search over softmax nodes -- a hidden row against a node's block
// of 317 weight rows (a 2-level tree over 1e5 classes) -- in the ways the search has scored it,
// one thread, microseconds an expansion: the blocks drawn at random from 316 (the weights beyond
// the caches at d = 256: `cold`), or one block again and again (`hot`). Why the search scores each
// child as its own stream (search_nodes.hpp, `softmax_child_scores`) and the host rounds four
// hidden rows a pass (search_rounds.hpp); bench/RESULTS.md, "HS top-k on trained weights".
//
// g++ -std=c++17 -O3 -DNDEBUG -fopenmp -Iinclude -I/usr/local/cuda/include/cccl
//   bench/tools/search_expansion_kernels.cpp -o /tmp/search_expansion_kernels
// /tmp/search_expansion_kernels [d=64] [hot=0]
#include <xsoftmax/detail/hierarchical/search_nodes.hpp>
#include <xsoftmax/detail/primitives/dot_rows.hpp>
#include <xsoftmax/detail/primitives/gather_dot.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

using namespace xsoftmax;
using namespace xsoftmax::detail;

int main(int argc, char** argv) {
  const index_t d = argc > 1 ? std::atol(argv[1]) : 64, block = 317, blocks = 316;
  const bool hot = argc > 2 && std::atoi(argv[2]) != 0;
  std::vector<float> w(static_cast<size_t>(block * blocks * d)), h(static_cast<size_t>(4 * d)),
      out(static_cast<size_t>(4 * block));
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& x : w) x = u(g);
  for (float& x : h) x = u(g);
  const matrix_view<const float> wv(w.data(), block * blocks, d);
  std::vector<index_t> order(4000);
  for (index_t& b : order) b = hot ? 5 : static_cast<index_t>(g() % blocks);
  volatile float sink = 0;
  const auto time = [&](const char* name, auto expand, int rows_a_call = 1) {
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (const index_t b : order) expand(b * block);
      best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                                double(order.size()) / rows_a_call);
    }
    std::printf("d = %ld, %s: %-58s %6.2f us an expansion\n", static_cast<long>(d), hot ? "hot " : "cold", name, best);
  };
  const float* h0 = h.data();
  time("gather_dot + row_logsumexp (expf): the search before", [&](index_t nb) {
    gather_dot<float>(h0, wv, nullptr, nb, block, out.data());
    sink = sink + row_logsumexp(out.data(), block);
  });
  time("softmax_child_scores + children_logsumexp: now", [&](index_t nb) {
    softmax_child_scores<float>(h0, wv, nullptr, nb, block, out.data());
    sink = sink + children_logsumexp(out.data(), block);
  });
  time("four children a pass (dot_rows8<4>) + children_logsumexp", [&](index_t nb) {
    const float* hr[4] = {h0, h0, h0, h0};
    index_t j = 0;
    for (; j + 4 <= block; j += 4) {
      const float* wr[4] = {wv.row(nb + j), wv.row(nb + j + 1), wv.row(nb + j + 2), wv.row(nb + j + 3)};
      dot_rows8<4>(hr, wr, d, out.data() + j);
    }
    for (; j < block; ++j) out[static_cast<size_t>(j)] = dot_row8(h0, wv.row(nb + j), d);
    sink = sink + children_logsumexp(out.data(), block);
  });
  time("four hidden rows a pass, child by child (per 4 rows, dots)", [&](index_t nb) {
    const float* hr[4] = {h0, h0 + d, h0 + 2 * d, h0 + 3 * d};
    for (index_t j = 0; j < block; ++j) {
      const float* wj = wv.row(nb + j);
      const float* wr[4] = {wj, wj, wj, wj};
      dot_rows8<4>(hr, wr, d, out.data() + 4 * j);
    }
    sink = sink + out[7];
  });
  time("four hidden rows, two children a pass (dot_grid8<4, 2>)", [&](index_t nb) {
    const float* hr[4] = {h0, h0 + d, h0 + 2 * d, h0 + 3 * d};
    for (index_t j = 0; j + 2 <= block; j += 2) {
      const float* wr[2] = {wv.row(nb + j), wv.row(nb + j + 1)};
      dot_grid8<4, 2>(hr, wr, d, out.data() + 4 * j);
    }
    sink = sink + out[7];
  });
  // A level-search task: 32 hidden rows at one node, two children against four rows a pass
  // (search_rounds.hpp, `node_child_log_probs`), its time divided by 32 (a row-expansion's share).
  std::vector<float> h32(static_cast<size_t>(32 * d)), out32(static_cast<size_t>(32 * block));
  for (float& x : h32) x = u(g);
  time("32 rows at a node, dot_grid8<4, 2> (per row, dots)", [&](index_t nb) {
    const float* hr[32];
    for (int r = 0; r < 32; ++r) hr[r] = h32.data() + r * d;
    for (index_t j = 0; j + 2 <= block; j += 2) {
      const float* wr[2] = {wv.row(nb + j), wv.row(nb + j + 1)};
      for (int a = 0; a < 32; a += 4) dot_grid8<4, 2>(hr + a, wr, d, out32.data() + 8 * (j / 2) + 0 * a);
    }
    sink = sink + out32[7];
  }, 32);
  time("32 rows at a node, dot_grid8<4, 2>, next pair prefetched", [&](index_t nb) {
    const float* hr[32];
    for (int r = 0; r < 32; ++r) hr[r] = h32.data() + r * d;
    for (index_t j = 0; j + 2 <= block; j += 2) {
      const float* wr[2] = {wv.row(nb + j), wv.row(nb + j + 1)};
      if (j + 4 <= block)
        for (index_t q = 0; q < 2 * d; q += 16) __builtin_prefetch(wv.row(nb + j + 2) + q);
      for (int a = 0; a < 32; a += 4) dot_grid8<4, 2>(hr + a, wr, d, out32.data() + 8 * (j / 2) + 0 * a);
    }
    sink = sink + out32[7];
  }, 32);
}
