// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `selective_softmax` over `class_sharding<Communicator>`: the rows gathered as the sharded full
/// softmax gathers them, the selector run on the whole gathered batch (the same global active set on
/// every rank), the unsharded shared or per-sample pass over this rank's slice of the set with the
/// row statistics combined between its passes (the sharded full softmax's `combine_row_statistics`),
/// and the hidden gradients returned to their owners.

#include <xsoftmax/detail/sharding/sharded_selection.hpp>

namespace xsoftmax {

template <class S, class P, class B, class Sh>
selective_softmax<S, P, B, Sh>::selective_softmax(S selector, Sh sharding, index_t dim, bool with_bias,
                                                  init_options init, backend_resources<B> resources)
    : weights_base("selective_softmax", std::move(sharding), dim, with_bias, init, resources),
      selector_(std::move(selector)) {
  static_assert(sharded, "selective_softmax: only a class-sharded head is constructed from a sharding");
}

template <class S, class P, class B, class Sh>
selective_softmax<S, P, B, Sh>::selective_softmax(S selector, Sh sharding, matrix_view<storage_type> local_weights,
                                                  storage_type* local_bias, backend_resources<B> resources)
    : weights_base("selective_softmax", std::move(sharding), local_weights, local_bias, resources),
      selector_(std::move(selector)) {
  static_assert(sharded, "selective_softmax: only a class-sharded head is constructed from a sharding");
}

// Gather the rows, select on the whole batch, one pass over the local slice of the active set with
// the row statistics combined between its passes, return each row's hidden gradient to its owner,
// reduce the owner's losses.
template <class S, class P, class B, class Sh>
template <class H>
void selective_softmax<S, P, B, Sh>::run_sharded_into_(const char* where, matrix_view<const H> hidden,
                                                       vector_view<const index_t> targets, loss_options options,
                                                       vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                                       gradient_type* grad_weights,
                                                       vector_view<const float> grad_output, float* loss) const {
  const detail::execution<B> ex{resources_};  // inputs were checked by head_verbs
  const index_t d = dim();
  detail::sharded_batch<B> b =
      detail::gather_batch(ex, where, sharding_, hidden, targets, options, grad_weights != nullptr, grad_output);
  detail::sharded_rows<B>& rows = b.rows;
  const index_t batch_rows = detail::gather_samples(ex, sharding_, b.own.sample, hidden.rows, rows);
  const index_t total = rows.all.rows;
  detail::scratch_vector<B, float> losses(static_cast<std::size_t>(total), ex, 0.f);
  detail::scratch_vector<B, float> grad_all(grad_weights ? static_cast<std::size_t>(total * d) : 0, ex, 0.f);

  if (total > 0) {  // the same on every rank: every rank throws here alike, or none does
    auto set = detail::make_selection_set<S>(ex);  // working memory of the call when the selector takes it
    selector_.select(ex, request_(where, rows.all, batch_rows), set);
    const detail::scratch_vector<B, index_t> pos =
        detail::locate_targets(ex, where, set, rows.all, num_classes(), !detail::selector_sets_valid<S>);
    const detail::local_active_set<B> local =
        detail::slice_active_set(ex, set, pos, total, class_begin(), class_begin() + local_classes());
    const auto w = matrix_view<const storage_type>(weights());
    const float* up = grad_weights ? detail::raw(rows.upstream) : nullptr;
    const index_t* tpos = thrust::raw_pointer_cast(local.target_pos.data());
    // Margins, offsets and the loss terms need nothing more: the target's logit (with its margin and
    // offset) lives on its owner only, the finite-score sums and counts are summed over the ranks,
    // and the margin's normalisation Jacobian is linear, so the ranks' partial hidden gradients sum.
    const auto combine = [&](const detail::dense_row_statistics& st) {
      detail::combine_row_statistics(ex, sharding_.communicator(), st);
    };
    if (set.layout == active_layout::shared) {
      // The unsharded head's chunk rule on the global set's size keeps its chunking policy.
      const index_t chunk = chunk_size_for(total, static_cast<index_t>(set.classes.size()));
      detail::shared_pass(ex, rows.all, local.set, tpos, w, store_.bias(), chunk, options, up, detail::raw(losses),
                          detail::raw(grad_all), grad_weights, combine);
    } else {
      detail::per_sample_pass(ex, rows.all, local.set, tpos, w, store_.bias(), options, up, detail::raw(losses),
                              detail::raw(grad_all), grad_weights, combine);
    }
  } else if (grad_weights) {  // every sample of every rank ignored: no row is touched
    grad_weights->dim = d;
    grad_weights->rows.clear();
    grad_weights->values.clear();
    grad_weights->bias_values.clear();
  }
  detail::finish_batch(ex, sharding_, rows, b.own, grad_all, losses, options.reduce, per_sample, grad_hidden, loss);
}

}  // namespace xsoftmax
