// SPDX-License-Identifier: Apache-2.0
// hs_shard_balance: how evenly `hs_shard_plan` spreads a hierarchical softmax's work over ranks.
// Not a timing: it counts the expected work of each rank (per routed row, the path cost below the
// frontier: children scored per node) for Zipf(1.0) batches of 8,192 targets over 1M classes, and
// prints slowest rank / mean rank (1 = perfect balance) at 2, 4 and 8 ranks, for
//   * a binary Huffman tree built from the Zipf frequencies (cut at depth 6 and 10),
//   * a depth-2 uniform tree (1000 x 1000, cut 1) and a depth-3 one (100 x 100 x 100, cut 1 and 2),
//     each with classes laid out by id (class c below node c / 1000: the frequent classes share a
//     subtree, as a vocabulary sorted by frequency does) and interleaved (class c below c % 1000),
// and a batch whose 8,192 targets all sit in the heaviest subtree — before and after what the plan
// offers against hot subtrees: splitting them (`split_above`, from the class frequencies or from
// the observed batch) and, as a model only, replicating the hot subtree on every rank.
//
// "routed" counts only the work below the frontier (what the owners do); "all" adds the top tree's
// work, which every rank does for its own 8,192 / S rows (data-parallel, balanced by construction).
//
// Build: part of bench/CMakeLists.txt (target hs_shard_balance; no Google Benchmark needed), or
//   g++ -std=c++17 -O2 -Iinclude -I/usr/local/cuda/include/cccl bench/hs_shard_balance.cpp -o hs_shard_balance
// Run: ./hs_shard_balance   (seeded: the same numbers on every run and machine)

#include "hs_shard_trees.hpp"

#include <xsoftmax/sharding/hs_shard_plan.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

namespace xs = xsoftmax;
using xs::index_t;
using tree = xs::runtime_tree<>;
using plan = xs::hs_shard_plan<>;

constexpr index_t batch = 8192, batches = 20;
using hs_shard_bench::classes;
using hs_shard_bench::uniform;
using hs_shard_bench::zipf;

/// Each class's full path cost (children scored over its whole path).
std::vector<index_t> full_costs(const tree& t) {
  std::vector<index_t> cost(static_cast<std::size_t>(classes), 0);
  for (index_t c = 0; c < classes; ++c)
    for (int l = 0; l < t.depth(c); ++l) cost[static_cast<std::size_t>(c)] += t.step(c, l).block_size;
  return cost;
}

/// Slowest / mean rank, routed work only and with each rank's top-tree work for its own share of
/// the batch (rows split into S equal contiguous shares).
struct balance {
  double routed = 1, all = 1;
};
balance measure(const plan& p, const std::vector<index_t>& full_cost, const std::vector<index_t>& targets,
                bool replicate_hot = false, index_t hot = -1) {
  const int s = p.ranks();
  std::vector<double> routed(static_cast<std::size_t>(s), 0.0), all(routed);
  const std::size_t n = targets.size();
  for (std::size_t i = 0; i < n; ++i) {
    const index_t t = targets[i];
    const int sender = static_cast<int>(i * static_cast<std::size_t>(s) / n);
    const double below = static_cast<double>(p.routed_cost(t));
    all[static_cast<std::size_t>(sender)] += static_cast<double>(full_cost[static_cast<std::size_t>(t)]) - below;
    if (p.subtree_of(t) < 0) continue;
    // Replicated hot subtree: its rows stay with their sender.
    const int worker = replicate_hot && p.subtree_of(t) == hot ? sender : p.owner(p.subtree_of(t));
    routed[static_cast<std::size_t>(worker)] += below;
    all[static_cast<std::size_t>(worker)] += below;
  }
  const auto ratio = [](const std::vector<double>& w) {
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    return total > 0 ? *std::max_element(w.begin(), w.end()) / (total / static_cast<double>(w.size())) : 1.0;
  };
  return {ratio(routed), ratio(all)};
}

index_t heaviest_subtree(const plan& p) {
  index_t best = 0;
  for (index_t s = 1; s < p.num_subtrees(); ++s)
    if (p.subtree_work(s) > p.subtree_work(best)) best = s;
  return best;
}

void report(const std::string& name, const tree& t, int cut, const std::vector<std::vector<index_t>>& zipf_batches,
            const std::vector<double>& freq) {
  const std::vector<index_t> cost = full_costs(t);
  for (double split : {0.0, 1.0}) {
    for (int ranks : {2, 4, 8}) {
      xs::hs_shard_options o;
      o.cut_depth = cut;
      o.class_frequency = freq;
      o.split_above = split;
      const plan p(t, ranks, o);
      // Zipf batches: mean and worst over the batches.
      double routed_mean = 0, routed_worst = 0, all_mean = 0, all_worst = 0;
      for (const auto& b : zipf_batches) {
        const balance m = measure(p, cost, b);
        routed_mean += m.routed / static_cast<double>(zipf_batches.size());
        all_mean += m.all / static_cast<double>(zipf_batches.size());
        routed_worst = std::max(routed_worst, m.routed), all_worst = std::max(all_worst, m.all);
      }
      // One subtree: every target drawn (Zipf-weighted) from the heaviest subtree's classes.
      const index_t hot = heaviest_subtree(p);
      std::vector<index_t> hot_classes;
      std::vector<double> hot_freq;
      for (index_t c = 0; c < classes; ++c)
        if (p.subtree_of(c) == hot) hot_classes.push_back(c), hot_freq.push_back(freq[static_cast<std::size_t>(c)]);
      std::mt19937_64 g(99);
      std::discrete_distribution<std::size_t> pick(hot_freq.begin(), hot_freq.end());
      std::vector<index_t> one(static_cast<std::size_t>(batch));
      for (auto& x : one) x = hot_classes[pick(g)];
      const balance hot_fixed = measure(p, cost, one);
      const balance hot_replicated = measure(p, cost, one, true, hot);
      // Re-planned from the batch's own histogram, hot subtrees split (moves weights between ranks).
      std::vector<double> seen(static_cast<std::size_t>(classes), 0.0);
      for (index_t x : one) seen[static_cast<std::size_t>(x)] += 1.0;
      xs::hs_shard_options adaptive = o;
      adaptive.class_frequency = seen;
      adaptive.split_above = 1.0;
      const plan q(t, ranks, adaptive);
      const balance hot_split = measure(q, cost, one);
      std::printf(
          "%-34s cut %2d split %.0f S %d | subtrees %6lld top rows %6zu | expected %.3f | zipf routed %.3f (worst "
          "%.3f) all %.3f (worst %.3f) | one-subtree routed %.3f all %.3f; replicated %.3f all %.3f; split by batch "
          "%.3f all %.3f (subtrees %lld)\n",
          name.c_str(), cut, split, ranks, static_cast<long long>(p.num_subtrees()), p.top_rows().size(),
          p.expected_imbalance(), routed_mean, routed_worst, all_mean, all_worst, hot_fixed.routed, hot_fixed.all,
          hot_replicated.routed, hot_replicated.all, hot_split.routed, hot_split.all,
          static_cast<long long>(q.num_subtrees()));
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main() {
  const std::vector<double> freq = zipf();
  std::vector<std::vector<index_t>> zipf_batches;
  {
    std::mt19937_64 g(2026);
    std::discrete_distribution<index_t> pick(freq.begin(), freq.end());
    for (index_t b = 0; b < batches; ++b) {
      std::vector<index_t> t(static_cast<std::size_t>(batch));
      for (auto& x : t) x = pick(g);
      zipf_batches.push_back(std::move(t));
    }
  }
  std::printf("Zipf(1.0) over %lld classes, %lld batches of %lld targets; slowest rank / mean rank\n",
              static_cast<long long>(classes), static_cast<long long>(batches), static_cast<long long>(batch));
  const tree huffman = tree::huffman(freq);
  report("huffman (binary)", huffman, 6, zipf_batches, freq);
  report("huffman (binary)", huffman, 10, zipf_batches, freq);
  for (bool interleave : {false, true}) {
    const std::string layout = interleave ? " interleaved" : " by id";
    report("uniform 1000x1000" + layout, uniform({1000, 1000}, interleave), 1, zipf_batches, freq);
    const tree three = uniform({100, 100, 100}, interleave);
    report("uniform 100x100x100" + layout, three, 1, zipf_batches, freq);
    report("uniform 100x100x100" + layout, three, 2, zipf_batches, freq);
  }
  return 0;
}
