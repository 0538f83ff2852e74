// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// What differs between head kinds in a checkpoint: the kind's name, and the structure saved
/// beside the weights (a tree, a KNN graph), chosen by overload on the head type. Loading a
/// structure is split in two: `read_structure` reads and checks everything and returns the action
/// that installs it, run only after every check of the whole checkpoint has passed.

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/io/safetensors.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selective_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <charconv>
#include <functional>
#include <string>
#include <vector>

namespace xsoftmax::io::detail {

/// The backend a head runs on.
template <class Head>
struct head_backend;
template <class P, class B, class S>
struct head_backend<full_softmax<P, B, S>> { using type = B; };
template <class Tree, class P, class B, class NodeForm>
struct head_backend<hierarchical_softmax<Tree, P, B, NodeForm>> { using type = B; };
template <class Sel, class P, class B, class S>
struct head_backend<selective_softmax<Sel, P, B, S>> { using type = B; };
template <class P, class B, class S>
struct head_backend<knn_softmax<P, B, S>> { using type = B; };

/// Installs what `read_structure` read; empty when there is nothing beyond the weights.
using install_action = std::function<void()>;

/// The integer metadata value of `key`; throws `checkpoint_error` naming the file and key when it
/// is missing or not a decimal integer.
[[nodiscard]] inline std::int64_t metadata_integer(const safetensors_file& f, const std::string& key) {
  const std::string& text = f.metadata(key);
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    f.fail("metadata \"", key, "\" = \"", text, "\" is not an integer");
  return v;
}

/// Throws `checkpoint_error` "metadata <key> = <file's> but the <who> has <expected>" unless equal.
inline void expect_metadata(const safetensors_file& f, const std::string& key, const std::string& expected,
                            const char* who) {
  const std::string& got = f.metadata(key);
  if (got != expected) f.fail("metadata \"", key, "\" = \"", got, "\" but the ", who, " has \"", expected, "\"");
}

// ---- full_softmax and selective_softmax: the weights say it all. A generic selective head's
// selector state (explicit candidates, a sampler's step, an IVF index) is not saved: it is either
// given by the caller each step or rebuilt from the weights.

template <class P, class B>
[[nodiscard]] const char* head_kind(const full_softmax<P, B>&) { return "full_softmax"; }
template <class P, class B>
void save_structure(safetensors_writer&, const full_softmax<P, B>&) {}
template <class P, class B>
[[nodiscard]] install_action read_structure(const safetensors_file&, full_softmax<P, B>&) { return {}; }

template <class S, class P, class B>
[[nodiscard]] const char* head_kind(const selective_softmax<S, P, B>&) { return "selective_softmax"; }
template <class S, class P, class B>
void save_structure(safetensors_writer&, const selective_softmax<S, P, B>&) {}
template <class S, class P, class B>
[[nodiscard]] install_action read_structure(const safetensors_file&, selective_softmax<S, P, B>&) { return {}; }

// ---- knn_softmax: the neighbour table, so that a resumed run selects exactly the active sets the
// saved one would have (rebuilding from the weights could differ by ties, or for an IVF graph).

template <class P, class B>
[[nodiscard]] const char* head_kind(const knn_softmax<P, B>&) { return "knn_softmax"; }

template <class P, class B>
void save_structure(safetensors_writer& w, const knn_softmax<P, B>& head) {
  const knn_graph& g = head.graph();
  if (g.empty()) return;
  w.set_metadata("graph.k", std::to_string(g.k()));
  w.set_metadata("graph.metric", g.metric() == similarity::cosine ? "cosine" : "inner_product");
  w.add("graph.ids", {g.num_classes(), g.k()}, g.ids().data());
}

template <class P, class B>
[[nodiscard]] install_action read_structure(const safetensors_file& f, knn_softmax<P, B>& head) {
  if (!f.find("graph.ids")) return {};  // saved before any graph was built: the head keeps its own
  const index_t k = metadata_integer(f, "graph.k");
  if (k < 1 || k > head.num_classes())
    f.fail("metadata \"graph.k\" = ", k, " is outside [1, num_classes = ", head.num_classes(), "]");
  std::vector<index_t> ids = f.values<index_t>("graph.ids", {head.num_classes(), k});
  knn_graph graph;
  try {
    graph = knn_graph::from_lists(head.num_classes(), head.dim(), k, std::move(ids));
  } catch (const std::exception& e) {
    f.fail("tensor \"graph.ids\" is not a valid neighbour table: ", e.what());
  }
  return [&head, graph = std::move(graph)]() mutable {
    head.selector() = knn_selector(std::move(graph), head.selector().options());
  };
}

// ---- hierarchical_softmax: the tree's shape, checked against the head's on load (the weights'
// rows mean nothing under another tree).

template <int D, int Br>
void save_tree(safetensors_writer& w, const uniform_tree<D, Br>&) {
  w.set_metadata("tree", "uniform");
  w.set_metadata("tree.depth", std::to_string(D));
  w.set_metadata("tree.branching", std::to_string(Br));
}
template <int D, int Br>
void check_tree(const safetensors_file& f, const uniform_tree<D, Br>&) {
  expect_metadata(f, "tree", "uniform", "head's tree");
  expect_metadata(f, "tree.depth", std::to_string(D), "head's uniform_tree");
  expect_metadata(f, "tree.branching", std::to_string(Br), "head's uniform_tree");
}

/// A runtime tree is saved as its rows' codes: `tree.row_parent[r]`, the internal node (numbered
/// breadth-first, root 0) whose block holds row r, and `tree.row_child[r]`, the internal node
/// below row r or -(class + 1) for a leaf. They determine the tree (see `load_runtime_tree`).
template <int M>
void save_tree(safetensors_writer& w, const runtime_tree<M>& t) {
  w.set_metadata("tree", "runtime");
  w.set_metadata("tree.internal_nodes", std::to_string(t.num_internal_nodes()));
  w.set_metadata("tree.height", std::to_string(t.height()));
  // A forest (runtime_tree::forest) has a root per tree: the codes are saved the same way, and
  // load_runtime_tree, which rebuilds one tree, refuses it by this count.
  w.set_metadata("tree.trees", std::to_string(t.num_trees()));
  w.add("tree.row_parent", {t.num_rows()}, t.row_parents().data());
  w.add("tree.row_child", {t.num_rows()}, t.row_children().data());
}
template <int M>
void check_tree(const safetensors_file& f, const runtime_tree<M>& t) {
  expect_metadata(f, "tree", "runtime", "head's tree");
  const auto parent = f.values<index_t>("tree.row_parent", {t.num_rows()});
  const auto child = f.values<index_t>("tree.row_child", {t.num_rows()});
  for (std::size_t r = 0; r < parent.size(); ++r)
    if (parent[r] != t.row_parents()[r] || child[r] != t.row_children()[r])
      f.fail("the saved tree differs from the head's at weight row ", r, " (parent node ", parent[r], " vs ",
             t.row_parents()[r], ", child code ", child[r], " vs ", t.row_children()[r], ")");
}

/// Any other tree shape: only its sizes are saved and checked.
template <class Tree>
void save_tree(safetensors_writer& w, const Tree&) { w.set_metadata("tree", "custom"); }
template <class Tree>
void check_tree(const safetensors_file& f, const Tree&) { expect_metadata(f, "tree", "custom", "head's tree"); }

template <class Tree, class P, class B, class NF>
[[nodiscard]] const char* head_kind(const hierarchical_softmax<Tree, P, B, NF>&) { return "hierarchical_softmax"; }

template <class Tree, class P, class B, class NF>
void save_structure(safetensors_writer& w, const hierarchical_softmax<Tree, P, B, NF>& head) {
  w.set_metadata("node_form", head.sigmoid_form ? "sigmoid" : "softmax");
  save_tree(w, head.tree());
}

template <class Tree, class P, class B, class NF>
[[nodiscard]] install_action read_structure(const safetensors_file& f, hierarchical_softmax<Tree, P, B, NF>& head) {
  expect_metadata(f, "node_form", head.sigmoid_form ? "sigmoid" : "softmax", "head");
  check_tree(f, head.tree());
  return {};
}

}  // namespace xsoftmax::io::detail
