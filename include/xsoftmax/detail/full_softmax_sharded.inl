// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `full_softmax` over `class_sharding<Communicator>`: the unsharded algorithm on this rank's block
/// of classes, with the rows gathered from every rank before it, the row statistics combined
/// between its two passes, and the hidden gradients returned to their owners after it (as
/// Megatron's vocab-parallel cross-entropy: one max and one sum all-reduce per step).

#include <xsoftmax/detail/primitives/score_chunks.hpp>
#include <xsoftmax/detail/sharding/sharded_rows.hpp>

#include <algorithm>
#include <optional>

namespace xsoftmax {

namespace detail {
/// Slot (r, e) of a rank's k candidates a row: its e-th best of its local_k (score -inf and class -1
/// past them), as the merge reads them.
struct pad_ranked_candidates {
  const float* score;   // rows x local_k
  const index_t* index;
  index_t local_k, k;
  float* out_score;     // rows x k
  index_t* out_index;
  XSOFTMAX_HD void operator()(index_t i) const {
    const index_t r = i / k, e = i % k;
    out_score[i] = e < local_k ? score[r * local_k + e] : -INFINITY;
    out_index[i] = e < local_k ? index[r * local_k + e] : -1;
  }
};

/// Merges every rank's sorted top-k of a row (ranks x rows x k, best first, global class ids) into
/// the row's top-k over all classes: the j-th pick is the best candidate ranked after the (j-1)-th
/// by (score desc, class asc), a strict order, so ties resolve as on one rank.
/// Own row i's picks go to output row `own_sample[i]` (i when null: every row of the batch is own).
struct merge_ranked_topk {
  const float* score;
  const index_t* index;
  const float* lse;
  index_t ranks, rows, k, own_offset;
  matrix_view<index_t> classes;
  matrix_view<float> log_probs;
  const index_t* own_sample = nullptr;
  XSOFTMAX_HD void operator()(index_t own) const {
    const index_t r = own_offset + own, i = own_sample ? own_sample[own] : own;
    float last_s = INFINITY;
    index_t last_c = -1;
    for (index_t j = 0; j < k; ++j) {
      float best_s = -INFINITY;
      index_t best_c = -1;
      for (index_t q = 0; q < ranks; ++q) {
        const index_t base = (q * rows + r) * k;
        for (index_t e = 0; e < k; ++e) {
          const float s = score[base + e];
          const index_t c = index[base + e];
          if (c < 0) continue;  // an unfilled slot (a rank with fewer than k classes)
          const bool after_last = s < last_s || (s == last_s && c > last_c);
          const bool better = best_c < 0 || s > best_s || (s == best_s && c < best_c);
          if (after_last && better) best_s = s, best_c = c;
        }
      }
      classes(i, j) = best_c;
      log_probs(i, j) = best_s - lse[r];
      last_s = best_s, last_c = best_c;
    }
  }
};
}  // namespace detail

template <class P, class B, class S>
full_softmax<P, B, S>::full_softmax(S sharding, index_t dim, bool with_bias, init_options init,
                                    backend_resources<B> resources)
    : weights_base("full_softmax", std::move(sharding), dim, with_bias, init, resources) {
  static_assert(sharded, "full_softmax: only a class-sharded head is constructed from a sharding");
}

template <class P, class B, class S>
full_softmax<P, B, S>::full_softmax(S sharding, matrix_view<storage_type> local_weights, storage_type* local_bias,
                                    backend_resources<B> resources)
    : weights_base("full_softmax", std::move(sharding), local_weights, local_bias, resources) {
  static_assert(sharded, "full_softmax: only a class-sharded head is constructed from a sharding");
}

// Gather the rows, one dense softmax over the local block with the row statistics combined between
// its passes, return each row's hidden gradient to its owner, reduce the owner's losses.
template <class P, class B, class S>
template <class H>
void full_softmax<P, B, S>::run_sharded_into_(const char* where, matrix_view<const H> hidden,
                                              vector_view<const index_t> targets, loss_options options,
                                              vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                              gradient_type* grad_weights, vector_view<const float> grad_output,
                                              float* loss, const topk_outputs* topk) const {
  const detail::execution<B> ex{resources_};  // inputs were checked by head_verbs
  detail::sharded_batch<B> b =
      detail::gather_batch(ex, where, sharding_, hidden, targets, options, grad_weights != nullptr, grad_output);
  run_gathered_(b.rows, b.own, options, per_sample, grad_hidden, grad_weights, loss, topk);
}

// The rows gathered: one dense softmax over the local block with the row statistics combined
// between its passes, each row's hidden gradient returned to its owner, the owner's losses reduced.
template <class P, class B, class S>
void full_softmax<P, B, S>::run_gathered_(detail::sharded_rows<B>& rows, const detail::batch_rows<B>& own_rows_map,
                                          loss_options options, vector_view<float> per_sample,
                                          matrix_view<float>* grad_hidden, gradient_type* grad_weights,
                                          float* loss, const topk_outputs* topk) const {
  const detail::execution<B> ex{resources_};
  const index_t d = dim(), n_local = local_classes();
  const index_t total = rows.all.rows;
  const detail::scratch_vector<B, index_t> columns = detail::block_columns(ex, rows.all.target, class_begin());
  const storage_type* bias = store_.bias();
  detail::scratch_vector<B, float> losses(static_cast<std::size_t>(total), ex, 0.f);
  detail::scratch_vector<B, float> grad_all(grad_weights ? static_cast<std::size_t>(total * d) : 0, ex, 0.f);

  detail::dense_softmax_args a;
  a.h = rows.all.hidden_view();
  a.target = detail::raw(columns);
  a.n = n_local;
  a.chunk = chunk_size_for(total);
  a.score_cache_bytes = score_cache_bytes_;  // the kept scores are this rank's columns: combine_rows needs none
  a.loss = detail::raw(losses);
  a.label_smoothing = options.label_smoothing;
  a.z_loss = options.z_loss;
  // An angular margin needs nothing more under sharding: every rank normalises the same gathered
  // rows and its own weight rows; the target logit (with its margin) lives on its owner only, and
  // the normalisation's Jacobian is linear, so the ranks' partial hidden gradients still sum.
  a.margin = options.margin;
  a.softcap = options.softcap;
  a.gradient_filter = options.gradient_filter;
  a.combine_rows = [&](const detail::dense_row_statistics& st) {
    detail::combine_row_statistics(ex, sharding_.communicator(), st);
  };
  if (grad_weights) {
    gradient_type& g = *grad_weights;
    g.dim = d;
    const index_t touched = total > 0 ? n_local : 0;  // every local class, unless no rank has a row
    g.rows.resize(static_cast<std::size_t>(touched));
    thrust::sequence(ex.policy(), g.rows.begin(), g.rows.end());
    g.values.resize(static_cast<std::size_t>(touched * d));
    g.bias_values.resize(bias && touched ? static_cast<std::size_t>(touched) : 0);
    a.upstream = detail::raw(rows.upstream);
    a.grad_h = detail::raw(grad_all);
    a.grad_w = detail::raw(g.values);
    a.grad_b = g.bias_values.empty() ? nullptr : detail::raw(g.bias_values);
  }
  // forward_topk: this rank's top-k of its own classes kept from the loss's score chunks, the row
  // statistics combined by the loss (combine_rows above), then the candidates merged as in topk.
  std::optional<detail::basic_row_topk_state<B>> best;
  detail::scratch_vector<B, float> row_lse(topk ? static_cast<std::size_t>(total) : 0, ex);
  if (topk) {
    best.emplace(total, std::min(topk->k, n_local), ex);
    a.row_lse = detail::raw(row_lse);
    a.observe_scores = [&](index_t c0, index_t cn, const float* s) {
      detail::row_topk_update(ex, s, total, cn, cn, class_begin() + c0, *best);
    };
  }
  detail::dense_softmax(ex, matrix_view<const storage_type>(weights()), bias, a);
  const index_t batch_rows = topk ? topk->classes.rows : 0;  // the caller's rows, ignored ones too
  if (topk && own_rows_map.rows < batch_rows)  // the ignored rows' -1 / -inf
    detail::parallel_for(ex, batch_rows * topk->k, detail::clear_topk{topk->k, topk->classes, topk->log_probs});
  if (topk)
    merge_topk_candidates_(rows, own_rows_map.rows, *best, detail::raw(row_lse), topk->k, topk->classes,
                           topk->log_probs, own_rows_map.sample_data());
  detail::finish_batch(ex, sharding_, rows, own_rows_map, grad_all, losses, options.reduce, per_sample, grad_hidden,
                       loss);
}

// Each rank keeps the top-k of its classes and the row statistics; the statistics are combined and
// the candidates all-gathered and merged.
template <class P, class B, class S>
template <class H>
void full_softmax<P, B, S>::topk_sharded_into_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                                               matrix_view<float> log_probs) const {
  const detail::execution<B> ex{resources_};  // inputs were checked by head_verbs
  detail::sharded_rows<B> rows = detail::gather_rows(ex, sharding_, detail::pack_rows(ex, hidden, {}, 0), nullptr);
  topk_gathered_(rows, hidden.rows, k, classes, log_probs);
}

template <class P, class B, class S>
void full_softmax<P, B, S>::topk_gathered_(detail::sharded_rows<B>& rows, index_t own_rows, index_t k,
                                           matrix_view<index_t> classes, matrix_view<float> log_probs) const {
  const detail::execution<B> ex{resources_};
  const index_t total = rows.all.rows, local_k = std::min(k, local_classes());
  detail::basic_online_lse_state<B> lse(total, ex);
  detail::basic_row_topk_state<B> best(total, local_k, ex);
  detail::for_each_score_chunk(ex, rows.all.hidden_view(), matrix_view<const storage_type>(weights()), store_.bias(),
                               0, local_classes(), chunk_size_for(total), [&](index_t c0, index_t cn, const float* s) {
                                 detail::online_lse_update(ex, s, total, cn, cn, c0, nullptr, lse);
                                 detail::row_topk_update(ex, s, total, cn, cn, class_begin() + c0, best);
                               });
  detail::combine_row_statistics(
      ex, sharding_.communicator(),
      detail::dense_row_statistics{detail::raw(lse.max), detail::raw(lse.sum), detail::raw(lse.target_logit), nullptr,
                                   nullptr, total});
  detail::scratch_buffer<B, float> row_lse(static_cast<std::size_t>(total), ex);
  detail::online_lse_finish(ex, lse, total, detail::raw(row_lse));
  merge_topk_candidates_(rows, own_rows, best, row_lse.data(), k, classes, log_probs, nullptr);
}

// Every rank's top-k candidates of every gathered row (`best`, not yet finished: sorted here),
// all-gathered and merged into this rank's own rows' top-k over all classes against the rows'
// (combined) log-sum-exp; own row i goes to output row own_sample[i] (i when null).
template <class P, class B, class S>
void full_softmax<P, B, S>::merge_topk_candidates_(const detail::sharded_rows<B>& rows, index_t own_rows,
                                                   detail::basic_row_topk_state<B>& best, const float* row_lse,
                                                   index_t k, matrix_view<index_t> classes,
                                                   matrix_view<float> log_probs, const index_t* own_sample) const {
  const detail::execution<B> ex{resources_};
  const index_t total = rows.all.rows, local_k = best.k;
  detail::row_topk_finish(ex, total, best);
  // Every rank's candidates, k per row (slots past local_k unfilled: class -1), packed where they
  // live (was a round trip through the host).
  const index_t ranks = sharding_.size(), per_rank = total * k;
  const std::vector<index_t> counts(static_cast<std::size_t>(ranks), per_rank);
  detail::scratch_buffer<B, float> send_s(static_cast<std::size_t>(per_rank), ex),
      cand_s(static_cast<std::size_t>(ranks * per_rank), ex);
  detail::scratch_buffer<B, index_t> send_c(send_s.size(), ex), cand_c(cand_s.size(), ex);
  detail::parallel_for(ex, per_rank,
                       detail::pad_ranked_candidates{detail::raw(best.score), detail::raw(best.index), local_k, k,
                                                     send_s.data(), send_c.data()});
  detail::all_gather_into(ex, sharding_.communicator(), detail::raw(send_s), per_rank, cand_s, counts.data());
  detail::all_gather_into(ex, sharding_.communicator(), detail::raw(send_c), per_rank, cand_c, counts.data());
  detail::parallel_for(ex, own_rows,
                       detail::merge_ranked_topk{detail::raw(cand_s), detail::raw(cand_c), row_lse, ranks, total, k,
                                                 rows.own_offset, classes, log_probs, own_sample});
}

}  // namespace xsoftmax
