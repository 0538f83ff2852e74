// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The pieces of io/sharded_checkpoint.hpp: layout metadata and checks, reading a class range from
/// the shards that overlap it (head and optimizer files), and the ranks' agreement after a step
/// that may fail on some ranks only.

#include <xsoftmax/detail/sharding/sharded_rows.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/io/checkpoint.hpp>
#include <xsoftmax/io/safetensors.hpp>
#include <xsoftmax/io/sharded_checkpoint_types.hpp>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace xsoftmax::io::detail {

inline constexpr const char* sharded_checkpoint_format = "xsoftmax.sharded_checkpoint.v1";

inline void set_layout_metadata(safetensors_writer& w, const sharded_checkpoint_layout& l) {
  w.set_metadata("format", sharded_checkpoint_format);
  w.set_metadata("head", "full_softmax");
  w.set_metadata("precision", l.precision);
  w.set_metadata("num_classes", std::to_string(l.num_classes));
  w.set_metadata("dim", std::to_string(l.dim));
  w.set_metadata("shards", std::to_string(l.shards()));
  w.set_metadata("has_bias", l.has_bias ? "true" : "false");
  w.set_metadata("optimizer", l.optimizer.empty() ? "none" : l.optimizer);
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

/// Checks that file `f` is shard `s` of `layout` (format, shape keys, class range).
inline void expect_shard(const safetensors_file& f, const sharded_checkpoint_layout& layout, index_t s) {
  expect_metadata(f, "format", sharded_checkpoint_format, "reader (a sharded checkpoint shard) expects");
  expect_metadata(f, "num_classes", std::to_string(layout.num_classes), "manifest");
  expect_metadata(f, "dim", std::to_string(layout.dim), "manifest");
  expect_metadata(f, "shards", std::to_string(layout.shards()), "manifest");
  expect_metadata(f, "shard", std::to_string(s), "manifest");
  expect_metadata(f, "class_begin", std::to_string(layout.class_bounds[s]), "manifest");
  expect_metadata(f, "class_end", std::to_string(layout.class_bounds[s + 1]), "manifest");
}

/// Copies the rows of global classes [lo, hi) of tensor `name` (shape `shape`, `width` values per
/// row, first row = class `first`) of `f` into `dst`, whose row 0 is class `begin`. The tensor's
/// dtype must be `T`'s (resharding copies bits, it converts nothing).
template <class T>
void copy_rows(const safetensors_file& f, const char* name, const std::vector<std::int64_t>& shape, index_t width,
               index_t first, index_t lo, index_t hi, index_t begin, std::vector<T>& dst) {
  const tensor_entry& e = f.tensor(name);
  if (e.type != dtype_of<T>())
    f.fail("tensor \"", name, "\" has dtype ", dtype_name(e.type), " but ", dtype_name(dtype_of<T>()), " is expected");
  const std::vector<T> v = f.values<T>(name, shape);
  std::copy(v.begin() + (lo - first) * width, v.begin() + (hi - first) * width, dst.begin() + (lo - begin) * width);
}

/// Calls `fn(file, s, first, lo, hi)` for every shard s of `layout` that overlaps [begin, end),
/// with its file `file_of(s, shards)` read from `dir`, its first class and the overlap [lo, hi).
template <class FileOf, class F>
void for_each_overlap(const std::string& dir, const sharded_checkpoint_layout& layout, index_t begin, index_t end,
                      FileOf file_of, F fn) {
  for (index_t s = 0; s < layout.shards(); ++s) {
    const index_t b = layout.class_bounds[s], e = layout.class_bounds[s + 1];
    const index_t lo = std::max(b, begin), hi = std::min(e, end);
    if (lo >= hi) continue;
    const safetensors_file f = safetensors_file::read(path_in(dir, file_of(s, layout.shards()).c_str()));
    expect_shard(f, layout, s);
    fn(f, s, b, lo, hi);
  }
}

/// The head rows [begin, end) (dense rows x dim, and the bias when the layout has one).
template <class T>
void read_class_range(const std::string& dir, const sharded_checkpoint_layout& layout, index_t begin, index_t end,
                      std::vector<T>& weights, std::vector<T>& bias) {
  const index_t d = layout.dim;
  weights.assign(static_cast<std::size_t>((end - begin) * d), T{});
  bias.assign(layout.has_bias ? static_cast<std::size_t>(end - begin) : 0, T{});
  for_each_overlap(dir, layout, begin, end, sharded_checkpoint_shard_file,
                   [&](const safetensors_file& f, index_t s, index_t b, index_t lo, index_t hi) {
                     const index_t rows = layout.class_bounds[s + 1] - b;
                     expect_metadata(f, "precision", layout.precision, "manifest");
                     expect_metadata(f, "has_bias", layout.has_bias ? "true" : "false", "manifest");
                     copy_rows(f, "weight", {rows, d}, d, b, lo, hi, begin, weights);
                     if (layout.has_bias) copy_rows(f, "bias", {rows}, 1, b, lo, hi, begin, bias);
                   });
}

/// An optimizer's state for a class range, read from the shards' optimizer files.
template <class State>
struct optimizer_range {
  std::vector<State> state, bias_state;
  std::vector<std::int64_t> counts;
  std::int64_t steps = -1;
};

/// Optimizer rows [begin, end) of rule `rule` (`slots` per element, state type `State`, bias state
/// when `with_bias`); every shard must record the same step count.
template <class State>
[[nodiscard]] optimizer_range<State> read_optimizer_range(const std::string& dir, const sharded_checkpoint_layout& layout,
                                                          index_t begin, index_t end, const char* rule, index_t slots,
                                                          bool with_bias) {
  const index_t d = layout.dim, n = end - begin;
  optimizer_range<State> r;
  r.state.assign(static_cast<std::size_t>(n * d * slots), State{});
  r.bias_state.assign(with_bias ? static_cast<std::size_t>(n * slots) : 0, State{});
  r.counts.assign(static_cast<std::size_t>(n), 0);
  for_each_overlap(dir, layout, begin, end, sharded_checkpoint_optimizer_file,
                   [&](const safetensors_file& f, index_t s, index_t b, index_t lo, index_t hi) {
                     const index_t rows = layout.class_bounds[s + 1] - b;
                     expect_metadata(f, "rule", rule, "optimizer");
                     expect_metadata(f, "state_precision", element_name<State>(), "optimizer");
                     expect_metadata(f, "slots", std::to_string(slots), "optimizer");
                     if (with_bias != (f.find("bias_state") != nullptr))
                       f.fail(with_bias ? "the optimizer has bias state but the file has none"
                                        : "the file has bias state but the optimizer has none");
                     const std::int64_t steps = metadata_integer(f, "steps");
                     if (steps < 0 || (r.steps >= 0 && steps != r.steps))
                       f.fail("metadata \"steps\" = ", steps, " but an earlier shard records ", r.steps);
                     r.steps = steps;
                     copy_rows(f, "state", {rows, d, slots}, d * slots, b, lo, hi, begin, r.state);
                     if (with_bias) copy_rows(f, "bias_state", {rows, slots}, slots, b, lo, hi, begin, r.bias_state);
                     copy_rows(f, "update_counts", {rows}, 1, b, lo, hi, begin, r.counts);
                   });
  check_optimizer_counts(dir, r.steps, r.counts);  // the unsharded loader's rule
  return r;
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

/// Runs `f` on every rank, then agrees, so that no rank is left waiting in a later collective: a
/// rank whose `f` threw rethrows its exception; the others throw `checkpoint_error` naming the
/// highest failing rank and `consequence`.
template <class B, class Comm, class F>
void collectively(const char* where, const char* consequence, const backend_resources<B>& res,
                  const class_sharding<Comm>& sharding, F f) {
  std::exception_ptr mine;
  try {
    f();
  } catch (...) {
    mine = std::current_exception();
  }
  const index_t failed = highest_failed_rank<B>(res, sharding, mine != nullptr);
  if (mine) std::rethrow_exception(mine);
  if (failed >= 0)
    throw checkpoint_error(xsoftmax::detail::message(where, ": rank ", failed, " failed (see its error); ", consequence));
}

}  // namespace xsoftmax::io::detail
