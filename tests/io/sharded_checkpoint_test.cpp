// SPDX-License-Identifier: Apache-2.0
// Sharded checkpoints in one process (class_sharding<solo_communicator>; the multi-rank tests run
// under mpirun, tests/sharding/sharded_checkpoint_mpi.cpp): a one-rank save loads into an
// unsharded head, a three-shard layout written by slices loads into the one-rank head, bit for
// bit; bad layouts and bad shards are rejected with typed errors.

#include "support/checkpoint_files.hpp"
#include "support/small_gradient.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/io/sharded_checkpoint.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>
#include <xsoftmax/sharding/solo_communicator.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {
namespace xs = xsoftmax;
namespace fs = std::filesystem;
using xs::index_t;
using solo = xs::class_sharding<xs::solo_communicator>;

struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("xsoftmax_sharded_ckpt_solo_" + std::to_string(std::random_device{}()));
  temp_dir() { fs::create_directories(path); }
  ~temp_dir() { fs::remove_all(path); }
  std::string operator/(const std::string& sub) const { return (path / sub).string(); }
};
}  // namespace

TEST_CASE("sharded checkpoint with one rank: save, load unsharded and from a three-shard layout") {
  constexpr index_t n = 101, d = 7;
  const temp_dir tmp;
  const xs::full_softmax<xs::fp32, xs::serial, solo> head(solo({}, n), d, true, xs::init_options{5});
  xs::save_sharded_checkpoint(tmp / "one", head);
  CHECK(fs::exists(tmp / "one/shard-00000-of-00001.safetensors"));
  xs::full_softmax<xs::fp32, xs::serial> whole(n, d, true, xs::init_options{6});
  xs::load_sharded_checkpoint(tmp / "one", whole);
  CHECK(std::memcmp(whole.weights().data, head.weights().data, sizeof(float) * n * d) == 0);
  CHECK(std::memcmp(whole.bias(), head.bias(), sizeof(float) * n) == 0);

  // Three shards of the same rows, written from slices, load back into the one-rank head.
  const xs::sharded_checkpoint_layout l{n, d, "fp32", true, {0, 10, 60, n}, {}};
  for (index_t s = 0; s < 3; ++s) {
    const index_t b = l.class_bounds[static_cast<std::size_t>(s)], e = l.class_bounds[static_cast<std::size_t>(s + 1)];
    xs::save_checkpoint_shard<float>(tmp / "three", l, s, xs::matrix_view<const float>(whole.weights().data + b * d, e - b, d),
                                     whole.bias() + b);
  }
  xs::save_checkpoint_manifest(tmp / "three", l);
  xs::full_softmax<xs::fp32, xs::serial, solo> back(solo({}, n), d, true, xs::init_options{7});
  xs::load_sharded_checkpoint(tmp / "three", back);
  CHECK(std::memcmp(back.weights().data, head.weights().data, sizeof(float) * n * d) == 0);
  CHECK(std::memcmp(back.bias(), head.bias(), sizeof(float) * n) == 0);
}

TEST_CASE("sharded checkpoint layouts and shards are validated") {
  const temp_dir tmp;
  std::vector<float> rows(10 * 4), bias(10);
  const xs::matrix_view<const float> ten(rows.data(), 10, 4);
  const xs::sharded_checkpoint_layout good{20, 4, "fp32", true, {0, 10, 20}, {}};
  xs::sharded_checkpoint_layout empty_shard = good, short_cover = good, bf16 = good;
  empty_shard.class_bounds = {0, 10, 10, 20};
  short_cover.class_bounds = {0, 10, 19};
  bf16.precision = "bf16";
  CHECK_THROWS_AS(xs::save_checkpoint_manifest(tmp / "x", empty_shard), xs::invalid_argument);
  CHECK_THROWS_AS(xs::save_checkpoint_manifest(tmp / "x", short_cover), xs::invalid_argument);
  CHECK_THROWS_AS(xs::save_checkpoint_shard<float>(tmp / "x", good, 2, ten, bias.data()), xs::invalid_argument);
  CHECK_THROWS_AS(xs::save_checkpoint_shard<float>(tmp / "x", bf16, 0, ten, bias.data()), xs::invalid_argument);
  CHECK_THROWS_AS(xs::save_checkpoint_shard<float>(tmp / "x", good, 0, ten, nullptr), xs::invalid_argument);
  CHECK_THROWS_AS(xs::save_checkpoint_shard<float>(tmp / "x", good, 0, xs::matrix_view<const float>(rows.data(), 9, 4),
                                                   bias.data()),
                  xs::shape_error);
  // A shard file whose range disagrees with the manifest: written for another layout.
  xs::save_checkpoint_manifest(tmp / "y", good);
  xs::save_checkpoint_shard<float>(tmp / "y", good, 0, ten, bias.data());
  const xs::sharded_checkpoint_layout shifted{20, 4, "fp32", true, {0, 11, 20}, {}};
  xs::save_checkpoint_shard<float>(tmp / "y", shifted, 1, xs::matrix_view<const float>(rows.data(), 9, 4), bias.data());
  xs::full_softmax<xs::fp32, xs::serial> head(20, 4, true);
  CHECK_THROWS_WITH_AS(xs::load_sharded_checkpoint(tmp / "y", head), doctest::Contains("class_begin"),
                       xs::checkpoint_error);
  CHECK_THROWS_AS(xs::read_sharded_checkpoint_layout(tmp / "none"), xs::checkpoint_error);
}

TEST_CASE("sharded checkpoint: a manifest's shard count and the optimizer's counts are checked as the unsharded "
          "loader checks them") {
  using namespace xsoftmax_test;
  constexpr index_t n = 15, d = 3;
  const temp_dir tmp;
  xs::full_softmax<xs::fp32, xs::serial, solo> head(solo({}, n), d, true, xs::init_options{5});
  xs::sparse_adam<xs::serial> adam(n, d, true);
  adam.step(head, small_gradient<xs::serial>(d, {2, 9}, 0.5f), 0.01f);
  xs::save_sharded_checkpoint(tmp / "c", head, adam);
  xs::sparse_adam<xs::serial> loaded(n, d, true);
  const auto load = [&] { xs::load_sharded_checkpoint(tmp / "c", head, loaded); };

  const std::string manifest = tmp / ("c/" + std::string(xs::sharded_checkpoint_manifest_file));
  const std::string good_manifest = read_file(manifest);
  write_file(manifest, edit_header(good_manifest, "\"shards\":\"1\"", "\"shards\":\"9223372036854775807\""));
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("is outside [1, num_classes = 15]"), xs::checkpoint_error);
  write_file(manifest, good_manifest);

  const std::string opt = tmp / ("c/" + xs::sharded_checkpoint_optimizer_file(0, 1));
  const std::string good = read_file(opt);
  for (const std::int64_t bad : {std::int64_t(-1), std::numeric_limits<std::int64_t>::min(),
                                 std::numeric_limits<std::int64_t>::max()}) {
    write_file(opt, set_int64_element(good, "update_counts", 9, bad));  // accepted before (issue 28)
    CHECK_THROWS_WITH_AS(load(), doctest::Contains("outside [0, steps = 1]"), xs::checkpoint_error);
  }
  write_file(opt, edit_header(good, "\"steps\":\"1\"", "\"steps\":\"9223372036854775807\""));
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("outside [0, 2^62]"), xs::checkpoint_error);
  CHECK(loaded.steps() == 0);
  write_file(opt, good);
  load();
  CHECK(loaded.steps() == 1);
}
