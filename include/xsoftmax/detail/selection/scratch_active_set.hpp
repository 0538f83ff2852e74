// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `scratch_active_set`: an active set as working memory of one call -- `basic_active_set`'s
/// fields, names and meanings in scratch vectors (never value-initialised; on a GPU from the
/// resources' caching allocator on their stream). A training step's active set lives one call, so
/// a `basic_active_set` of backend vectors cost a step an allocation, a fill and a free per vector
/// (on a GPU: cudaMalloc, a fill on the default stream and a device-synchronising cudaFree).
///
/// A head hands it to a selector that declares `static constexpr bool fills_scratch_sets = true;`:
/// its `select` is generic in the set type and uses on the set's vectors only `resize`, `size`,
/// `empty`, `begin`, `end` and `data` (and `reset` on the set). Other selectors get an
/// `active_set_for<Backend>` as before (`selection_set_for`).

#include <xsoftmax/detail/primitives/scratch_buffer.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <type_traits>

namespace xsoftmax::detail {

template <class B>
struct scratch_active_set {
  active_layout layout = active_layout::shared;
  // shared layout
  scratch_vector<B, index_t> classes;
  scratch_vector<B, float> negative_offset, target_offset;
  // per_sample layout
  scratch_vector<B, index_t> offsets, ids;
  scratch_vector<B, float> id_offset;

  /// Unbound vectors: each is sized with `resize(n, ex)`.
  scratch_active_set() = default;
  /// Every vector bound to `ex`, so that a selector sizes them with `resize(n)`.
  explicit scratch_active_set(const execution<B>& ex)
      : classes(0, ex), negative_offset(0, ex), target_offset(0, ex), offsets(0, ex), ids(0, ex), id_offset(0, ex) {}

  /// Empties every vector (keeping its memory) and sets the layout.
  void reset(active_layout l) {
    layout = l;
    classes.resize(0), negative_offset.resize(0), target_offset.resize(0);
    offsets.resize(0), ids.resize(0), id_offset.resize(0);
  }
  /// As `basic_active_set::entries`.
  [[nodiscard]] index_t entries() const {
    return static_cast<index_t>(layout == active_layout::shared ? classes.size() : ids.size());
  }
};

/// Whether `Selector::fills_scratch_sets` is true (false when absent).
template <class Selector, class = void>
inline constexpr bool selector_fills_scratch_sets = false;
template <class Selector>
inline constexpr bool selector_fills_scratch_sets<Selector, std::void_t<decltype(Selector::fills_scratch_sets)>> =
    Selector::fills_scratch_sets;

/// Whether `Selector::sets_valid_by_construction` is true (false when absent): its sets meet the
/// active-set contract by construction (classes in range, ascending where shared, offsets from 0 to
/// the entries, every row's target present), so a training step finds the targets' positions
/// without checking the set (`locate_targets`' `check`). `selective_softmax::select` checks always.
template <class Selector, class = void>
inline constexpr bool selector_sets_valid = false;
template <class Selector>
inline constexpr bool selector_sets_valid<Selector, std::void_t<decltype(Selector::sets_valid_by_construction)>> =
    Selector::sets_valid_by_construction;

/// The set a head's training step hands `Selector` on backend B.
template <class Selector, class B>
using selection_set_for =
    std::conditional_t<selector_fills_scratch_sets<Selector>, scratch_active_set<B>, active_set_for<B>>;

/// An empty `selection_set_for<Selector, B>` for a call on `ex`.
template <class Selector, class B>
selection_set_for<Selector, B> make_selection_set(const execution<B>& ex) {
  if constexpr (selector_fills_scratch_sets<Selector>) return scratch_active_set<B>(ex);
  else return active_set_for<B>{};
}

}  // namespace xsoftmax::detail
