// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Checkpoints: a head (weights, bias, and its tree or KNN graph) and optionally its sparse
/// optimizer's state, saved to and loaded from a directory of safetensors files that Python's
/// `safetensors` reads (`safetensors.numpy.load_file`) and writes.
///
///   <dir>/head.safetensors        "weight" [rows, dim] in the head's storage dtype (F32/BF16/F16),
///                                 "bias" [rows] when the head has one, and per kind:
///                                 knn_softmax: "graph.ids" I64 [N, K];
///                                 hierarchical_softmax over a runtime_tree: "tree.row_parent" and
///                                 "tree.row_child" I64 [rows] (uniform trees: depth and branching
///                                 in the metadata). __metadata__: format, head, precision,
///                                 num_classes, dim, weight_rows, has_bias, and the tree / graph keys.
///   <dir>/optimizer.safetensors   "state" [rows, dim, slots] and "bias_state" [rows, slots] in the
///                                 optimizer's state dtype, "update_counts" I64 [rows];
///                                 __metadata__: rule, slots, rows, dim, steps.
///
/// Loading reads and validates everything first — both files, every metadata value against the
/// head (kind, N, dim, weight rows, bias, node form, tree shape) and the optimizer (rule, slots,
/// shapes), every dtype and shape — and only then copies into the head and optimizer: a bad or
/// mismatched checkpoint throws `checkpoint_error` naming the file and the mismatch, and leaves
/// both unchanged.
///
/// Precision: a checkpoint loads into a head of any storage precision. Values in the head's own
/// dtype are copied bit for bit; otherwise each goes through float: F32 -> bf16/fp16 rounds to
/// nearest-even (as `from_float`), bf16/fp16 -> fp32 is exact, bf16 <-> fp16 is one rounding to
/// nearest-even of the exact value (fp16 overflows to +-inf beyond 65504). The optimizer state
/// converts the same way.
///
/// Backends: weights in device memory (cuda) are copied through the host with the backend's
/// blocking copy on the head's stream, after the work queued on it. Memory: one host copy of the
/// weights (and of the optimizer state) while saving or loading; a loaded file is held whole.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/io/detail/checkpoint_parts.hpp>
#include <xsoftmax/io/safetensors.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace xsoftmax {

/// The file of a checkpoint directory holding the head (weights, bias, tree or graph).
inline constexpr const char* checkpoint_head_file = "head.safetensors";
/// The file of a checkpoint directory holding the sparse optimizer's state.
inline constexpr const char* checkpoint_optimizer_file = "optimizer.safetensors";

namespace io::detail {

inline constexpr const char* checkpoint_format = "xsoftmax.checkpoint.v1";

[[nodiscard]] inline std::string path_in(const std::string& dir, const char* file) {
  return (std::filesystem::path(dir) / file).string();
}

/// The rows of `m` (backend memory, any stride), densely packed on the host.
template <class B, class T>
[[nodiscard]] std::vector<T> to_host(const backend_resources<B>& res, matrix_view<T> m) {
  std::vector<T> out(static_cast<std::size_t>(m.rows * m.cols));
  if (m.stride == m.cols) xsoftmax::detail::backend_ops<B>::copy(res, out.data(), m.data, m.rows * m.cols);
  else
    for (index_t r = 0; r < m.rows; ++r)
      xsoftmax::detail::backend_ops<B>::copy(res, out.data() + r * m.cols, m.row(r), m.cols);
  return out;
}

/// Copies dense host rows `src` into `m` (backend memory, any stride).
template <class B, class T>
void from_host(const backend_resources<B>& res, const std::vector<T>& src, matrix_view<T> m) {
  if (m.stride == m.cols) xsoftmax::detail::backend_ops<B>::copy(res, m.data, src.data(), m.rows * m.cols);
  else
    for (index_t r = 0; r < m.rows; ++r)
      xsoftmax::detail::backend_ops<B>::copy(res, m.row(r), src.data() + r * m.cols, m.cols);
}

template <class Head>
using storage_of = typename Head::storage_type;

template <class Head>
[[nodiscard]] safetensors_writer head_contents(const Head& head) {
  using B = typename head_backend<Head>::type;
  using T = storage_of<Head>;
  const auto w = head.weights();
  safetensors_writer out;
  out.set_metadata("format", checkpoint_format);
  out.set_metadata("head", head_kind(head));
  out.set_metadata("precision", element_name<T>());
  out.set_metadata("num_classes", std::to_string(head.num_classes()));
  out.set_metadata("dim", std::to_string(head.dim()));
  out.set_metadata("weight_rows", std::to_string(w.rows));
  out.set_metadata("has_bias", head.has_bias() ? "true" : "false");
  out.add("weight", {w.rows, w.cols}, to_host<B>(head.resources(), w).data());
  if (head.has_bias())
    out.add("bias", {w.rows}, to_host<B>(head.resources(), matrix_view<T>(head.bias(), w.rows, 1)).data());
  save_structure(out, head);
  return out;
}

/// Everything a head load will write, read and checked.
template <class Head>
struct head_contents_read {
  std::vector<storage_of<Head>> weights, bias;
  install_action install;
};

template <class Head>
[[nodiscard]] head_contents_read<Head> read_head(const std::string& path, Head& head) {
  using T = storage_of<Head>;
  const safetensors_file f = safetensors_file::read(path);
  const index_t rows = head.weights().rows, dim = head.dim();
  expect_metadata(f, "format", checkpoint_format, "reader (an xsoftmax checkpoint) expects");
  expect_metadata(f, "head", head_kind(head), "head");
  expect_metadata(f, "num_classes", std::to_string(head.num_classes()), "head");
  expect_metadata(f, "dim", std::to_string(dim), "head");
  expect_metadata(f, "weight_rows", std::to_string(rows), "head");
  expect_metadata(f, "has_bias", head.has_bias() ? "true" : "false", "head");
  head_contents_read<Head> r;
  r.install = read_structure(f, head);
  r.weights = f.values<T>("weight", {rows, dim});
  if (head.has_bias()) r.bias = f.values<T>("bias", {rows});
  return r;
}

template <class Head>
void install_head(Head& head, head_contents_read<Head>& r) {
  using B = typename head_backend<Head>::type;
  using T = storage_of<Head>;
  from_host<B>(head.resources(), r.weights, head.weights());
  if (head.has_bias()) from_host<B>(head.resources(), r.bias, matrix_view<T>(head.bias(), head.weights().rows, 1));
  if (r.install) r.install();
}

template <class Head, class Rule, class OB, class State>
void check_optimizer_fits(const char* where, const Head& head, const sparse_optimizer<Rule, OB, State>& opt) {
  static_assert(std::is_same_v<OB, typename head_backend<Head>::type>,
                "xsoftmax: checkpoint: the optimizer must run on the head's backend");
  xsoftmax::detail::expects<shape_error>(opt.rows() == head.weights().rows && opt.dim() == head.dim(), where,
                                         ": the optimizer is for ", opt.rows(), " x ", opt.dim(),
                                         " weights but the head has ", head.weights().rows, " x ", head.dim());
}

template <class Head, class Rule, class OB, class State>
[[nodiscard]] safetensors_writer optimizer_contents(const Head& head, const sparse_optimizer<Rule, OB, State>& opt) {
  const auto& res = head.resources();
  const index_t rows = opt.rows(), dim = opt.dim(), slots = Rule::slots;
  safetensors_writer out;
  out.set_metadata("format", checkpoint_format);
  out.set_metadata("rule", Rule::name);
  out.set_metadata("state_precision", element_name<State>());
  out.set_metadata("slots", std::to_string(slots));
  out.set_metadata("rows", std::to_string(rows));
  out.set_metadata("dim", std::to_string(dim));
  out.set_metadata("steps", std::to_string(opt.steps()));
  out.add("state", {rows, dim, slots}, to_host<OB>(res, matrix_view<State>(opt.state(), rows, dim * slots)).data());
  if (opt.bias_state())
    out.add("bias_state", {rows, slots}, to_host<OB>(res, matrix_view<State>(opt.bias_state(), rows, slots)).data());
  out.add("update_counts", {rows}, to_host<OB>(res, matrix_view<std::int64_t>(opt.update_counts(), rows, 1)).data());
  return out;
}

template <class State>
struct optimizer_contents_read {
  std::vector<State> state, bias_state;
  std::vector<std::int64_t> counts;
  std::int64_t steps = 0;
};

/// The step count and per-row update counts a loader restores, as one rule for every loader: the
/// steps in [0, 2^62] (sparse_optimizer::max_steps), every count in [0, steps] (a step updates a row
/// once at most). Counts no run could reach would overflow the next step's counting (signed
/// overflow) and drive the bias corrections to non-finite weights. Throws `checkpoint_error`
/// "<where>: ..." naming the value.
inline void check_optimizer_counts(const std::string& where, std::int64_t steps, const std::vector<std::int64_t>& counts) {
  constexpr std::int64_t most = std::int64_t(1) << 62;
  if (steps < 0 || steps > most)
    throw checkpoint_error(xsoftmax::detail::message(where, ": metadata \"steps\" = ", steps, " is outside [0, 2^62]"));
  for (std::size_t i = 0; i < counts.size(); ++i)
    if (counts[i] < 0 || counts[i] > steps)
      throw checkpoint_error(xsoftmax::detail::message(where, ": tensor \"update_counts\": row ", i, " has count ",
                                                       counts[i], ", outside [0, steps = ", steps, "]"));
}

template <class Rule, class OB, class State>
[[nodiscard]] optimizer_contents_read<State> read_optimizer(const std::string& path,
                                                            const sparse_optimizer<Rule, OB, State>& opt) {
  const safetensors_file f = safetensors_file::read(path);
  const index_t rows = opt.rows(), dim = opt.dim(), slots = Rule::slots;
  expect_metadata(f, "format", checkpoint_format, "reader (an xsoftmax checkpoint) expects");
  expect_metadata(f, "rule", Rule::name, "optimizer");
  expect_metadata(f, "slots", std::to_string(slots), "optimizer");
  expect_metadata(f, "rows", std::to_string(rows), "optimizer");
  expect_metadata(f, "dim", std::to_string(dim), "optimizer");
  optimizer_contents_read<State> r;
  r.steps = metadata_integer(f, "steps");
  check_optimizer_counts(f.path(), r.steps, {});
  r.state = f.values<State>("state", {rows, dim, slots});
  if (opt.bias_state() && !f.find("bias_state")) f.fail("the optimizer has bias state but the file has none");
  if (!opt.bias_state() && f.find("bias_state")) f.fail("the file has bias state but the optimizer has none");
  if (opt.bias_state()) r.bias_state = f.values<State>("bias_state", {rows, slots});
  r.counts = f.values<std::int64_t>("update_counts", {rows});
  check_optimizer_counts(f.path(), r.steps, r.counts);
  return r;
}

template <class Head, class Rule, class OB, class State>
void install_optimizer(const Head& head, sparse_optimizer<Rule, OB, State>& opt, const optimizer_contents_read<State>& r) {
  const auto& res = head.resources();
  const index_t rows = opt.rows(), slots = Rule::slots;
  from_host<OB>(res, r.state, matrix_view<State>(opt.state(), rows, opt.dim() * slots));
  if (opt.bias_state()) from_host<OB>(res, r.bias_state, matrix_view<State>(opt.bias_state(), rows, slots));
  from_host<OB>(res, r.counts, matrix_view<std::int64_t>(opt.update_counts(), rows, 1));
  opt.set_steps(r.steps);
}

inline void make_directory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw checkpoint_error(xsoftmax::detail::message(dir, ": cannot create the directory: ", ec.message()));
}

}  // namespace io::detail

/// Saves `head` (any head: full_softmax, hierarchical_softmax, selective_softmax, knn_softmax, on
/// any backend) to `dir/head.safetensors` (layout in the file comment), creating `dir` if needed.
/// Each file is written to a temporary name and renamed over the old one, so an interrupted save
/// never leaves a truncated file. An `optimizer.safetensors` left in `dir` by an earlier save is
/// removed, so that the directory never pairs this head with stale optimizer state. Throws
/// `checkpoint_error` naming the path when a file cannot be written.
template <class Head>
void save_checkpoint(const std::string& dir, const Head& head) {
  const io::safetensors_writer contents = io::detail::head_contents(head);
  io::detail::make_directory(dir);
  contents.write(io::detail::path_in(dir, checkpoint_head_file));
  std::error_code ignored;
  std::filesystem::remove(io::detail::path_in(dir, checkpoint_optimizer_file), ignored);
}

/// Saves `head` and `optimizer`'s state (moments, bias state, per-row update counts, step count)
/// to `dir`. Throws `shape_error` when the optimizer was made for another weight shape than the
/// head's, and `checkpoint_error` as above. The rule's hyperparameters (learning-rate schedule,
/// betas) are the caller's and are not saved.
template <class Head, class Rule, class OptBackend, class State>
void save_checkpoint(const std::string& dir, const Head& head, const sparse_optimizer<Rule, OptBackend, State>& optimizer) {
  io::detail::check_optimizer_fits("save_checkpoint", head, optimizer);
  const io::safetensors_writer head_file = io::detail::head_contents(head);
  const io::safetensors_writer optimizer_file = io::detail::optimizer_contents(head, optimizer);
  io::detail::make_directory(dir);
  head_file.write(io::detail::path_in(dir, checkpoint_head_file));
  optimizer_file.write(io::detail::path_in(dir, checkpoint_optimizer_file));
}

/// Loads `dir/head.safetensors` into `head`, which must be of the saved kind, N, dim, weight rows,
/// bias presence, node form and tree (precision may differ: see the file comment). A knn_softmax
/// gets the saved graph (its rebuild schedule restarts counting at the load). Throws
/// `checkpoint_error` naming the file and the problem (unreadable, malformed, or not matching the
/// head); `head` is unchanged then.
template <class Head>
void load_checkpoint(const std::string& dir, Head& head) {
  auto contents = io::detail::read_head(io::detail::path_in(dir, checkpoint_head_file), head);
  io::detail::install_head(head, contents);
}

/// Loads `head` and `optimizer` from `dir`; both files are validated before either is written.
/// Throws `shape_error` when the optimizer does not fit the head, `checkpoint_error` otherwise
/// (as above, and for another rule, slot count, state shape or bias-state presence).
template <class Head, class Rule, class OptBackend, class State>
void load_checkpoint(const std::string& dir, Head& head, sparse_optimizer<Rule, OptBackend, State>& optimizer) {
  io::detail::check_optimizer_fits("load_checkpoint", head, optimizer);
  auto head_contents = io::detail::read_head(io::detail::path_in(dir, checkpoint_head_file), head);
  const auto optimizer_contents =
      io::detail::read_optimizer(io::detail::path_in(dir, checkpoint_optimizer_file), optimizer);
  io::detail::install_head(head, head_contents);
  io::detail::install_optimizer(head, optimizer, optimizer_contents);
}

/// The runtime tree saved in `dir` by a hierarchical_softmax over a `runtime_tree`, rebuilt through
/// `runtime_tree<MaxDepth>::from_parents` (same rows, blocks and leaf order), so that a head can be
/// made for it before `load_checkpoint`. Throws `checkpoint_error` naming the file when it holds
/// no runtime tree, a forest of several trees (`runtime_tree::forest`), or codes that do not form
/// a valid tree of depth <= MaxDepth.
template <int MaxDepth = 64>
[[nodiscard]] runtime_tree<MaxDepth> load_runtime_tree(const std::string& dir) {
  const auto f = io::safetensors_file::read(io::detail::path_in(dir, checkpoint_head_file));
  io::detail::expect_metadata(f, "tree", "runtime", "reader (load_runtime_tree) expects");
  const index_t n = io::detail::metadata_integer(f, "num_classes");
  const index_t internal = io::detail::metadata_integer(f, "tree.internal_nodes");
  const index_t rows = io::detail::metadata_integer(f, "weight_rows");
  if (n < 1 || internal < 1 || rows < 1) f.fail("num_classes, tree.internal_nodes and weight_rows must be >= 1");
  // Checkpoints written before forests existed have no count: one tree.
  if (f.metadata().count("tree.trees") && io::detail::metadata_integer(f, "tree.trees") != 1)
    f.fail("the head's tree is a forest of ", io::detail::metadata_integer(f, "tree.trees"),
           " trees (runtime_tree::forest): load_runtime_tree rebuilds a single tree; build the forest again and "
           "load_checkpoint into a head over it");
  const auto parent_node = f.values<index_t>("tree.row_parent", {rows});
  const auto child_code = f.values<index_t>("tree.row_child", {rows});
  // The counts against what the file holds before anything is sized by them: the row tensors hold
  // `rows` entries (values() checked their shapes before allocating), and in one tree every class
  // and every internal node but the root hangs below its own row.
  if (n > rows || internal - 1 > rows - n)
    f.fail("num_classes = ", n, " and tree.internal_nodes = ", internal, " do not fit a tree of weight_rows = ", rows,
           " rows (a row per class and per internal node but the root)");
  // Node ids for from_parents: the root is node 0, row r is node r + 1. Children are ordered by node
  // id there, so each block keeps its row order, and the breadth-first layout comes out the same.
  std::vector<index_t> node_row(static_cast<std::size_t>(internal), -1);  // internal node -> its row
  std::vector<index_t> parent(static_cast<std::size_t>(rows + 1), -1), leaf_class(static_cast<std::size_t>(rows + 1), -1);
  for (index_t r = 0; r < rows; ++r) {
    const index_t c = child_code[static_cast<std::size_t>(r)];
    if (c >= internal || c < -n) f.fail("tensor \"tree.row_child\": row ", r, " has code ", c, " outside [-", n, ", ", internal, ")");
    if (c == 0) f.fail("tensor \"tree.row_child\": row ", r, " leads to the root");
    if (c > 0 && node_row[static_cast<std::size_t>(c)] >= 0)
      f.fail("tensor \"tree.row_child\": internal node ", c, " hangs below two rows");
    if (c > 0) node_row[static_cast<std::size_t>(c)] = r;
    else leaf_class[static_cast<std::size_t>(r + 1)] = -c - 1;
  }
  for (index_t r = 0; r < rows; ++r) {
    const index_t p = parent_node[static_cast<std::size_t>(r)];
    if (p < 0 || p >= internal || (p > 0 && node_row[static_cast<std::size_t>(p)] < 0))
      f.fail("tensor \"tree.row_parent\": row ", r, " has parent node ", p, ", which no row leads to");
    parent[static_cast<std::size_t>(r + 1)] = p == 0 ? 0 : node_row[static_cast<std::size_t>(p)] + 1;
  }
  try {
    return runtime_tree<MaxDepth>::from_parents(std::move(parent), std::move(leaf_class), n);
  } catch (const std::exception& e) {
    f.fail("the saved tree codes do not form a valid tree: ", e.what());
  }
}

}  // namespace xsoftmax
