// SPDX-License-Identifier: Apache-2.0
// Sharded checkpoints under mpirun with S = 1..4 ranks: each rank of S loads checkpoints written by
// layouts of S' = 1, 2, 3, 4 shards (written by rank 0 alone by slicing one layer, with uneven
// ranges unlike class_sharding's), and a checkpoint saved collectively by the S ranks loads into
// an unsharded head and back into the S ranks: weights and bias bitwise equal, fp32 and bf16.
// Mismatched N, dim, precision or bias, and a shard file missing for one rank only, throw
// checkpoint_error on every rank and leave every head unchanged. With an Adam optimizer: its state
// saved by the S ranks loads unsharded (every rank's rows, gathered with MPI, bit for bit) and
// back on the S ranks; another rule, or a checkpoint without an optimizer, is rejected. Sharded
// selective and KNN heads save and load the same format (any class-range head reads any other's),
// the KNN graph rebuilt from the loaded weights.

#include <xsoftmax/sharding/mpi_communicator.hpp>

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/io/sharded_checkpoint.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selective_softmax.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

namespace xs = xsoftmax;
namespace fs = std::filesystem;
using xs::index_t;
using sharding = xs::class_sharding<xs::mpi_communicator>;

constexpr index_t classes = 1003, dim = 16;

void barrier() { MPI_Barrier(MPI_COMM_WORLD); }

/// A fresh directory every rank agrees on (rank 0's pid), removed with the object.
struct shared_temp_dir {
  fs::path path;
  explicit shared_temp_dir(const char* tag) {
    long long pid = static_cast<long long>(::getpid());
    MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    path = fs::temp_directory_path() / ("xsoftmax_sharded_ckpt_" + std::string(tag) + "_" + std::to_string(pid));
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) fs::remove_all(path), fs::create_directories(path);
    barrier();
  }
  ~shared_temp_dir() {
    barrier();
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) fs::remove_all(path);
  }
  std::string operator/(const std::string& sub) const { return (path / sub).string(); }
};

/// The unsharded layer (classes x dim, bias) in storage T, the same on every rank.
template <class T>
struct layer {
  std::vector<T> w, b;
  layer() {
    std::mt19937 g(11);
    std::normal_distribution<float> nd(0.f, 0.5f);
    for (index_t i = 0; i < classes * dim; ++i) w.push_back(xs::from_float<T>(nd(g)));
    for (index_t i = 0; i < classes; ++i) b.push_back(xs::from_float<T>(nd(g)));
  }
};

/// Uneven bounds of `shards` shards over the classes (shard s grows with s).
std::vector<index_t> uneven_bounds(index_t shards) {
  std::vector<index_t> bounds{0};
  index_t weight_sum = shards * (shards + 1) / 2;
  for (index_t s = 1; s < shards; ++s) bounds.push_back(classes * (s * (s + 1) / 2) / weight_sum);
  bounds.push_back(classes);
  return bounds;
}

/// Rank 0 writes `full` as a checkpoint of `bounds` shards into `dir`.
template <class T>
void write_virtual(const std::string& dir, const layer<T>& full, const std::vector<index_t>& bounds) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    const xs::sharded_checkpoint_layout l{classes, dim, xs::element_name<T>(), true, bounds, {}};
    for (index_t s = 0; s < l.shards(); ++s) {
      const index_t b = bounds[static_cast<std::size_t>(s)], e = bounds[static_cast<std::size_t>(s + 1)];
      xs::save_checkpoint_shard<T>(dir, l, s, xs::matrix_view<const T>(full.w.data() + b * dim, e - b, dim),
                                   full.b.data() + b);
    }
    xs::save_checkpoint_manifest(dir, l);
  }
  barrier();
}

template <class T>
bool bitwise(const T* a, const T* b, index_t n) {
  return std::memcmp(a, b, static_cast<std::size_t>(n) * sizeof(T)) == 0;
}

/// `head`'s weights and bias are the full layer's rows of its classes, bit for bit.
template <class Head, class T>
void check_rows(const Head& head, const layer<T>& full) {
  const index_t begin = head.class_begin(), rows = head.weights().rows;
  CHECK(bitwise(head.weights().data, full.w.data() + begin * dim, rows * dim));
  CHECK(bitwise(head.bias(), full.b.data() + begin, rows));
}

template <class P>
void reshard_roundtrips() {
  using T = typename P::storage_type;
  const layer<T> full;
  xs::mpi_communicator comm;
  const shared_temp_dir tmp(xs::element_name<T>());
  for (index_t shards = 1; shards <= 4; ++shards) {
    CAPTURE(shards);
    const std::string dir = tmp / ("virtual" + std::to_string(shards));
    write_virtual(dir, full, uneven_bounds(shards));
    xs::full_softmax<P, xs::serial, sharding> head(sharding(comm, classes), dim, true);
    xs::load_sharded_checkpoint(dir, head);
    check_rows(head, full);
    xs::full_softmax<P, xs::serial> whole(classes, dim, true);
    xs::load_sharded_checkpoint(dir, whole);
    check_rows(whole, full);
  }
  // Saved by these S ranks, loaded unsharded and by the S ranks again.
  layer<T> mine = full;
  const sharding sh(comm, classes);
  const index_t begin = sh.class_begin();
  const xs::full_softmax<P, xs::serial, sharding> saved(
      sh, xs::matrix_view<T>(mine.w.data() + begin * dim, sh.local_classes(), dim), mine.b.data() + begin);
  const std::string dir = tmp / "real";
  xs::save_sharded_checkpoint(dir, saved);
  const xs::sharded_checkpoint_layout l = xs::read_sharded_checkpoint_layout(dir);
  CHECK(l.shards() == comm.size());
  CHECK(l.num_classes == classes);
  xs::full_softmax<P, xs::serial> whole(classes, dim, true);
  xs::load_sharded_checkpoint(dir, whole);
  check_rows(whole, full);
  xs::full_softmax<P, xs::omp, sharding> again(sharding(comm, classes), dim, true);
  xs::load_sharded_checkpoint(dir, again);
  check_rows(again, full);
}

}  // namespace

TEST_CASE("sharded checkpoints reshard S -> S' bit for bit (fp32)") { reshard_roundtrips<xs::fp32>(); }
TEST_CASE("sharded checkpoints reshard S -> S' bit for bit (bf16)") { reshard_roundtrips<xs::bf16>(); }

TEST_CASE("sharded checkpoints: mismatches throw checkpoint_error on every rank, heads unchanged") {
  const layer<float> full;
  xs::mpi_communicator comm;
  const shared_temp_dir tmp("errors");
  const std::string dir = tmp / "four";
  write_virtual(dir, full, uneven_bounds(4));
  using head_f32 = xs::full_softmax<xs::fp32, xs::serial, sharding>;
  const auto unchanged = [](const auto& head, const auto& before) {
    CHECK(bitwise(head.weights().data, before.data(), head.weights().rows * head.dim()));
  };
  {
    head_f32 other_n(sharding(comm, classes + 1), dim, true);
    const std::vector<float> before(other_n.weights().data, other_n.weights().data + other_n.weights().rows * dim);
    CHECK_THROWS_WITH_AS(xs::load_sharded_checkpoint(dir, other_n), doctest::Contains("num_classes = 1003"),
                         xs::checkpoint_error);
    unchanged(other_n, before);
  }
  head_f32 other_dim(sharding(comm, classes), dim + 1, true);
  CHECK_THROWS_WITH_AS(xs::load_sharded_checkpoint(dir, other_dim), doctest::Contains("dim = 16"), xs::checkpoint_error);
  xs::full_softmax<xs::bf16, xs::serial, sharding> other_precision(sharding(comm, classes), dim, true);
  CHECK_THROWS_WITH_AS(xs::load_sharded_checkpoint(dir, other_precision), doctest::Contains("precision = fp32"),
                       xs::checkpoint_error);
  head_f32 no_bias(sharding(comm, classes), dim, false);
  CHECK_THROWS_AS(xs::load_sharded_checkpoint(dir, no_bias), xs::checkpoint_error);

  // The last shard missing: only the last rank reads it, yet every rank throws and keeps its weights.
  barrier();
  if (comm.rank() == 0) fs::remove(tmp / xs::sharded_checkpoint_shard_file(3, 4).insert(0, "four/"));
  barrier();
  head_f32 head(sharding(comm, classes), dim, true);
  const std::vector<float> before(head.weights().data, head.weights().data + head.weights().rows * dim);
  CHECK_THROWS_AS(xs::load_sharded_checkpoint(dir, head), xs::checkpoint_error);
  unchanged(head, before);
  CHECK_THROWS_AS(xs::load_sharded_checkpoint(tmp / "absent", head), xs::checkpoint_error);
}

TEST_CASE("sharded checkpoints with optimizer state: S ranks -> unsharded -> S ranks, bit for bit") {
  using adam = xs::sparse_optimizer<xs::adam_rule, xs::serial>;
  layer<float> full;
  xs::mpi_communicator comm;
  const shared_temp_dir tmp("optimizer");
  const sharding sh(comm, classes);
  const index_t begin = sh.class_begin(), local = sh.local_classes();
  xs::full_softmax<xs::fp32, xs::serial, sharding> head(
      sh, xs::matrix_view<float>(full.w.data() + begin * dim, local, dim), full.b.data() + begin);
  adam opt(local, dim, true);
  // Two Adam steps on each rank's batch: the state of every row becomes non-trivial.
  std::mt19937 g(40 + static_cast<unsigned>(comm.rank()));
  std::normal_distribution<float> nd(0.f, 1.f);
  const index_t rows = 5 + comm.rank();
  std::vector<float> h(static_cast<std::size_t>(rows * dim)), gh(h.size());
  std::vector<index_t> t(static_cast<std::size_t>(rows));
  for (auto& x : h) x = nd(g);
  for (auto& c : t) c = static_cast<index_t>(g() % classes);
  for (int step = 0; step < 2; ++step) {
    typename decltype(head)::gradient_type grad;
    head.forward_backward(xs::matrix_view<const float>(h.data(), rows, dim), xs::vector_view<const index_t>(t.data(), rows),
                          xs::matrix_view<float>(gh.data(), rows, dim), grad);
    opt.step(head, grad, 0.01f);
  }
  const std::string dir = tmp / "with_adam";
  xs::save_sharded_checkpoint(dir, head, opt);
  CHECK(xs::read_sharded_checkpoint_layout(dir).optimizer == "adam");

  // Every rank's rows of the weights and of the state, gathered: the unsharded reference.
  const auto gather = [&](const auto* mine, index_t per_row, auto mpi_type) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(mine)>>;
    std::vector<int> counts(static_cast<std::size_t>(comm.size())), offsets(counts.size());
    for (int q = 0; q < comm.size(); ++q) {
      counts[static_cast<std::size_t>(q)] = static_cast<int>((sh.shard_begin(q + 1) - sh.shard_begin(q)) * per_row);
      offsets[static_cast<std::size_t>(q)] = static_cast<int>(sh.shard_begin(q) * per_row);
    }
    std::vector<T> all(static_cast<std::size_t>(classes * per_row));
    MPI_Allgatherv(mine, counts[static_cast<std::size_t>(comm.rank())], mpi_type, all.data(), counts.data(),
                   offsets.data(), mpi_type, MPI_COMM_WORLD);
    return all;
  };
  const auto all_w = gather(head.weights().data, dim, MPI_FLOAT);
  const auto all_state = gather(opt.state(), dim * 2, MPI_FLOAT);
  const auto all_bias_state = gather(opt.bias_state(), 2, MPI_FLOAT);
  const auto all_counts = gather(opt.update_counts(), 1, MPI_INT64_T);

  xs::full_softmax<xs::fp32, xs::serial> whole(classes, dim, true);
  adam whole_opt(classes, dim, true);
  xs::load_sharded_checkpoint(dir, whole, whole_opt);
  CHECK(bitwise(whole.weights().data, all_w.data(), classes * dim));
  CHECK(bitwise(whole_opt.state(), all_state.data(), classes * dim * 2));
  CHECK(bitwise(whole_opt.bias_state(), all_bias_state.data(), classes * 2));
  CHECK(bitwise(whole_opt.update_counts(), all_counts.data(), classes));
  CHECK(whole_opt.steps() == opt.steps());

  // Back onto the S ranks.
  xs::full_softmax<xs::fp32, xs::serial, sharding> again(sharding(comm, classes), dim, true);
  adam again_opt(local, dim, true);
  xs::load_sharded_checkpoint(dir, again, again_opt);
  CHECK(bitwise(again_opt.state(), opt.state(), local * dim * 2));
  CHECK(bitwise(again_opt.update_counts(), opt.update_counts(), local));
  CHECK(again_opt.steps() == opt.steps());

  // Another rule, and a checkpoint saved without an optimizer.
  xs::sparse_optimizer<xs::momentum_rule, xs::serial> momentum(local, dim, true);
  CHECK_THROWS_WITH_AS(xs::load_sharded_checkpoint(dir, again, momentum), doctest::Contains("adam"), xs::checkpoint_error);
  xs::save_sharded_checkpoint(tmp / "no_optimizer", head);
  CHECK_THROWS_WITH_AS(xs::load_sharded_checkpoint(tmp / "no_optimizer", again, again_opt), doctest::Contains("none"),
                       xs::checkpoint_error);
  adam wrong_rows(local + 1, dim, true);
  CHECK_THROWS_AS(xs::load_sharded_checkpoint(dir, again, wrong_rows), xs::shape_error);
}

TEST_CASE("sharded checkpoints of selective and KNN heads: S ranks -> unsharded and back, the KNN graph rebuilt") {
  layer<float> full;
  xs::mpi_communicator comm;
  const shared_temp_dir tmp("selective");
  const sharding sh(comm, classes);
  const index_t begin = sh.class_begin(), local = sh.local_classes();
  const xs::matrix_view<float> mine(full.w.data() + begin * dim, local, dim);

  // A sharded selective head (explicit candidates) saves; every other class-range head loads it.
  using selective = xs::selective_softmax<xs::explicit_candidates, xs::fp32, xs::serial, sharding>;
  const selective saved(xs::explicit_candidates{}, sh, mine, full.b.data() + begin);
  xs::save_sharded_checkpoint(tmp / "selective", saved);
  xs::selective_softmax<xs::explicit_candidates> whole(xs::explicit_candidates{}, classes, dim, true);
  xs::load_sharded_checkpoint(tmp / "selective", whole);
  check_rows(whole, full);
  xs::full_softmax<xs::fp32, xs::serial, sharding> as_full(sharding(comm, classes), dim, true);
  xs::load_sharded_checkpoint(tmp / "selective", as_full);
  check_rows(as_full, full);

  // A sharded KNN head: the weights come back bitwise and the graph is the one of those weights.
  xs::knn_options o;
  o.graph.k = 6;
  using knn = xs::knn_softmax<xs::fp32, xs::serial, sharding>;
  const knn saved_knn(sh, mine, o, full.b.data() + begin);
  xs::save_sharded_checkpoint(tmp / "knn", saved_knn);
  knn again(sharding(comm, classes), dim, o, true);  // other weights, another graph
  xs::load_sharded_checkpoint(tmp / "knn", again);
  check_rows(again, full);
  CHECK(again.graph().ids() == saved_knn.graph().ids());
  xs::knn_softmax<> whole_knn(classes, dim, o, true);
  xs::load_sharded_checkpoint(tmp / "knn", whole_knn);
  check_rows(whole_knn, full);
  // The sharded head holds its own classes' graph rows (built round the ring).
  const index_t k = o.graph.k;
  CHECK(saved_knn.graph().held_rows() == local);
  CHECK(std::vector<index_t>(whole_knn.graph().ids().begin() + begin * k,
                             whole_knn.graph().ids().begin() + (begin + local) * k) == saved_knn.graph().ids());
}
