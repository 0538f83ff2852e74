// SPDX-License-Identifier: Apache-2.0
//
// Label trees from class vectors for the PyTorch package (Python module functions, called by
// xsoftmax.tree.Tree.kmeans and HierarchicalSoftmaxLoss.init_weights_from_class_vectors; not
// operators: they run once, outside any autograd graph):
//
//   kmeans_tree_parents(vectors, branching, max_depth, iterations, spherical, seed) -> (parent, leaf_class)
//       the library's balanced hierarchical k-means (kmeans_label_tree) over the rows of `vectors`
//       (N x d, any device and float dtype; computed on the CPU in float32), as the parent array
//       that Tree.from_parents takes (to_parent_array: the same tree, row for row).
//   tree_weights_from_class_vectors(head, vectors) -> rows
//       a tree head's weight rows (R x d float32, CPU) from one vector per class
//       (init_tree_weights_from_class_vectors: softmax nodes the mean of each child's classes,
//       sigmoid nodes the difference of the two children's means); d = 1 for biases.
//
// The library's exceptions become ValueError (bad arguments, non-finite values, tree errors).

#include "head_states.hpp"
#include "tensor_args.hpp"

#include <torch/extension.h>

#include <xsoftmax/tree/kmeans_tree.hpp>
#include <xsoftmax/tree/parent_array.hpp>

#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

namespace xsoftmax_torch {

namespace {

/// `vectors` as a dense CPU float32 matrix (N x d), checked: 2-D, at least one row and column.
at::Tensor class_vector_matrix(const at::Tensor& vectors, const char* op) {
  TORCH_CHECK_VALUE(vectors.dim() == 2, "xsoftmax: ", op, ": class_vectors must be 2-D (num_classes x dim), got shape ",
                    vectors.sizes());
  TORCH_CHECK_VALUE(vectors.size(0) >= 1 && vectors.size(1) >= 1, "xsoftmax: ", op,
                    ": class_vectors must have at least one row and one column, got shape ", vectors.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(vectors.scalar_type()), "xsoftmax: ", op,
                    ": class_vectors must be a floating-point tensor, got ", vectors.scalar_type());
  return vectors.detach().to(at::kCPU, at::kFloat).contiguous();
}

at::Tensor index_tensor(const std::vector<index_t>& v) {
  at::Tensor out = at::empty({static_cast<int64_t>(v.size())}, at::TensorOptions().dtype(at::kLong));
  if (!v.empty()) std::memcpy(out.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return out;
}

std::tuple<at::Tensor, at::Tensor> kmeans_tree_parents(const at::Tensor& vectors, int64_t branching, int64_t max_depth,
                                                       int64_t iterations, bool spherical, int64_t seed) {
  return guarded([&] {
    const at::Tensor v = class_vector_matrix(vectors, "Tree.kmeans");
    TORCH_CHECK_VALUE(max_depth >= 0 && max_depth <= std::numeric_limits<int>::max(), "xsoftmax: Tree.kmeans: depth = ",
                      max_depth, " must be >= 0 (0: no limit)");
    xs::kmeans_tree_options o;
    o.branching = branching;
    o.max_depth = static_cast<int>(max_depth);
    o.iterations = iterations;
    o.spherical = spherical;
    o.seed = static_cast<unsigned long long>(seed);
    xs::tree_parent_array a;
    {
      pybind11::gil_scoped_release no_gil;
      const auto tree = xs::kmeans_label_tree<host_backend, 64>(
          xs::matrix_view<const float>(v.data_ptr<float>(), v.size(0), v.size(1)), o);
      a = xs::to_parent_array(tree);
    }
    return std::make_tuple(index_tensor(a.parent), index_tensor(a.leaf_class));
  });
}

at::Tensor tree_weights_from_class_vectors(int64_t head, const at::Tensor& vectors) {
  return guarded([&] {
    const std::shared_ptr<state> st = find_state(head, "init_weights_from_class_vectors");
    auto* t = dynamic_cast<tree_state*>(st.get());
    TORCH_CHECK_VALUE(t != nullptr, "xsoftmax: init_weights_from_class_vectors: head = ", head, " is not a tree");
    const at::Tensor v = class_vector_matrix(vectors, "init_weights_from_class_vectors");
    const index_t rows = t->sigmoid ? t->tree.num_rows() / 2 : t->tree.num_rows();
    at::Tensor out = at::empty({rows, v.size(1)}, at::TensorOptions().dtype(at::kFloat));
    pybind11::gil_scoped_release no_gil;
    const xs::matrix_view<const float> cv(v.data_ptr<float>(), v.size(0), v.size(1));
    const xs::matrix_view<float> w(out.data_ptr<float>(), rows, v.size(1));
    if (t->sigmoid)
      xs::init_tree_weights_from_class_vectors<host_backend>(t->tree, cv, w, xs::sigmoid_nodes{});
    else
      xs::init_tree_weights_from_class_vectors<host_backend>(t->tree, cv, w, xs::softmax_nodes{});
    return out;
  });
}

}  // namespace

void register_tree_builders(pybind11::module& m) {
  m.def("kmeans_tree_parents", &kmeans_tree_parents, pybind11::arg("vectors"), pybind11::arg("branching"),
        pybind11::arg("max_depth"), pybind11::arg("iterations"), pybind11::arg("spherical"), pybind11::arg("seed"));
  m.def("tree_weights_from_class_vectors", &tree_weights_from_class_vectors, pybind11::arg("head"),
        pybind11::arg("vectors"));
}

}  // namespace xsoftmax_torch
