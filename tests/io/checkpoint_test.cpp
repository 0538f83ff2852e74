// SPDX-License-Identifier: Apache-2.0
// Checkpoints: bit-exact round trips of every head kind (full with bias, hierarchical over a
// uniform and a Huffman runtime tree, KNN with its graph) and of sparse Adam's state, which resumes
// training exactly; loading into another precision rounds as documented (to nearest-even, exact
// widening); corrupt and mismatched files throw checkpoint_error naming the file and leave the head
// and optimizer unchanged. The safetensors reader's own checks are in safetensors_test.cpp.

#include "support/checkpoint_files.hpp"
#include "support/small_gradient.hpp"
#include "support/test_memory.hpp"
#include "support/tree_contract.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/io/checkpoint.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

namespace xs = xsoftmax;
using xs::index_t;
using xsoftmax_test::dense_copy;
using xsoftmax_test::edit_header;
using xsoftmax_test::read_file;
using xsoftmax_test::set_int64_element;
using xsoftmax_test::write_file;
using xsoftmax_test::read_back;
using xsoftmax_test::write_into;

/// A fresh directory per test and backend, removed at the end of the test.
struct scratch_dir {
  std::string path;
  explicit scratch_dir(const std::string& name) {
    path = (std::filesystem::temp_directory_path() / ("xsoftmax_ckpt_" + name + "_" + std::to_string(std::random_device{}())))
               .string();
    std::filesystem::remove_all(path);
  }
  ~scratch_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  [[nodiscard]] std::string file(const char* name) const { return (std::filesystem::path(path) / name).string(); }
};

template <class V>
std::string bytes_of(const V& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0]));
}

template <class Head>
std::string weight_bits(const Head& h) {
  std::string s = bytes_of(dense_copy(h.weights()));
  if (h.has_bias()) s += bytes_of(read_back(h.bias(), h.weights().rows));
  return s;
}

/// A random bias, so that round trips check it (heads start with a zero bias).
template <class Head>
void randomize_bias(Head& h, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<typename Head::storage_type> b(static_cast<std::size_t>(h.weights().rows));
  for (auto& x : b) x = xs::from_float<typename Head::storage_type>(nd(g));
  write_into(h.bias(), b);
}

xs::init_options seeded(unsigned seed) {
  xs::init_options o;
  o.seed = seed;
  return o;
}

/// `load` throws checkpoint_error whose message names `path` and contains `words`.
void check_rejected(const std::function<void()>& load, const std::string& path, const std::string& words) {
  try {
    load();
    FAIL("no checkpoint_error for: ", words);
  } catch (const xs::checkpoint_error& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.find(path) != std::string::npos, what);
    CHECK_MESSAGE(what.find(words) != std::string::npos, what);
  }
}

template <class P, class B>
void check_full_round_trip() {
  scratch_dir dir(std::string("full_") + xs::element_name<typename P::storage_type>() + xs::backend_traits<B>::name);
  xs::full_softmax<P, B> saved(37, 12, true, seeded(1));
  randomize_bias(saved, 2);
  xs::save_checkpoint(dir.path, saved);
  xs::full_softmax<P, B> loaded(37, 12, true, seeded(3));
  REQUIRE(weight_bits(loaded) != weight_bits(saved));
  xs::load_checkpoint(dir.path, loaded);
  CHECK(weight_bits(loaded) == weight_bits(saved));
}

}  // namespace

TEST_CASE_TEMPLATE("checkpoint: full_softmax with bias round-trips bit for bit in fp32, bf16, fp16", B,
                   XSOFTMAX_TEST_BACKENDS) {
  check_full_round_trip<xs::fp32, B>();
  check_full_round_trip<xs::bf16, B>();
  check_full_round_trip<xs::fp16, B>();
}

TEST_CASE_TEMPLATE("checkpoint: hierarchical_softmax over a uniform tree round-trips", B, XSOFTMAX_TEST_BACKENDS) {
  scratch_dir dir(std::string("hs_uniform_") + xs::backend_traits<B>::name);
  using head = xs::hierarchical_softmax<xs::uniform_tree<2, 8>, xs::bf16, B>;
  head saved(xs::uniform_tree<2, 8>(50), 6, true, seeded(1));
  randomize_bias(saved, 2);
  xs::save_checkpoint(dir.path, saved);
  head loaded(xs::uniform_tree<2, 8>(50), 6, true, seeded(3));
  xs::load_checkpoint(dir.path, loaded);
  CHECK(weight_bits(loaded) == weight_bits(saved));

  // Another branching factor: same kind, N and dim, but the rows mean something else.
  xs::hierarchical_softmax<xs::uniform_tree<2, 9>, xs::bf16, B> other(xs::uniform_tree<2, 9>(50), 6, true);
  if (other.weights().rows == saved.weights().rows)
    check_rejected([&] { xs::load_checkpoint(dir.path, other); }, dir.path, "tree.branching");
}

TEST_CASE_TEMPLATE("checkpoint: hierarchical_softmax over a Huffman runtime tree round-trips, tree included", B,
                   XSOFTMAX_TEST_BACKENDS) {
  scratch_dir dir(std::string("hs_huffman_") + xs::backend_traits<B>::name);
  std::vector<double> counts;
  for (int c = 0; c < 45; ++c) counts.push_back(1000.0 / (c + 1));
  const auto tree = xs::runtime_tree<>::huffman(counts, 3);
  using head = xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp16, B>;
  head saved(tree, 5, true, seeded(1));
  randomize_bias(saved, 2);
  xs::save_checkpoint(dir.path, saved);

  // The tree rebuilt from the checkpoint is the same tree, array for array.
  const auto rebuilt = xs::load_runtime_tree(dir.path);
  xsoftmax_test::check_same_tree_arrays(rebuilt, tree);

  head loaded(rebuilt, 5, true, seeded(3));
  xs::load_checkpoint(dir.path, loaded);
  CHECK(weight_bits(loaded) == weight_bits(saved));

  // A Huffman tree over other counts has as many rows but another shape: rejected, head unchanged.
  std::vector<double> flat(45, 1.0);
  head mismatched(xs::runtime_tree<>::huffman(flat, 3), 5, true, seeded(4));
  if (mismatched.weights().rows == saved.weights().rows) {
    const std::string before = weight_bits(mismatched);
    check_rejected([&] { xs::load_checkpoint(dir.path, mismatched); }, dir.path, "tree differs");
    CHECK(weight_bits(mismatched) == before);
  }
  // A uniform-tree head cannot load it.
  xs::hierarchical_softmax<xs::uniform_tree<1, 64>, xs::fp16, B> flat_head(xs::uniform_tree<1, 64>(45), 5, true);
  CHECK_THROWS_AS(xs::load_checkpoint(dir.path, flat_head), xs::checkpoint_error);
}

TEST_CASE_TEMPLATE("checkpoint: a head over a forest round-trips into a head over the same forest; load_runtime_tree "
                   "refuses it", B, XSOFTMAX_TEST_BACKENDS) {
  scratch_dir dir(std::string("hs_forest_") + xs::backend_traits<B>::name);
  std::vector<double> a(30, 1.0), b;
  for (int c = 0; c < 17; ++c) b.push_back(100.0 / (c + 1));
  const auto ta = xs::runtime_tree<>::huffman(a, 2), tb = xs::runtime_tree<>::huffman(b, 2);
  const auto forest = xs::runtime_tree<>::forest({&ta, &tb});
  using head = xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, B, xs::sigmoid_nodes>;
  head saved(forest, 4, true, seeded(5));
  randomize_bias(saved, 6);
  xs::save_checkpoint(dir.path, saved);
  head loaded(forest, 4, true, seeded(7));
  xs::load_checkpoint(dir.path, loaded);
  CHECK(weight_bits(loaded) == weight_bits(saved));
  // One tree cannot be rebuilt from a forest's codes: a clear refusal, not a complaint about a row.
  check_rejected([&] { (void)xs::load_runtime_tree(dir.path); }, dir.path, "forest of 2 trees");
}

TEST_CASE_TEMPLATE("checkpoint: knn_softmax round-trips its weights and graph", B, XSOFTMAX_TEST_BACKENDS) {
  scratch_dir dir(std::string("knn_") + xs::backend_traits<B>::name);
  xs::knn_options options;
  options.graph.k = 6;
  xs::knn_softmax<xs::fp32, B> saved(40, 8, options, true, seeded(1));
  randomize_bias(saved, 2);
  xs::save_checkpoint(dir.path, saved);
  xs::knn_softmax<xs::fp32, B> loaded(40, 8, options, true, seeded(3));
  REQUIRE(loaded.graph().ids() != saved.graph().ids());
  xs::load_checkpoint(dir.path, loaded);
  CHECK(weight_bits(loaded) == weight_bits(saved));
  CHECK(loaded.graph().ids() == saved.graph().ids());
  CHECK(loaded.graph().k() == 6);

  // A full_softmax of the same shape is another kind.
  xs::full_softmax<xs::fp32, B> full(40, 8, true);
  check_rejected([&] { xs::load_checkpoint(dir.path, full); }, dir.path, "knn_softmax");
}

TEST_CASE_TEMPLATE("checkpoint: sparse Adam state round-trips and training resumes bit for bit", B,
                   XSOFTMAX_TEST_BACKENDS) {
  scratch_dir dir(std::string("adam_") + xs::backend_traits<B>::name);
  const index_t n = 30, d = 7;
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  const auto gradient = [&](index_t first) {
    xs::sparse_gradient<B, float> grad;
    grad.dim = d;
    std::vector<index_t> rows;
    for (index_t r = first; r < n; r += 3) rows.push_back(r);
    std::vector<float> values(rows.size() * static_cast<std::size_t>(d)), bias(rows.size());
    for (auto& v : values) v = nd(g);
    for (auto& v : bias) v = nd(g);
    grad.rows.assign(rows.begin(), rows.end());
    grad.values.assign(values.begin(), values.end());
    grad.bias_values.assign(bias.begin(), bias.end());
    return grad;
  };
  xs::full_softmax<xs::fp32, B> head(n, d, true, seeded(1));
  xs::sparse_adam<B> adam(n, d, true, xs::adam_rule{0.9f, 0.99f});
  for (index_t s = 0; s < 4; ++s) adam.step(head, gradient(s % 3), 0.01f);
  xs::save_checkpoint(dir.path, head, adam);

  xs::full_softmax<xs::fp32, B> resumed(n, d, true, seeded(2));
  xs::sparse_adam<B> resumed_adam(n, d, true, xs::adam_rule{0.9f, 0.99f});
  xs::load_checkpoint(dir.path, resumed, resumed_adam);
  CHECK(resumed_adam.steps() == 4);
  CHECK(bytes_of(read_back(resumed_adam.state(), n * d * 2)) == bytes_of(read_back(adam.state(), n * d * 2)));
  CHECK(bytes_of(read_back(resumed_adam.bias_state(), n * 2)) == bytes_of(read_back(adam.bias_state(), n * 2)));
  CHECK(bytes_of(read_back(resumed_adam.update_counts(), n)) == bytes_of(read_back(adam.update_counts(), n)));

  const auto next = gradient(1);
  adam.step(head, next, 0.01f);
  resumed_adam.step(resumed, next, 0.01f);
  CHECK(weight_bits(resumed) == weight_bits(head));

  // A corrupt optimizer file fails the load before the head is touched.
  const std::string opt_path = dir.file(xs::checkpoint_optimizer_file);
  write_file(opt_path, read_file(opt_path).substr(0, 100));
  xs::full_softmax<xs::fp32, B> untouched(n, d, true, seeded(7));
  xs::sparse_adam<B> untouched_adam(n, d, true);
  const std::string before = weight_bits(untouched);
  check_rejected([&] { xs::load_checkpoint(dir.path, untouched, untouched_adam); }, opt_path, "");
  CHECK(weight_bits(untouched) == before);
  CHECK(untouched_adam.steps() == 0);
  // Another rule's state does not load into Adam.
  xs::save_checkpoint(dir.path, head, xs::sparse_momentum<B>(n, d, true));
  check_rejected([&] { xs::load_checkpoint(dir.path, untouched, untouched_adam); }, opt_path, "rule");
  // A head-only save removes the stale optimizer file.
  xs::save_checkpoint(dir.path, head);
  CHECK_FALSE(std::filesystem::exists(opt_path));
}

TEST_CASE_TEMPLATE("checkpoint: cross-precision loads round to nearest-even and widen exactly", B,
                   XSOFTMAX_TEST_BACKENDS) {
  scratch_dir dir(std::string("precision_") + xs::backend_traits<B>::name);
  xs::full_softmax<xs::fp32, B> wide(25, 9, true, seeded(1));
  randomize_bias(wide, 2);
  const auto w32 = dense_copy(wide.weights());
  xs::save_checkpoint(dir.path, wide);

  xs::full_softmax<xs::bf16, B> bf(25, 9, true, seeded(3));
  xs::load_checkpoint(dir.path, bf);
  xs::full_softmax<xs::fp16, B> hf(25, 9, true, seeded(3));
  xs::load_checkpoint(dir.path, hf);
  std::vector<__nv_bfloat16> want_bf;
  std::vector<__half> want_hf;
  for (const float x : w32) {
    want_bf.push_back(xs::from_float<__nv_bfloat16>(x));
    want_hf.push_back(xs::from_float<__half>(x));
  }
  CHECK(bytes_of(dense_copy(bf.weights())) == bytes_of(want_bf));
  CHECK(bytes_of(dense_copy(hf.weights())) == bytes_of(want_hf));
  // Round to nearest-even on a value halfway between two bf16 numbers: 1 + 2^-8 -> 1 (even).
  CHECK(xs::to_float(xs::from_float<__nv_bfloat16>(1.f + 1.f / 256)) == 1.f);

  // bf16 -> fp32 is exact.
  xs::save_checkpoint(dir.path, bf);
  xs::full_softmax<xs::fp32, B> widened(25, 9, true, seeded(4));
  xs::load_checkpoint(dir.path, widened);
  const auto back = dense_copy(widened.weights());
  for (std::size_t i = 0; i < back.size(); ++i) CHECK(back[i] == xs::to_float(want_bf[i]));
}

TEST_CASE_TEMPLATE("checkpoint: corrupt and mismatched files throw checkpoint_error and change nothing", B,
                   XSOFTMAX_TEST_BACKENDS) {
  scratch_dir dir(std::string("corrupt_") + xs::backend_traits<B>::name);
  xs::full_softmax<xs::fp32, B> saved(20, 4, true, seeded(1));
  xs::save_checkpoint(dir.path, saved);
  const std::string path = dir.file(xs::checkpoint_head_file);
  const std::string good = read_file(path);
  xs::full_softmax<xs::fp32, B> head(20, 4, true, seeded(2));
  const std::string before = weight_bits(head);
  const auto rejects = [&](const std::string& bytes, const std::string& words) {
    write_file(path, bytes);
    check_rejected([&] { xs::load_checkpoint(dir.path, head); }, path, words);
    CHECK(weight_bits(head) == before);
  };
  // The weight tensor is 20 x 4 fp32 = 320 bytes at [0, 320), the bias at [320, 400).
  rejects(good.substr(0, good.size() - 10), "truncated");
  rejects(good.substr(0, 5), "truncated");
  rejects(std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8) + good.substr(8), "header length");
  rejects(edit_header(good, "[320,400]", "[316,396]"), "overlap");
  rejects(edit_header(good, "\"F32\",\"shape\":[20,4]", "\"I32\",\"shape\":[20,4]"), "dtype I32");
  rejects(edit_header(good, "\"F32\",\"shape\":[20,4]", "\"F64\",\"shape\":[20,4]"), "needs 640 bytes");
  rejects(edit_header(good, "\"F32\",\"shape\":[20,4]", "\"F33\",\"shape\":[20,4]"), "unknown dtype");
  rejects(edit_header(good, "\"shape\":[20,4]", "\"shape\":[20,4,]"), "JSON header");
  rejects(edit_header(good, "\"shape\":[20,4]", "\"shape\":[4,20]"), "shape [4, 20]");
  rejects(edit_header(good, "\"num_classes\":\"20\"", "\"num_classes\":\"21\""), "num_classes");
  // Refused before their data is read (issue 28): a directory (was std::ios_base::failure), a link to
  // /dev/zero (was read until killed), a valid file grown to 6 GiB (sparse: no disk used).
  const auto load = [&] { xs::load_checkpoint(dir.path, head); };
  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  check_rejected(load, path, "not a regular file");
  std::filesystem::remove(path);
  std::filesystem::create_symlink("/dev/zero", path);
  check_rejected(load, path, "not a regular file");
  std::filesystem::remove(path);
  write_file(path, good);
  std::filesystem::resize_file(path, std::uintmax_t(6) << 30);
  check_rejected(load, path, "trailing bytes");
  CHECK(weight_bits(head) == before);
  write_file(path, good);

  xs::full_softmax<xs::fp32, B> other_n(21, 4, true);
  check_rejected([&] { xs::load_checkpoint(dir.path, other_n); }, path, "num_classes");
  xs::full_softmax<xs::fp32, B> other_dim(20, 5, true);
  check_rejected([&] { xs::load_checkpoint(dir.path, other_dim); }, path, "dim");
  xs::full_softmax<xs::fp32, B> no_bias(20, 4, false);
  check_rejected([&] { xs::load_checkpoint(dir.path, no_bias); }, path, "has_bias");
  CHECK_THROWS_AS(xs::load_checkpoint(dir.path + "/missing", head), xs::checkpoint_error);
  xs::load_checkpoint(dir.path, head);  // the good file still loads
  CHECK(weight_bits(head) == weight_bits(saved));
}

TEST_CASE("checkpoint: a header of 200,000 members parses (a duplicate check in constant time per member)") {
  // Zero-byte tensors at [0, 0): valid, and 55 bytes of header each (11 MB, under the 100 MB cap).
  std::string header = "{";
  const int members = 200000;
  for (int i = 0; i < members; ++i)
    header += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
  const auto file = [](std::string h) {
    h += "}";
    h.append((8 - h.size() % 8) % 8, ' ');
    const std::uint64_t n = h.size();
    return std::string(reinterpret_cast<const char*>(&n), 8) + h;
  };
  CHECK(xs::io::safetensors_file::parse(file(header), "many").tensors().size() == static_cast<std::size_t>(members));
  CHECK_THROWS_WITH_AS((void)xs::io::safetensors_file::parse(file(header + ",\"t7\":{}"), "many"),
                       doctest::Contains("duplicate key \"t7\""), xs::checkpoint_error);
}

TEST_CASE("checkpoint: load_runtime_tree checks its counts against the file before sizing anything") {
  scratch_dir dir("tree_counts");
  std::vector<double> counts(40);
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = 1.0 + static_cast<double>((i * 7) % 11);
  using R = xs::runtime_tree<>;
  const R tree = R::huffman(counts, 3);
  xs::hierarchical_softmax<R, xs::fp32, xs::serial> head(tree, 5);
  xs::save_checkpoint(dir.path, head);
  const std::string path = dir.file(xs::checkpoint_head_file);
  const std::string good = read_file(path);
  const std::string internal = xs::io::safetensors_file::read(path).metadata("tree.internal_nodes");
  for (const char* huge : {"1099511627776", "268435456", "9223372036854775807"}) {
    write_file(path, edit_header(good, "\"tree.internal_nodes\":\"" + internal + "\"",
                                 std::string("\"tree.internal_nodes\":\"") + huge + "\""));
    check_rejected([&] { (void)xs::load_runtime_tree(dir.path); }, path, "do not fit a tree");  // was bad_alloc
  }
  write_file(path, good);
  CHECK(xs::load_runtime_tree(dir.path).num_classes() == 40);
}

TEST_CASE("checkpoint: optimizer steps and update counts no run could reach are refused by both loaders") {
  scratch_dir dir("counts");
  const index_t n = 12, d = 3;
  xs::full_softmax<xs::fp32, xs::serial> head(n, d, true, seeded(1));
  xs::sparse_adam<xs::serial> adam(n, d, true);
  const auto g = xsoftmax_test::small_gradient<xs::serial>(d, {1, 4}, 0.5f);
  adam.step(head, g, 0.01f);
  adam.step(head, g, 0.01f);
  xs::save_checkpoint(dir.path, head, adam);
  const std::string path = dir.file(xs::checkpoint_optimizer_file);
  const std::string good = read_file(path);
  xs::sparse_adam<xs::serial> loaded(n, d, true);
  const auto load = [&] { xs::load_checkpoint(dir.path, head, loaded); };
  write_file(path, edit_header(good, "\"steps\":\"2\"", "\"steps\":\"9223372036854775807\""));
  check_rejected(load, path, "outside [0, 2^62]");
  for (const std::int64_t bad : {std::int64_t(-1), std::numeric_limits<std::int64_t>::min(), std::int64_t(3),
                                 std::numeric_limits<std::int64_t>::max()}) {
    write_file(path, set_int64_element(good, "update_counts", 4, bad));
    check_rejected(load, path, "outside [0, steps = 2]");
  }
  CHECK(loaded.steps() == 0);
  CHECK_THROWS_AS(loaded.set_steps(std::numeric_limits<std::int64_t>::max()), xs::invalid_argument);
  write_file(path, good);
  load();
  CHECK(loaded.steps() == 2);
}
