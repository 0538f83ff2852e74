// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Sharded checkpoints of the heads with one weight row per class (`full_softmax`,
/// `selective_softmax`, `knn_softmax`): each rank of a `class_sharding` writes its class range, and
/// the checkpoint loads on any other number of ranks (S -> S'), or into an unsharded head. The
/// three heads share the format (the manifest's "head" is "full_softmax", the layer's kind for all
/// of them), so a checkpoint of one loads into another; a `knn_softmax` rebuilds its graph from
/// the loaded weights (collective when sharded: the graph is not part of a sharded checkpoint).
///
///   <dir>/manifest.safetensors              "class_bounds" I64 [S + 1]: shard s holds the classes
///                                           [bounds[s], bounds[s + 1]) (0 = bounds[0] < ... <
///                                           bounds[S] = N); __metadata__: format, head, precision,
///                                           num_classes, dim, shards, has_bias, optimizer (the
///                                           rule's name, or "none").
///   <dir>/shard-<s>-of-<S>.safetensors      (5-digit s and S) "weight" [rows, dim] in the storage
///                                           dtype, "bias" [rows] when the head has one;
///                                           __metadata__: the manifest's keys and shard,
///                                           class_begin, class_end.
///   <dir>/optimizer-shard-<s>-of-<S>...     with an optimizer: optimizer.safetensors' tensors
///                                           ("state", "bias_state", "update_counts") and keys
///                                           for the shard's rows (see io/checkpoint.hpp), plus
///                                           the shard's keys.
///
/// Loading reads the manifest, then only the shard files whose ranges overlap the head's classes,
/// and copies the overlapping rows: weights (and optimizer state) come back bit for bit whatever S
/// and S'. Everything is read and validated before anything is written: a missing or malformed
/// file, or a checkpoint of another head kind, N, dim, storage precision (no conversion:
/// resharding is bit-exact; convert with the unsharded `load_checkpoint`), bias presence, optimizer
/// rule, slots or state precision throws `checkpoint_error` naming the file and the mismatch. The
/// sharded verbs are collective: every rank calls them, and after reading (or writing) the ranks
/// agree through the communicator, so either every rank succeeds or every rank throws (a rank
/// whose own part was fine names the failing rank).
///
/// The directory must be visible to every rank (a shared filesystem) for S' != S. Each file is
/// written through a temporary and renamed (see `safetensors_writer::write`); the manifest is
/// written last, after every shard, but a save interrupted between shards of the same S can leave
/// a mix of old and new shards. Memory: a rank holds one shard file at a time, whole, plus its own
/// rows.

#include <xsoftmax/error.hpp>
#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/io/checkpoint.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selective_softmax.hpp>
#include <xsoftmax/io/detail/sharded_checkpoint_parts.hpp>
#include <xsoftmax/io/safetensors.hpp>
#include <xsoftmax/io/sharded_checkpoint_types.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>
#include <xsoftmax/precision.hpp>

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xsoftmax {


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
  // Each shard holds at least one class: bounded by num_classes (and shards + 1 cannot overflow).
  if (shards < 1 || l.num_classes < 1 || shards > l.num_classes)
    f.fail("metadata \"shards\" = ", shards, " is outside [1, num_classes = ", l.num_classes, "]");
  l.class_bounds = f.values<index_t>("class_bounds", {shards + 1});
  const auto opt = f.metadata().find("optimizer");
  l.optimizer = opt == f.metadata().end() || opt->second == "none" ? std::string() : opt->second;
  try {
    io::detail::check_layout("manifest", l);
  } catch (const invalid_argument& e) {
    f.fail(e.what());
  }
  return l;
}

namespace io::detail {

/// Whether `Head` keeps one weight row per class in a contiguous class range (full, selective and
/// KNN softmax): the heads sharded checkpoints serve.
template <class Head>
inline constexpr bool is_class_range_head = false;
template <class P, class B, class S>
inline constexpr bool is_class_range_head<full_softmax<P, B, S>> = true;
template <class Sel, class P, class B, class S>
inline constexpr bool is_class_range_head<selective_softmax<Sel, P, B, S>> = true;
template <class P, class B, class S>
inline constexpr bool is_class_range_head<knn_softmax<P, B, S>> = true;
/// ... and whether it is class-sharded.
template <class Head>
inline constexpr bool is_sharded_class_range_head =
    is_class_range_head<Head> && is_class_sharding<typename Head::sharding_type>;

template <class Head>
inline constexpr bool is_knn_head = false;
template <class P, class B, class S>
inline constexpr bool is_knn_head<knn_softmax<P, B, S>> = true;

/// A KNN head's graph follows the loaded weights (collective when sharded); other heads need nothing.
template <class Head>
void after_weights_loaded(Head& head) {
  if constexpr (is_knn_head<Head>) head.rebuild_graph();
}

/// The optimizer file of shard `shard` of `layout`: optimizer.safetensors' tensors and keys, plus
/// the shard's keys.
template <class Head, class Rule, class OB, class State>
[[nodiscard]] safetensors_writer optimizer_shard_contents(const Head& head, const sparse_optimizer<Rule, OB, State>& opt,
                                                          const sharded_checkpoint_layout& layout, index_t shard) {
  safetensors_writer w = optimizer_contents(head, opt);
  set_layout_metadata(w, layout);
  w.set_metadata("shard", std::to_string(shard));
  w.set_metadata("class_begin", std::to_string(layout.class_bounds[shard]));
  w.set_metadata("class_end", std::to_string(layout.class_bounds[shard + 1]));
  return w;
}

/// Throws `shape_error` unless `opt` was made for `head`'s local weights.
template <class Head, class Rule, class OB, class State>
void check_fits(const char* where, const Head& head, const sparse_optimizer<Rule, OB, State>& opt) {
  static_assert(std::is_same_v<OB, typename head_backend<Head>::type>,
                "xsoftmax: sharded checkpoint: the optimizer must run on the head's backend");
  xsoftmax::detail::expects<shape_error>(opt.rows() == head.weights().rows && opt.dim() == head.dim(), where,
                                         ": the optimizer is for ", opt.rows(), " x ", opt.dim(),
                                         " weights but the head has ", head.weights().rows, " x ", head.dim());
}

/// Saves the shards (and, when `opt` is not null, the optimizer shards) then the manifest.
template <class Head, class Opt>
void save_sharded(const std::string& dir, const Head& head, const Opt* opt) {
  using T = typename Head::storage_type;
  using B = typename head_backend<Head>::type;
  const char* where = "save_sharded_checkpoint";
  const auto& sh = head.sharding();
  auto layout = sharded_checkpoint_layout::of<T>(sh, head.dim(), head.has_bias());
  if constexpr (!std::is_same_v<Opt, void>) layout.optimizer = Opt::rule_type::name;
  collectively<B>(where, "its files are missing or stale", head.resources(), sh, [&] {
    if constexpr (!std::is_same_v<Opt, void>) check_fits(where, head, *opt);
    const auto w = to_host<B>(head.resources(), head.weights());
    std::vector<T> bias;
    if (head.has_bias()) bias = to_host<B>(head.resources(), matrix_view<T>(head.bias(), head.weights().rows, 1));
    save_checkpoint_shard<T>(dir, layout, sh.rank(), matrix_view<const T>(w.data(), head.weights().rows, head.dim()),
                             bias.data());
    if constexpr (!std::is_same_v<Opt, void>)
      optimizer_shard_contents(head, *opt, layout, sh.rank())
          .write(path_in(dir, sharded_checkpoint_optimizer_file(sh.rank(), layout.shards()).c_str()));
  });
  collectively<B>(where, "the manifest was not written", head.resources(), sh, [&] {
    if (sh.rank() == 0) save_checkpoint_manifest(dir, layout);
  });
}

/// Reads and checks everything `head` (and `opt`, unless null) will receive; installs nothing.
template <class Head, class Opt, class State>
void read_sharded(const std::string& dir, const Head& head, const Opt* opt, std::vector<typename Head::storage_type>& w,
                  std::vector<typename Head::storage_type>& bias, optimizer_range<State>& state) {
  using T = typename Head::storage_type;
  const sharded_checkpoint_layout l = read_sharded_checkpoint_layout(dir);
  const std::string manifest = path_in(dir, sharded_checkpoint_manifest_file);
  const auto mismatch = [&](const char* what, const auto& file_value, const auto& head_value) {
    throw checkpoint_error(xsoftmax::detail::message(manifest, ": ", what, " = ", file_value, " but the head has ",
                                                     head_value));
  };
  if (l.num_classes != head.num_classes()) mismatch("num_classes", l.num_classes, head.num_classes());
  if (l.dim != head.dim()) mismatch("dim", l.dim, head.dim());
  if (l.precision != element_name<T>()) mismatch("precision", l.precision, element_name<T>());
  if (l.has_bias != head.has_bias())
    mismatch("has_bias", l.has_bias ? "true" : "false", head.has_bias() ? "true" : "false");
  const index_t begin = head.class_begin(), end = begin + head.weights().rows;
  read_class_range<T>(dir, l, begin, end, w, bias);
  if constexpr (!std::is_same_v<Opt, void>) {
    using Rule = typename Opt::rule_type;
    check_fits("load_sharded_checkpoint", head, *opt);
    if (l.optimizer != Rule::name)
      throw checkpoint_error(xsoftmax::detail::message(manifest, ": metadata \"optimizer\" = \"",
                                                       l.optimizer.empty() ? "none" : l.optimizer,
                                                       "\" but the optimizer's rule is \"", Rule::name, "\""));
    state = read_optimizer_range<State>(dir, l, begin, end, Rule::name, Rule::slots, opt->bias_state() != nullptr);
  }
}

}  // namespace io::detail

/// Saves a class-sharded `head`: every rank writes its shard, then rank 0 the manifest. Collective
/// (every rank calls it); on return every rank's files are written, or every rank throws (its own
/// error, or `checkpoint_error` naming the rank that failed).
template <class Head, std::enable_if_t<io::detail::is_sharded_class_range_head<Head>, int> = 0>
void save_sharded_checkpoint(const std::string& dir, const Head& head) {
  io::detail::save_sharded<Head, void>(dir, head, nullptr);
}

/// Saves `head` and its `optimizer` (this rank's rows: moments, bias state, update counts, step
/// count) as above, one optimizer file per shard. Throws `shape_error` (on every rank) when an
/// optimizer was made for another shape than its rank's local weights.
template <class Head, class Rule, class OB, class State,
          std::enable_if_t<io::detail::is_sharded_class_range_head<Head>, int> = 0>
void save_sharded_checkpoint(const std::string& dir, const Head& head, const sparse_optimizer<Rule, OB, State>& optimizer) {
  io::detail::save_sharded(dir, head, &optimizer);
}

/// Loads the classes of `head` (this rank's range when class-sharded, all of them otherwise) from
/// a sharded checkpoint written by any number of ranks. Collective for a sharded head; see the file
/// comment for what is checked. Throws `checkpoint_error`; on any rank's failure no head changes.
template <class Head, std::enable_if_t<io::detail::is_class_range_head<Head>, int> = 0>
void load_sharded_checkpoint(const std::string& dir, Head& head) {
  using T = typename Head::storage_type;
  using B = typename io::detail::head_backend<Head>::type;
  std::vector<T> w, bias;
  io::detail::optimizer_range<float> unused;
  const auto read = [&] { io::detail::read_sharded<Head, void>(dir, head, nullptr, w, bias, unused); };
  if constexpr (io::detail::is_sharded_class_range_head<Head>)
    io::detail::collectively<B>("load_sharded_checkpoint", "no head was changed", head.resources(), head.sharding(), read);
  else read();
  io::detail::from_host<B>(head.resources(), w, head.weights());
  if (head.has_bias()) io::detail::from_host<B>(head.resources(), bias, matrix_view<T>(head.bias(), head.weights().rows, 1));
  io::detail::after_weights_loaded(head);
}

/// Loads `head` and `optimizer` (the same rows of the saved optimizer state, and its step count)
/// from a sharded checkpoint saved with an optimizer of the same rule, slots and state precision,
/// on any number of ranks. Throws `checkpoint_error` (another rule, no optimizer saved, shards
/// that disagree on the step count, and as above) or `shape_error`; on any rank's failure neither
/// the head nor the optimizer changes on any rank.
template <class Head, class Rule, class OB, class State, std::enable_if_t<io::detail::is_class_range_head<Head>, int> = 0>
void load_sharded_checkpoint(const std::string& dir, Head& head, sparse_optimizer<Rule, OB, State>& optimizer) {
  using T = typename Head::storage_type;
  using B = typename io::detail::head_backend<Head>::type;
  std::vector<T> w, bias;
  io::detail::optimizer_range<State> st;
  const auto read = [&] { io::detail::read_sharded(dir, head, &optimizer, w, bias, st); };
  if constexpr (io::detail::is_sharded_class_range_head<Head>)
    io::detail::collectively<B>("load_sharded_checkpoint", "no head or optimizer was changed", head.resources(),
                                head.sharding(), read);
  else read();
  io::detail::from_host<B>(head.resources(), w, head.weights());
  if (head.has_bias()) io::detail::from_host<B>(head.resources(), bias, matrix_view<T>(head.bias(), head.weights().rows, 1));
  io::detail::optimizer_contents_read<State> r{std::move(st.state), std::move(st.bias_state), std::move(st.counts), st.steps};
  io::detail::install_optimizer(head, optimizer, r);
  io::detail::after_weights_loaded(head);
}

}  // namespace xsoftmax
