// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The checks of a verb's arguments that need no data, only sizes and pointers: they run on the host
/// for every backend, before anything is queued or written. The data checks (finite values,
/// targets in range) run where the data lives (primitives/batch_rows.hpp).

#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <cmath>

namespace xsoftmax::detail {

/// `hidden` must be a non-empty (B x dim) matrix with a valid stride.
template <class H>
void check_hidden_shape(const char* where, matrix_view<const H> hidden, index_t dim) {
  static_assert(is_supported_element<H>, "xsoftmax: hidden must be float, double, bf16 or fp16");
  expects<shape_error>(hidden.cols == dim, where, ": hidden has ", hidden.cols, " columns but the head's dim is ",
                       dim);
  expects(hidden.rows > 0, where, ": empty batch (hidden.rows = ", hidden.rows, ")");
  expects(hidden.data != nullptr, where, ": hidden.data is null");
  expects<shape_error>(hidden.stride >= hidden.cols, where, ": hidden.stride = ", hidden.stride,
                       " is smaller than hidden.cols = ", hidden.cols);
}

/// `reduce` is one of the enumerators of `reduction` (an enum can hold any value of its
/// underlying type: a cast integer, a value read from a file).
inline void check_reduction(const char* where, reduction reduce) {
  expects(reduce == reduction::none || reduce == reduction::mean || reduce == reduction::sum, where,
          ": options.reduce = ", static_cast<int>(reduce), " is not a reduction (none = 0, mean = 1, sum = 2)");
}

/// label_smoothing in [0, 1] and z_loss >= 0, both finite; both 0 for a head that does not define
/// them (`supported` false: the hierarchical softmax).
inline void check_loss_terms(const char* where, const loss_options& o, bool supported, const char* head) {
  expects(o.label_smoothing >= 0.f && o.label_smoothing <= 1.f, where, ": options.label_smoothing = ",
          o.label_smoothing, " must be in [0, 1]");
  expects(o.z_loss >= 0.f && o.z_loss < INFINITY, where, ": options.z_loss = ", o.z_loss,
          " must be finite and >= 0");
  expects(supported || (o.label_smoothing == 0.f && o.z_loss == 0.f), where, ": options.label_smoothing = ",
          o.label_smoothing, " and options.z_loss = ", o.z_loss, " must be 0: ", head,
          " does not define them (its loss is a product of node softmaxes, with no softmax over all classes)");
}

/// softcap finite and >= 0; 0 for a head that does not define it (`supported` false: the
/// hierarchical softmax) and with a margin.
inline void check_softcap(const char* where, const loss_options& o, bool supported, const char* head) {
  expects(o.softcap >= 0.f && o.softcap < INFINITY, where, ": options.softcap = ", o.softcap,
          " must be finite and >= 0 (0: no soft-capping)");
  if (o.softcap == 0.f) return;
  expects(supported, where, ": options.softcap = ", o.softcap, " must be 0: ", head,
          " does not define it (its loss is a product of node softmaxes, with no logits over all classes)");
  expects(!o.margin.enabled(), where, ": options.softcap = ", o.softcap,
          " must be 0 with a margin (the margin's logits are bounded by its scale already)");
}

/// gradient_filter in [0, 1); 0 for a head that does not define it (`supported` false: every head
/// but the full softmax).
inline void check_gradient_filter(const char* where, const loss_options& o, bool supported, const char* head) {
  expects(o.gradient_filter >= 0.f && o.gradient_filter < 1.f, where, ": options.gradient_filter = ",
          o.gradient_filter, " must be in [0, 1) (0: the exact gradient)");
  expects(supported || o.gradient_filter == 0.f, where, ": options.gradient_filter = ", o.gradient_filter,
          " must be 0: ", head, " does not define it (only the full softmax filters its gradient)");
}

/// class_weight: empty, or one value per class (`num_classes`), with a data pointer; not for a head
/// that does not take it (`supported` false: the class-sharded heads).
/// Its values are checked where they live (check_class_weight_values).
inline void check_class_weight_shape(const char* where, const loss_options& o, index_t num_classes, bool supported,
                                     const char* head) {
  if (o.class_weight.size == 0) return;
  expects(supported, where, ": options.class_weight is not supported by the class-sharded ", head);
  expects<shape_error>(o.class_weight.size == num_classes, where, ": options.class_weight has ", o.class_weight.size,
                       " values but the head has ", num_classes, " classes");
  expects(o.class_weight.data != nullptr, where, ": options.class_weight has ", o.class_weight.size,
          " values and a null data pointer");
}

/// A margin (see `margin_options`) is a known kind with a finite scale > 0 and a margin in
/// [0, pi / 2) for ArcFace (past pi / 2 cos(theta + m) is no longer a penalty for every theta) or
/// finite and >= 0 for CosFace; only for a head that defines it (`supported`) and has no bias.
inline void check_margin(const char* where, const margin_options& o, bool supported, const char* head,
                         bool has_bias) {
  const auto kind = static_cast<int>(o.kind);
  expects(kind >= 0 && kind <= 2, where, ": options.margin.kind = ", kind,
          " is not a margin_kind (none = 0, arcface = 1, cosface = 2)");
  if (!o.enabled()) return;
  const char* name = o.kind == margin_kind::arcface ? "arcface" : "cosface";
  expects(supported, where, ": options.margin.kind = ", name, " must be none: ", head,
          " does not define margins (its loss is a product of node softmaxes, with no softmax over all classes)");
  expects(!has_bias, where, ": options.margin.kind = ", name,
          " needs a head without a bias (a margin logit is s cos theta, with no bias term)");
  expects(o.scale > 0.f && o.scale < INFINITY, where, ": options.margin.scale = ", o.scale,
          " must be finite and > 0");
  if (o.kind == margin_kind::arcface)
    expects(o.m >= 0.f && o.m < 1.5707963f, where, ": options.margin.m = ", o.m,
            " must be in [0, pi/2) for arcface");
  else
    expects(o.m >= 0.f && o.m < INFINITY, where, ": options.margin.m = ", o.m, " must be finite and >= 0 for cosface");
}

/// One target per hidden row.
inline void check_targets_shape(const char* where, vector_view<const index_t> targets, index_t rows) {
  expects<shape_error>(targets.size == rows, where, ": targets has ", targets.size, " entries but hidden has ", rows,
                       " rows");
  expects(targets.data != nullptr || rows == 0, where, ": targets.data is null");
}

/// `grad_output` of a backward verb: empty (all ones), a scalar (mean/sum), or one value per sample
/// (reduction none).
inline void check_grad_output_shape(const char* where, reduction reduce, vector_view<const float> grad_output,
                                    index_t batch_rows) {
  if (reduce == reduction::none) {
    expects<shape_error>(grad_output.size == 0 || grad_output.size == batch_rows, where, ": grad_output has ",
                         grad_output.size, " entries; reduction none needs 0 (all ones) or ", batch_rows);
  } else {
    expects<shape_error>(grad_output.size <= 1, where, ": grad_output has ", grad_output.size,
                         " entries; reduction mean/sum takes 0 (one) or 1 (a scalar)");
  }
  expects(grad_output.data != nullptr || grad_output.size == 0, where, ": grad_output.data is null but it has ",
          grad_output.size, " entries");
}

}  // namespace xsoftmax::detail
