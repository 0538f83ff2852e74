// SPDX-License-Identifier: Apache-2.0
// callgrind driver of bench/RESULTS.md (stops 17 and 18): the HS before/after instruction counts.
// Build: g++ -std=c++17 -O3 -DXSOFTMAX_HAS_CBLAS=1 -Iinclude -I/usr/local/cuda/include/cccl -isystem /usr/local/cuda/include
//          -isystem /usr/include/x86_64-linux-gnu/openblas-openmp bench/tools/hs_callgrind_driver.cpp -lopenblas -o drv
//        (stop 17 was measured with -O2; stop 18 with -O3, as huffman_bench's Release build: at -O2
//        GCC 12 leaves the per-(sample, node) loops scalar)
// Run:   OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind ./drv [mode]
// Modes: (none)     stop 17: Huffman d = 256, softmax nodes then sigmoid nodes, 5 forward_backward
//        softmax    the first half of that alone (softmax-node Huffman, d = 256)
//        uniform    uniform_tree<2, 317> (N = 1e5), d = 256, 5 forward_backward
//        huff100    huffman_bench's train/xsoftmax: Huffman d = 100 sigmoid, 5 x (forward_backward + apply_sgd)
//        topk1/topk5 huffman_bench's topk/xsoftmax/k: 5 top-k calls on the same head
//        pe_train, pe_topk1, pe_topk5: huffman_bench's per-example loops (train/per_example,
//                   topk/per_example/k), 5 batches each, on the same data
//        hash       huffman_bench's fixture: FNV-1a hashes of the bits of 3 x (forward_backward +
//                   apply_sgd)'s losses, grad_hidden, sparse gradient and updated weights, and of
//                   top-1 / top-5 classes and log-probs (built against two trees' include/, equal
//                   hashes mean bitwise equal results)
// The measured calls of the huffman_bench modes run inside `measured` (not inlined), so
//   valgrind --tool=callgrind --toggle-collect='*measured<*' ./drv huff100
// counts them alone (setup excluded).
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <queue>
#include <string>
#include <utility>
#include <random>
#include <vector>
namespace xs = xsoftmax;
template <class Form, class Tree> void run(Tree tree, const std::vector<double>& freq, xs::index_t d) {
  const xs::index_t b = 1024;
  xs::hierarchical_softmax<Tree, xs::fp32, xs::serial, Form> head(tree, d);
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  std::discrete_distribution<xs::index_t> zipf(freq.begin(), freq.end());
  std::vector<float> h(b * d), gh(b * d);
  std::vector<xs::index_t> t(b);
  for (auto& x : h) x = nd(g);
  for (auto& x : t) x = zipf(g);
  typename decltype(head)::gradient_type gw;
  float s = 0;
  for (int i = 0; i < 5; ++i)
    s += head.forward_backward(xs::matrix_view<const float>(h.data(), b, d), xs::vector_view<const xs::index_t>(t.data(), b),
                               xs::matrix_view<float>(gh.data(), b, d), gw);
  std::printf("%g\n", s);
}
std::vector<double> harmonic(xs::index_t n, double scale) {
  std::vector<double> freq(n);
  for (xs::index_t c = 0; c < n; ++c) freq[c] = scale / (c + 1);
  return freq;
}
// Runs f; a call callgrind can isolate with --toggle-collect='*measured<*'.
template <class F> __attribute__((noinline)) void measured(F&& f) { f(); }
float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
float log_sigmoid(float x) { return x > 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

// huffman_bench's fixture: runtime_tree<> over 1e7 / (i + 1), d = 100, sigmoid nodes; hidden rows,
// Zipf targets and weights drawn in that order from one seeded stream.
struct huffman_fixture {
  static constexpr xs::index_t n = 100000, d = 100, b = 1024;
  std::vector<double> freq = harmonic(n, 1e7);
  xs::runtime_tree<> tree = xs::runtime_tree<>::huffman(freq, 2);
  std::vector<float> h, gh, w;
  std::vector<xs::index_t> t;
  huffman_fixture() : h(b * d), gh(b * d), w(tree.num_rows() / 2 * d), t(b) {
    std::mt19937_64 g(7);
    std::normal_distribution<float> nd(0.f, 0.3f);
    for (auto& x : h) x = nd(g);
    std::discrete_distribution<xs::index_t> zipf(freq.begin(), freq.end());
    for (auto& x : t) x = zipf(g);
    for (auto& x : w) x = 0.1f * nd(g);
  }
};
using huffman_head = xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, xs::serial, xs::sigmoid_nodes>;

void huffman_bench_like(int k, bool per_example) {
  huffman_fixture f;
  constexpr xs::index_t d = huffman_fixture::d, b = huffman_fixture::b;
  const auto& tree = f.tree;
  auto &h = f.h, &gh = f.gh, &w = f.w;
  const auto& t = f.t;
  using head_type = huffman_head;
  head_type head(tree, xs::matrix_view<float>(w.data(), tree.num_rows() / 2, d));
  double s = 0;
  const auto tv = tree.view();
  if (k == 0 && !per_example) {
    head_type::gradient_type gw;
    for (int i = 0; i < 5; ++i) {
      measured([&] {
        s += head.forward_backward(xs::matrix_view<const float>(h.data(), b, d),
                                   xs::vector_view<const xs::index_t>(t.data(), b), xs::matrix_view<float>(gh.data(), b, d), gw);
        head.apply_sgd(gw, 0.05f);
      });
    }
  } else if (k == 0) {  // huffman_bench's train/per_example
    std::vector<float> grad(d);
    for (int it = 0; it < 5; ++it)
      measured([&] {
        for (xs::index_t i = 0; i < b; ++i) {
          const float* hr = h.data() + i * d;
          std::fill(grad.begin(), grad.end(), 0.f);
          for (int l = 0; l < tv.depth(t[i]); ++l) {
            const xs::path_step st = tv.step(t[i], l);
            float* wr = w.data() + st.block_begin / 2 * d;
            float dot = 0;
            for (xs::index_t p = 0; p < d; ++p) dot += wr[p] * hr[p];
            const bool label = st.child == 0;
            const float prob = sigmoid(dot);
            s -= label ? std::log(prob + 1e-7f) : std::log(1.f - prob + 1e-7f);
            const float g = 0.05f * ((label ? 1.f : 0.f) - prob);
            for (xs::index_t p = 0; p < d; ++p) grad[p] += g * wr[p];
            for (xs::index_t p = 0; p < d; ++p) wr[p] += g * hr[p];
          }
          s += grad[0];
        }
      });
  } else if (!per_example) {
    std::vector<xs::index_t> cls(b * k);
    std::vector<float> lp(b * k);
    for (int i = 0; i < 5; ++i) {
      measured([&] {
        head.topk(xs::matrix_view<const float>(h.data(), b, d), k, xs::matrix_view<xs::index_t>(cls.data(), b, k),
                  xs::matrix_view<float>(lp.data(), b, k));
      });
      for (xs::index_t j = 0; j < b * k; ++j) s += lp[j] + cls[j];
    }
  } else {  // huffman_bench's topk/per_example/k
    using entry = std::pair<float, std::pair<xs::index_t, xs::index_t>>;
    std::vector<xs::index_t> out(k);
    for (int it = 0; it < 5; ++it)
      measured([&] {
        for (xs::index_t i = 0; i < b; ++i) {
          const float* hr = h.data() + i * d;
          std::priority_queue<entry> open;
          open.push({0.f, {0, -1}});
          xs::index_t found = 0;
          while (!open.empty() && found < k) {
            const entry e = open.top();
            open.pop();
            if (e.second.second >= 0) {
              out[found++] = e.second.second;
              continue;
            }
            const xs::index_t block = e.second.first;
            const float* wr = w.data() + block / 2 * d;
            float dot = 0;
            for (xs::index_t p = 0; p < d; ++p) dot += wr[p] * hr[p];
            for (xs::index_t c = 0; c < 2; ++c) {
              const float lp = e.first + log_sigmoid(c == 0 ? dot : -dot);
              const xs::child_ref ch = tv.child(block + c);
              open.push({lp, {ch.block_begin, ch.is_leaf ? ch.leaf_class : -1}});
            }
          }
          s += static_cast<double>(out[0]);
        }
      });
  }
  std::printf("%.9g\n", s);
}
// FNV-1a over the bytes of n values.
template <class T> std::uint64_t fnv(const T* v, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const unsigned char* b = reinterpret_cast<const unsigned char*>(v);
  for (std::size_t i = 0; i < n * sizeof(T); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
void hash_outputs() {
  huffman_fixture f;
  constexpr xs::index_t d = huffman_fixture::d, b = huffman_fixture::b;
  auto &h = f.h, &gh = f.gh, &w = f.w;
  const auto& t = f.t;
  using head_type = huffman_head;
  head_type head(f.tree, xs::matrix_view<float>(w.data(), f.tree.num_rows() / 2, d));
  head_type::gradient_type gw;
  std::uint64_t train = 1469598103934665603ull;
  for (int i = 0; i < 3; ++i) {
    const float loss = head.forward_backward(xs::matrix_view<const float>(h.data(), b, d),
                                             xs::vector_view<const xs::index_t>(t.data(), b),
                                             xs::matrix_view<float>(gh.data(), b, d), gw);
    train = fnv(&loss, 1, train);
    train = fnv(gh.data(), gh.size(), train);
    const std::vector<float> values(gw.values.begin(), gw.values.end());
    const std::vector<xs::index_t> rows(gw.rows.begin(), gw.rows.end());
    train = fnv(values.data(), values.size(), fnv(rows.data(), rows.size(), train));
    head.apply_sgd(gw, 0.05f);
  }
  train = fnv(w.data(), w.size(), train);
  std::printf("train %016llx\n", static_cast<unsigned long long>(train));
  for (const xs::index_t k : {1, 5}) {
    std::vector<xs::index_t> cls(b * k);
    std::vector<float> lp(b * k);
    head.topk(xs::matrix_view<const float>(h.data(), b, d), k, xs::matrix_view<xs::index_t>(cls.data(), b, k),
              xs::matrix_view<float>(lp.data(), b, k));
    std::printf("top-%ld %016llx\n", static_cast<long>(k),
                static_cast<unsigned long long>(fnv(lp.data(), lp.size(), fnv(cls.data(), cls.size()))));
  }
}
int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (!std::strcmp(mode, "hash")) return hash_outputs(), 0;
  const std::vector<double> freq = harmonic(100000, 1.0);
  for (const bool pe : {false, true}) {
    const std::string prefix = pe ? "pe_" : "";
    if (prefix + (pe ? "train" : "huff100") == mode) return huffman_bench_like(0, pe), 0;
    if (prefix + "topk1" == mode) return huffman_bench_like(1, pe), 0;
    if (prefix + "topk5" == mode) return huffman_bench_like(5, pe), 0;
  }
  if (!std::strcmp(mode, "uniform")) return run<xs::softmax_nodes>(xs::uniform_tree<2, 317>(100000), freq, 256), 0;
  run<xs::softmax_nodes>(xs::runtime_tree<64>::huffman(freq, 2), freq, 256);
  if (!std::strcmp(mode, "softmax")) return 0;
  run<xs::sigmoid_nodes>(xs::runtime_tree<64>::huffman(freq, 2), freq, 256);
}
