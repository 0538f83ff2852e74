// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Sharded checkpoints of `full_softmax`: each rank of a `class_sharding` writes its class range,
/// and the checkpoint loads on any other number of ranks (S -> S'), or into an unsharded head.
///
///   <dir>/manifest.safetensors              "class_bounds" I64 [S + 1]: shard s holds the classes
///                                           [bounds[s], bounds[s + 1]) (0 = bounds[0] < ... <
///                                           bounds[S] = N); __metadata__: format, head, precision,
///                                           num_classes, dim, shards, has_bias.
///   <dir>/shard-<s>-of-<S>.safetensors      (5-digit s and S) "weight" [rows, dim] in the storage
///                                           dtype, "bias" [rows] when the head has one;
///                                           __metadata__: the manifest's keys and shard,
///                                           class_begin, class_end.
///
/// Loading reads the manifest, then only the shard files whose ranges overlap the head's classes,
/// and copies the overlapping rows: weights come back bit for bit whatever S and S'. Everything is
/// read and validated before the head is written: a missing or malformed file, or a checkpoint of
/// another head kind, N, dim, storage precision (no conversion: resharding is bit-exact; convert
/// with the unsharded `load_checkpoint`) or bias presence throws `checkpoint_error` naming the file
/// and the mismatch. The sharded verbs are collective: every rank calls them, and after reading
/// (or writing) the ranks agree through the communicator, so either every rank's head is loaded or
/// every rank throws (a rank whose own files were fine names the failing rank).
///
/// The directory must be visible to every rank (a shared filesystem) for S' != S. Files are each
/// written through a temporary and renamed (see `safetensors_writer::write`); the manifest is
/// written last, after every shard, but a save interrupted between shards of the same S can leave
/// a mix of old and new shards. Memory: a rank holds one shard file at a time, whole, plus its own
/// rows; the optimizer's state is not part of a sharded checkpoint yet.

#include <xsoftmax/detail/sharding/sharded_rows.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/io/checkpoint.hpp>
#include <xsoftmax/io/safetensors.hpp>
#include <xsoftmax/precision.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace xsoftmax {

/// The manifest file of a sharded checkpoint directory.
inline constexpr const char* sharded_checkpoint_manifest_file = "manifest.safetensors";

/// "shard-00002-of-00004.safetensors": the file of shard `shard` (0-based) of `shards`.
[[nodiscard]] inline std::string sharded_checkpoint_shard_file(index_t shard, index_t shards) {
  char name[64];
  std::snprintf(name, sizeof name, "shard-%05lld-of-%05lld.safetensors", static_cast<long long>(shard),
                static_cast<long long>(shards));
  return name;
}

/// What a sharded checkpoint's manifest records: the head's shape and each shard's class range.
struct sharded_checkpoint_layout {
  index_t num_classes = 0;           ///< N
  index_t dim = 0;                   ///< d
  std::string precision;             ///< storage type's `element_name` ("fp32", "bf16", "fp16")
  bool has_bias = false;
  std::vector<index_t> class_bounds; ///< S + 1 bounds: shard s holds [class_bounds[s], class_bounds[s + 1])

  /// S, the number of shards.
  [[nodiscard]] index_t shards() const { return static_cast<index_t>(class_bounds.size()) - 1; }

  /// The layout of `sharding` (its ranks' ranges) for a head of `dim` and storage `T`.
  template <class T, class Comm>
  [[nodiscard]] static sharded_checkpoint_layout of(const class_sharding<Comm>& sharding, index_t dim, bool has_bias) {
    sharded_checkpoint_layout l{sharding.num_classes(), dim, element_name<T>(), has_bias, {}};
    for (int r = 0; r <= sharding.size(); ++r) l.class_bounds.push_back(sharding.shard_begin(r));
    return l;
  }
};

namespace io::detail {

inline constexpr const char* sharded_checkpoint_format = "xsoftmax.sharded_checkpoint.v1";

inline void set_layout_metadata(safetensors_writer& w, const sharded_checkpoint_layout& l) {
  w.set_metadata("format", sharded_checkpoint_format);
  w.set_metadata("head", "full_softmax");
  w.set_metadata("precision", l.precision);
  w.set_metadata("num_classes", std::to_string(l.num_classes));
  w.set_metadata("dim", std::to_string(l.dim));
  w.set_metadata("shards", std::to_string(l.shards()));
  w.set_metadata("has_bias", l.has_bias ? "true" : "false");
}

/// Throws `invalid_argument` unless `l`'s bounds go strictly up from 0 to N and d >= 1.
inline void check_layout(const char* where, const sharded_checkpoint_layout& l) {
  using xsoftmax::detail::expects;
  expects(l.dim >= 1, where, ": dim = ", l.dim, " must be >= 1");
  expects(l.shards() >= 1, where, ": class_bounds has ", l.class_bounds.size(), " entries; at least 2 are needed");
  expects(l.class_bounds.front() == 0 && l.class_bounds.back() == l.num_classes, where, ": class_bounds runs from ",
          l.class_bounds.front(), " to ", l.class_bounds.back(), " instead of 0 to num_classes = ", l.num_classes);
  for (index_t s = 0; s < l.shards(); ++s)
    expects(l.class_bounds[s] < l.class_bounds[s + 1], where, ": shard ", s, " has the empty class range [",
            l.class_bounds[s], ", ", l.class_bounds[s + 1], ")");
}

/// The rows [begin, end) of a checkpoint of layout `layout` in `dir`, read from the overlapping
/// shards (dense rows x dim, and the bias when the layout has one). Throws `checkpoint_error`.
template <class T>
void read_class_range(const std::string& dir, const sharded_checkpoint_layout& layout, index_t begin, index_t end,
                      std::vector<T>& weights, std::vector<T>& bias) {
  const index_t d = layout.dim;
  weights.assign(static_cast<std::size_t>((end - begin) * d), T{});
  bias.assign(layout.has_bias ? static_cast<std::size_t>(end - begin) : 0, T{});
  for (index_t s = 0; s < layout.shards(); ++s) {
    const index_t b = layout.class_bounds[s], e = layout.class_bounds[s + 1];
    const index_t lo = std::max(b, begin), hi = std::min(e, end);
    if (lo >= hi) continue;
    const safetensors_file f = safetensors_file::read(path_in(dir, sharded_checkpoint_shard_file(s, layout.shards()).c_str()));
    expect_metadata(f, "format", sharded_checkpoint_format, "reader (a sharded checkpoint shard) expects");
    expect_metadata(f, "precision", layout.precision, "manifest");
    expect_metadata(f, "num_classes", std::to_string(layout.num_classes), "manifest");
    expect_metadata(f, "dim", std::to_string(d), "manifest");
    expect_metadata(f, "shards", std::to_string(layout.shards()), "manifest");
    expect_metadata(f, "shard", std::to_string(s), "manifest");
    expect_metadata(f, "class_begin", std::to_string(b), "manifest");
    expect_metadata(f, "class_end", std::to_string(e), "manifest");
    expect_metadata(f, "has_bias", layout.has_bias ? "true" : "false", "manifest");
    if (f.tensor("weight").type != dtype_of<T>())
      f.fail("tensor \"weight\" has dtype ", dtype_name(f.tensor("weight").type), " but the head stores ",
             dtype_name(dtype_of<T>()));
    const std::vector<T> w = f.values<T>("weight", {e - b, d});
    std::copy(w.begin() + (lo - b) * d, w.begin() + (hi - b) * d, weights.begin() + (lo - begin) * d);
    if (layout.has_bias) {
      const std::vector<T> bv = f.values<T>("bias", {e - b});
      std::copy(bv.begin() + (lo - b), bv.begin() + (hi - b), bias.begin() + (lo - begin));
    }
  }
}

/// Every rank's `failed` flag combined through `sharding`'s communicator: the highest failing
/// rank, or -1 when none failed (one all-reduce of one element; a barrier as well).
template <class B, class Comm>
[[nodiscard]] index_t highest_failed_rank(const backend_resources<B>& res, const class_sharding<Comm>& sharding,
                                          bool failed) {
  const xsoftmax::detail::execution<B> ex{res};
  index_t v = failed ? sharding.rank() : -1;
  xsoftmax::detail::host_in_comm_memory<Comm>(
      ex, &v, 1, true, [&](index_t* p) { sharding.communicator().all_reduce(p, 1, reduce_op::max); });
  return v;
}

/// Runs `f` on every rank, then agrees: rethrows this rank's `checkpoint_error`, or throws one
/// naming the failing rank, on every rank.
template <class B, class Comm, class F>
void collectively(const char* where, const backend_resources<B>& res, const class_sharding<Comm>& sharding, F f) {
  std::string mine;
  try {
    f();
  } catch (const checkpoint_error& e) {
    mine = e.what();
  }
  const index_t failed = highest_failed_rank<B>(res, sharding, !mine.empty());
  if (!mine.empty()) throw checkpoint_error(mine);
  if (failed >= 0)
    throw checkpoint_error(xsoftmax::detail::message(where, ": rank ", failed, " failed (see its error); nothing ",
                                                     "was loaded on any rank"));
}

}  // namespace io::detail

/// Writes the manifest of `layout` to `dir` (created if needed). Throws `invalid_argument` for a
/// layout whose bounds do not run strictly up from 0 to N, `checkpoint_error` when writing fails.
inline void save_checkpoint_manifest(const std::string& dir, const sharded_checkpoint_layout& layout) {
  io::detail::check_layout("save_checkpoint_manifest", layout);
  io::safetensors_writer w;
  io::detail::set_layout_metadata(w, layout);
  w.add("class_bounds", {layout.shards() + 1}, layout.class_bounds.data());
  io::detail::make_directory(dir);
  w.write(io::detail::path_in(dir, sharded_checkpoint_manifest_file));
}

/// Writes shard `shard` of `layout` to `dir` from host rows: `rows` holds classes
/// [class_bounds[shard], class_bounds[shard + 1]) (dense or strided), `bias` their bias (or null
/// when the layout has none). Throws `invalid_argument` for a shard outside the layout, another
/// precision than `T`'s or a missing bias, `shape_error` when `rows` is not the shard's shape,
/// `checkpoint_error` when writing fails. One process can write every shard of any layout.
template <class T>
void save_checkpoint_shard(const std::string& dir, const sharded_checkpoint_layout& layout, index_t shard,
                           matrix_view<const T> rows, const T* bias) {
  const char* where = "save_checkpoint_shard";
  io::detail::check_layout(where, layout);
  xsoftmax::detail::expects(shard >= 0 && shard < layout.shards(), where, ": shard = ", shard, " is outside [0, ",
                            layout.shards(), ")");
  xsoftmax::detail::expects(layout.precision == element_name<T>(), where, ": layout.precision = ", layout.precision,
                            " but the rows are ", element_name<T>());
  xsoftmax::detail::expects(!layout.has_bias || bias, where, ": the layout has a bias but bias is null");
  const index_t b = layout.class_bounds[shard], e = layout.class_bounds[shard + 1];
  xsoftmax::detail::expects<shape_error>(rows.rows == e - b && rows.cols == layout.dim, where, ": rows is ", rows.rows,
                                         " x ", rows.cols, " but shard ", shard, " holds ", e - b, " x ", layout.dim);
  std::vector<T> dense(static_cast<std::size_t>(rows.rows * rows.cols));
  for (index_t r = 0; r < rows.rows; ++r) std::copy(rows.row(r), rows.row(r) + rows.cols, dense.begin() + r * rows.cols);
  io::safetensors_writer w;
  io::detail::set_layout_metadata(w, layout);
  w.set_metadata("shard", std::to_string(shard));
  w.set_metadata("class_begin", std::to_string(b));
  w.set_metadata("class_end", std::to_string(e));
  w.add("weight", {e - b, layout.dim}, dense.data());
  if (layout.has_bias) w.add("bias", {e - b}, bias);
  io::detail::make_directory(dir);
  w.write(io::detail::path_in(dir, sharded_checkpoint_shard_file(shard, layout.shards()).c_str()));
}

/// The layout recorded in `dir`'s manifest, validated (format, head kind, integer keys, bounds
/// strictly up from 0 to N, one bound per shard plus one). Throws `checkpoint_error` naming the file.
[[nodiscard]] inline sharded_checkpoint_layout read_sharded_checkpoint_layout(const std::string& dir) {
  const auto f = io::safetensors_file::read(io::detail::path_in(dir, sharded_checkpoint_manifest_file));
  io::detail::expect_metadata(f, "format", io::detail::sharded_checkpoint_format,
                              "reader (a sharded checkpoint manifest) expects");
  io::detail::expect_metadata(f, "head", "full_softmax", "reader (sharded checkpoints of full_softmax) expects");
  sharded_checkpoint_layout l;
  l.num_classes = io::detail::metadata_integer(f, "num_classes");
  l.dim = io::detail::metadata_integer(f, "dim");
  l.precision = f.metadata("precision");
  const std::string& bias = f.metadata("has_bias");
  if (bias != "true" && bias != "false") f.fail("metadata \"has_bias\" = \"", bias, "\" is not true or false");
  l.has_bias = bias == "true";
  const index_t shards = io::detail::metadata_integer(f, "shards");
  if (shards < 1) f.fail("metadata \"shards\" = ", shards, " is not positive");
  l.class_bounds = f.values<index_t>("class_bounds", {shards + 1});
  try {
    io::detail::check_layout("manifest", l);
  } catch (const invalid_argument& e) {
    f.fail(e.what());
  }
  return l;
}

/// Saves a class-sharded `head`: every rank writes its shard, then rank 0 the manifest. Collective
/// (every rank calls it); on return every rank's files are written, or every rank throws
/// `checkpoint_error` (its own error, or one naming the rank that failed).
template <class P, class B, class Comm>
void save_sharded_checkpoint(const std::string& dir, const full_softmax<P, B, class_sharding<Comm>>& head) {
  using T = typename P::storage_type;
  const auto& sh = head.sharding();
  const auto layout = sharded_checkpoint_layout::of<T>(sh, head.dim(), head.has_bias());
  const auto w = io::detail::to_host<B>(head.resources(), head.weights());
  std::vector<T> bias;
  if (head.has_bias()) bias = io::detail::to_host<B>(head.resources(), matrix_view<T>(head.bias(), w.size() / head.dim(), 1));
  io::detail::collectively<B>("save_sharded_checkpoint", head.resources(), sh, [&] {
    save_checkpoint_shard<T>(dir, layout, sh.rank(), matrix_view<const T>(w.data(), sh.local_classes(), head.dim()),
                             bias.data());
  });
  io::detail::collectively<B>("save_sharded_checkpoint", head.resources(), sh, [&] {
    if (sh.rank() == 0) save_checkpoint_manifest(dir, layout);
  });
}

/// Loads the classes of `head` (this rank's range when class-sharded, all of them otherwise) from
/// a sharded checkpoint written by any number of ranks. Collective for a sharded head; see the file
/// comment for what is checked. Throws `checkpoint_error`; on any rank's failure no head changes.
template <class P, class B, class S>
void load_sharded_checkpoint(const std::string& dir, full_softmax<P, B, S>& head) {
  using T = typename P::storage_type;
  std::vector<T> w, bias;
  const auto read = [&] {
    const sharded_checkpoint_layout l = read_sharded_checkpoint_layout(dir);
    const std::string manifest = io::detail::path_in(dir, sharded_checkpoint_manifest_file);
    const auto mismatch = [&](const char* what, const auto& file_value, const auto& head_value) {
      throw checkpoint_error(xsoftmax::detail::message(manifest, ": ", what, " = ", file_value, " but the head has ",
                                                       head_value));
    };
    if (l.num_classes != head.num_classes()) mismatch("num_classes", l.num_classes, head.num_classes());
    if (l.dim != head.dim()) mismatch("dim", l.dim, head.dim());
    if (l.precision != element_name<T>()) mismatch("precision", l.precision, element_name<T>());
    if (l.has_bias != head.has_bias())
      mismatch("has_bias", l.has_bias ? "true" : "false", head.has_bias() ? "true" : "false");
    const index_t begin = head.class_begin();
    io::detail::read_class_range<T>(dir, l, begin, begin + head.weights().rows, w, bias);
  };
  if constexpr (is_class_sharding<S>) io::detail::collectively<B>("load_sharded_checkpoint", head.resources(), head.sharding(), read);
  else read();
  const auto weights = head.weights();
  io::detail::from_host<B>(head.resources(), w, weights);
  if (head.has_bias()) io::detail::from_host<B>(head.resources(), bias, matrix_view<T>(head.bias(), weights.rows, 1));
}

}  // namespace xsoftmax
