// SPDX-License-Identifier: Apache-2.0
// hs_replan_drift: what re-planning a sharded hierarchical softmax from a running target histogram
// buys when the class popularity drifts, and what moving the weights costs.
//
// Not a timing: like hs_shard_balance it counts each rank's routed work (per routed row, the
// children scored on its path below the frontier) and prints slowest rank / mean rank per batch.
// 1M classes; 200 batches of 8,192 targets in 4 phases of 50; in phase k the popularity is
// Zipf(1.0) over the class ids rotated by k x 250,007 (the hot head moves to another part of the
// tree, as when a topic or a season changes). Policies:
//   * static:  the plan made from phase 0's frequencies (split_above = 1), kept;
//   * tracked: an `hs_replanner` (split_above = 1; its knobs from the command line, else its
//              defaults: decay 0.7, a look every 2 batches, re-plan above 1.2 when the new plan is
//              1.1x better, current owners kept within 5 %) sees every batch; when it proposes a
//              plan, the weights move (`reshard_rows_sent` counts the rows the busiest rank
//              sends; bytes at d = 512 in bf16, summed over the re-plans);
//   * oracle:  a plan re-made from each batch's own histogram before it runs (a lower bound: it
//              knows the batch in advance and would move weights every step).
// Trees: the 1000 x 1000 uniform tree with classes by id (cut 1) and the binary Huffman tree of
// phase 0's Zipf (cut 10), the cases of hs_shard_balance.
//
// Build: part of bench/CMakeLists.txt (target hs_replan_drift; no Google Benchmark), or
//   g++ -std=c++17 -O2 -Iinclude -I/usr/local/cuda/include/cccl bench/hs_replan_drift.cpp -o hs_replan_drift
// Run: ./hs_replan_drift [decay check_every replan_above gain keep_owners]   (defaults: hs_replan_options';
//      seeded: the same numbers on every run and machine)

#include "hs_shard_trees.hpp"

#include <xsoftmax/sharding/hs_replanner.hpp>
#include <xsoftmax/sharding/hs_reshard.hpp>
#include <xsoftmax/sharding/hs_shard_plan.hpp>
#include <xsoftmax/sharding/solo_communicator.hpp>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

namespace xs = xsoftmax;
using hs_shard_bench::classes;
using xs::index_t;
using tree = xs::runtime_tree<>;
using plan = xs::hs_shard_plan<>;

constexpr index_t batch = 8192, phase_batches = 50, phases = 4, dim = 512;
constexpr index_t rotation = 250007;

/// The tracked policy's knobs (command-line arguments: decay, check_every, replan_above, gain).
xs::hs_replan_options knobs;

/// Phase k's popularity: Zipf(1.0) over the ids rotated by k x rotation.
std::vector<double> popularity(index_t phase) {
  std::vector<double> f(static_cast<std::size_t>(classes));
  for (index_t c = 0; c < classes; ++c) {
    const index_t rank = ((c - phase * rotation) % classes + classes) % classes;
    f[static_cast<std::size_t>(c)] = 1.0 / static_cast<double>(rank + 1);
  }
  return f;
}

xs::hs_shard_options plan_options(int cut, std::vector<double> freq) {
  xs::hs_shard_options o;
  o.cut_depth = cut;
  o.class_frequency = std::move(freq);
  o.split_above = 1.0;
  return o;
}

struct summary {
  double mean = 0, worst = 0, after_change = 0;  ///< imbalance: all batches, worst batch, first 10 of phases 1..
  int replans = 0;
  double moved_mb = 0;  ///< the most any rank sent, summed over the re-plans
};

void account(summary& s, double imbalance, index_t b) {
  s.mean += imbalance / static_cast<double>(phase_batches * phases);
  s.worst = std::max(s.worst, imbalance);
  if (b >= phase_batches && b % phase_batches < 10) s.after_change += imbalance / static_cast<double>(10 * (phases - 1));
}

void run(const std::string& name, const tree& t, int cut, int ranks) {
  std::mt19937_64 g(2024);
  const plan first(t, ranks, plan_options(cut, popularity(0)));
  plan tracked = first;
  // One replanner sees the whole global batch: what the ranks' replanners agree on after their
  // all-reduce (so a one-rank communicator stands in for the S ranks here).
  xs::hs_replanner<> replanner(t, plan_options(cut, {}), knobs);
  xs::solo_communicator comm;
  summary fixed, adaptive, oracle;
  for (index_t p = 0; p < phases; ++p) {
    const std::vector<double> f = popularity(p);
    std::discrete_distribution<index_t> pick(f.begin(), f.end());
    for (index_t i = 0; i < phase_batches; ++i) {
      const index_t b = p * phase_batches + i;
      std::vector<index_t> targets(static_cast<std::size_t>(batch));
      for (index_t& c : targets) c = pick(g);
      account(fixed, first.imbalance(targets), b);
      account(adaptive, tracked.imbalance(targets), b);
      std::vector<double> hist(static_cast<std::size_t>(classes), 0.0);
      for (index_t c : targets) hist[static_cast<std::size_t>(c)] += 1.0;
      account(oracle, plan(t, ranks, plan_options(cut, std::move(hist))).imbalance(targets), b);

      replanner.observe(xs::vector_view<const index_t>(targets.data(), batch));
      std::optional<plan> next = replanner.propose(tracked, comm);
      if (!next) continue;
      const std::vector<index_t> sent = xs::reshard_rows_sent(tracked, *next);
      adaptive.moved_mb += static_cast<double>(*std::max_element(sent.begin(), sent.end())) * dim * 2 / 1e6;
      ++adaptive.replans;
      tracked = std::move(*next);
    }
  }
  const auto line = [&](const char* policy, const summary& s) {
    std::printf("%-26s cut %2d S %d | %-7s | imbalance mean %.3f worst %.3f first-10-after-change %.3f | replans %2d moved %8.1f MB\n",
                name.c_str(), cut, ranks, policy, s.mean, s.worst, s.after_change, s.replans, s.moved_mb);
  };
  line("static", fixed);
  line("tracked", adaptive);
  line("oracle", oracle);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) knobs.decay = std::atof(argv[1]);
  if (argc > 2) knobs.check_every = std::atoll(argv[2]);
  if (argc > 3) knobs.replan_above = std::atof(argv[3]);
  if (argc > 4) knobs.gain = std::atof(argv[4]);
  if (argc > 5) knobs.keep_owners = std::atoi(argv[5]) != 0;
  std::printf("tracked policy: decay %.2f, check every %lld batches, re-plan above %.2f when the new plan is %.2fx "
              "better, %s\n",
              knobs.decay, static_cast<long long>(knobs.check_every), knobs.replan_above, knobs.gain,
              knobs.keep_owners ? "owners kept within 5 %" : "owners not kept");
  std::printf("hs_replan_drift: 1M classes, %lld batches of %lld targets, popularity rotated every %lld batches\n",
              static_cast<long long>(phase_batches * phases), static_cast<long long>(batch),
              static_cast<long long>(phase_batches));
  try {
    const tree by_id = hs_shard_bench::uniform({1000, 1000}, false);
    const tree huffman = tree::huffman(popularity(0));
    for (int s : {2, 4, 8}) run("uniform 1000x1000 by id", by_id, 1, s);
    for (int s : {2, 4, 8}) run("huffman (binary)", huffman, 10, s);
  } catch (const xs::invalid_argument& e) {  // a bad knob: hs_replanner names it
    std::fprintf(stderr, "%s\nusage: hs_replan_drift [decay check_every replan_above gain keep_owners]\n", e.what());
    return 2;
  }
}
