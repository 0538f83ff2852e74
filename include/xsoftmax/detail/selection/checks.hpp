// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Checks shared by the selectors: a neighbour / candidate count against N, and a structure built
/// from class weights (KNN graph, IVF index) against the head it is used with.

#include <xsoftmax/config.hpp>
#include <xsoftmax/error.hpp>

#include <cstring>

namespace xsoftmax::detail {

/// `k` (named `name`) must lie in [1, n]; `n_name` says what n is.
inline void check_count(const char* where, const char* name, index_t k, index_t n, const char* n_name) {
  expects(k >= 1 && k <= n, where, ": ", name, " = ", k, " must be in [1, ", n_name, " = ", n, "]");
}

/// A structure (`what`) built for `built_n` classes of width `built_dim` from weights stored as
/// `built_element` must match the head's N, dim and storage element. `shape_error` names both
/// shapes; a precision mismatch (a graph built from bf16 weights used with an fp32 head) throws
/// `invalid_argument` naming both element types. `built_element` null means "any precision"
/// (user-provided lists).
inline void check_built_for(const char* where, const char* what, index_t built_n, index_t built_dim,
                            const char* built_element, index_t n, index_t dim, const char* element) {
  expects<shape_error>(built_n == n && built_dim == dim, where, ": the ", what, " was built for num_classes = ",
                       built_n, ", dim = ", built_dim, " but the head has num_classes = ", n, ", dim = ", dim);
  expects(built_element == nullptr || std::strcmp(built_element, element) == 0, where, ": the ", what,
          " was built from ", built_element, " weights but the head stores ", element,
          " weights; rebuild it from the head's weights");
}

}  // namespace xsoftmax::detail
