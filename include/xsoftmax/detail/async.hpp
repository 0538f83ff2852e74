// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// What every head's `_async` verbs share on every backend: the check of their `loss` argument.
/// Included by backend.hpp, so that each head's implementation sees it.

#include <xsoftmax/error.hpp>

namespace xsoftmax::detail {

/// The `loss` argument of an `_async` verb (a `vector_view<float>`): exactly one element, not null.
/// Throws `shape_error` / `invalid_argument` naming `where`. A template only so that this header
/// needs no other xsoftmax header (backend.hpp, which includes it, is below types.hpp).
template <class LossView>
void check_async_loss(const char* where, const LossView& loss) {
  expects<shape_error>(loss.size == 1, where, ": loss has ", loss.size, " entries; it receives the reduced loss (1)");
  expects(loss.data != nullptr, where, ": loss.data is null");
}

}  // namespace xsoftmax::detail
