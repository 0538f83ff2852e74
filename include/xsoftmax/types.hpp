// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Plain parameter types shared by every head: non-owning views, loss options, the sparse weight
/// gradient. Host code can use all of them.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/config.hpp>

#include <cstddef>

namespace xsoftmax {

/// Non-owning row-major matrix view: `rows` x `cols`, row `i` starts at `data + i * stride`.
/// The memory belongs to the backend the view is passed to (host memory for serial/omp).
template <class T>
struct matrix_view {
  T* data = nullptr;
  index_t rows = 0;
  index_t cols = 0;
  index_t stride = 0;  ///< elements between row starts; >= cols

  constexpr matrix_view() = default;
  XSOFTMAX_HD constexpr matrix_view(T* d, index_t r, index_t c) : data(d), rows(r), cols(c), stride(c) {}
  XSOFTMAX_HD constexpr matrix_view(T* d, index_t r, index_t c, index_t s)
      : data(d), rows(r), cols(c), stride(s) {}
  /// Views of non-const elements convert to views of const elements.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T>>>
  XSOFTMAX_HD constexpr matrix_view(matrix_view<U> other)
      : data(other.data), rows(other.rows), cols(other.cols), stride(other.stride) {}

  XSOFTMAX_HD T* row(index_t i) const { return data + i * stride; }
  XSOFTMAX_HD T& operator()(index_t i, index_t j) const { return data[i * stride + j]; }
  [[nodiscard]] XSOFTMAX_HD index_t size() const { return rows * cols; }
};

/// Non-owning contiguous view of `size` elements.
template <class T>
struct vector_view {
  T* data = nullptr;
  index_t size = 0;

  constexpr vector_view() = default;
  XSOFTMAX_HD constexpr vector_view(T* d, index_t n) : data(d), size(n) {}
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T>>>
  XSOFTMAX_HD constexpr vector_view(vector_view<U> other) : data(other.data), size(other.size) {}

  XSOFTMAX_HD T& operator[](index_t i) const { return data[i]; }
  [[nodiscard]] XSOFTMAX_HD bool empty() const { return size == 0; }
};

/// How per-sample losses are combined.
enum class reduction {
  none,  ///< no reduction: per-sample losses are written out; the returned value is their sum
  mean,  ///< mean over samples whose target is not `ignore_index`
  sum,   ///< sum over samples whose target is not `ignore_index`
};

/// The additive margin a softmax head's loss can be trained with (see `margin_options`).
enum class margin_kind {
  none,     ///< plain logits <h, w_j> + b_j
  arcface,  ///< additive angular margin (ArcFace, Deng et al. 2019): target logit s cos(theta_t + m)
  cosface,  ///< additive cosine margin (CosFace / AM-softmax, Wang et al. 2018): target logit s (cos theta_t - m)
};

/// An additive margin on normalised weights and features. With a margin, every logit is
/// s cos theta_j, cos theta_j = <h / |h|, w_j / |w_j|>, and the target's logit becomes
///  * ArcFace: s phi(cos theta_t), with InsightFace's "easy_margin = false" form
///    phi = cos theta cos m - sin theta sin m  when cos theta > th = cos(pi - m),
///    phi = cos theta - mm, mm = sin(pi - m) m  otherwise (keeps phi decreasing in theta past pi - m);
///    sin theta = sqrt(max(0, 1 - cos^2 theta)), and its slope dphi/dcos takes sin theta >= 1e-6;
///  * CosFace: s (cos theta_t - m).
/// Gradients flow through both normalisations (d(x / |x|)/dx = (I - x^ x^T) / |x|). A norm below
/// 1e-12 is taken as 1e-12, as `torch.nn.functional.normalize` does (a zero row has cosine 0 with
/// everything; its gradient is the unprojected one divided by 1e-12, so do not train a margin head
/// from zero-initialised rows). The bias is not part of a margin logit: a head with a bias rejects
/// a margin with `invalid_argument`. Label smoothing, z-loss and the selective heads' logit offsets
/// (sampling corrections, masks) all apply to the margin logits.
///
/// The prediction verbs (`log_prob`, `topk`, `log_distribution`) take no options and stay
/// margin-free: they score the plain logits <h, w_j>. For the cosine ranking ArcFace / CosFace use
/// at test time, normalise the weight rows once after training: `topk` then ranks by cos theta_j.
struct margin_options {
  margin_kind kind = margin_kind::none;
  /// s > 0 (finite): the logit scale. 64 is the ArcFace and CosFace papers' value for face
  /// recognition; smaller values (16..32) suit fewer classes.
  float scale = 64.f;
  /// m: the margin, in radians for ArcFace (in [0, pi / 2); the paper uses 0.5), in cosine units for
  /// CosFace (>= 0; the paper uses 0.35).
  float m = 0.5f;

  /// ArcFace with the paper's defaults s = 64, m = 0.5.
  [[nodiscard]] static constexpr margin_options arcface(float s = 64.f, float margin = 0.5f) {
    return {margin_kind::arcface, s, margin};
  }
  /// CosFace with the paper's defaults s = 64, m = 0.35.
  [[nodiscard]] static constexpr margin_options cosface(float s = 64.f, float margin = 0.35f) {
    return {margin_kind::cosface, s, margin};
  }
  [[nodiscard]] constexpr bool enabled() const { return kind != margin_kind::none; }
};

/// Options of `forward` / `backward`, as in PyTorch's `cross_entropy`.
struct loss_options {
  reduction reduce = reduction::mean;
  index_t ignore_index = -100;  ///< samples with this target contribute no loss and no gradient
  /// epsilon in [0, 1]: the target distribution is (1 - epsilon) one-hot + epsilon uniform over the
  /// classes the row scores (all N for the full softmax, the row's active set for the selective
  /// heads), as `F.cross_entropy(label_smoothing=epsilon)`: loss = lse - (1 - eps) s_t - eps mean(s).
  /// Not defined for `hierarchical_softmax` (it would need every class's probability).
  float label_smoothing = 0.f;
  /// z >= 0: adds z * lse^2 per sample (the z-loss of PaLM / ST-MoE), which keeps the log-partition
  /// function near 0. Not defined for `hierarchical_softmax`.
  float z_loss = 0.f;
  /// An additive angular / cosine margin on normalised weights and features (see
  /// `margin_options`); none by default. Not defined for `hierarchical_softmax`.
  margin_options margin = {};
  /// c > 0: logit soft-capping, every logit z becomes c tanh(z / c) before the softmax (Gemma 2's;
  /// Cut Cross-Entropy's and Liger's `softcap`), also in label smoothing's mean and in the z-loss;
  /// 0 (the default): none. Logit offsets (a sampler's -log q) are added after the cap. Not defined
  /// for `hierarchical_softmax` (no logits over all classes) nor with a margin (whose logits the
  /// scale already bounds).
  float softcap = 0.f;
  /// f in [0, 1): gradient filtering (Cut Cross-Entropy's `filter_eps`, applied per entry). In a
  /// backward, every entry of dloss/dlogit whose magnitude is below f times its row's upstream
  /// gradient (times its class weight) is taken as 0 -- with the plain loss, every class j of row r
  /// with |p_rj - [j = t_r]| < f -- in the hidden, weight and bias gradients alike; the loss is
  /// unchanged. 0 (the default): the exact gradient. Why: in a trained model almost every
  /// probability of a large vocabulary is below a bf16 weight's resolution; a class that no row of
  /// a block keeps is left out of both gradient GEMMs, which then shrink with the kept classes
  /// (on the cuda backend's bf16 / fp16 path; elsewhere the entries are zeroed and the GEMMs keep
  /// their size). Cut Cross-Entropy's default ("auto") is the weights' epsilon / 32: 2^-12 for bf16,
  /// 2^-15 for fp16. The full softmax only (sharded too); the other heads take 0.
  float gradient_filter = 0.f;
  /// Optional per-class weights, `F.cross_entropy(weight=...)`'s and Liger's `ce_weight`:
  /// num_classes values in the backend's memory, finite and >= 0; empty (the default): all 1.
  /// Sample i's loss (z-loss included) and its gradients are multiplied by class_weight[t_i], and
  /// `reduction::mean` divides by the sum of class_weight[t_i] over the samples not ignored
  /// (PyTorch's weighted mean; 0 when that sum is 0, as the unweighted mean of no sample).
  /// With label smoothing, as `F.cross_entropy(weight=w, label_smoothing=eps)`, each class of the
  /// smoothing term carries its own weight instead: loss_i = w_t ((1 - eps) (lse - s_t) + z lse^2)
  /// + eps / n sum_c w_c (lse - s_c) over the n classes the row scores (the mean's divisor stays
  /// the sum of w_t). Every head (the hierarchical softmax too, which has no label smoothing),
  /// except the class-sharded ones.
  vector_view<const float> class_weight = {};
};

/// A gradient of a weight matrix that is non-zero only on some rows: `rows[i]` holds the gradient
/// `values.row(i)` (and `bias_values[i]` when the head has a bias). Rows are unique; their order is
/// the order the head produced them in (block by block), which is deterministic.
/// Buffers are kept between steps: reusing one object avoids reallocation.
template <class Backend, class Accum = float>
struct sparse_gradient {
  backend_vector<Backend, index_t> rows;
  backend_vector<Backend, Accum> values;       ///< rows.size() x dim, row-major
  backend_vector<Backend, Accum> bias_values;  ///< rows.size(), empty when the head has no bias
  index_t dim = 0;

  [[nodiscard]] index_t num_rows() const { return static_cast<index_t>(rows.size()); }
  [[nodiscard]] matrix_view<Accum> values_view() {
    return {thrust::raw_pointer_cast(values.data()), num_rows(), dim};
  }
  [[nodiscard]] matrix_view<const Accum> values_view() const {
    return {thrust::raw_pointer_cast(values.data()), num_rows(), dim};
  }
};

/// A dense weight gradient written into the caller's memory (the full softmax's `forward_backward`
/// and `backward`, every class a row): `weights` is num_classes x dim, contiguous (stride = dim),
/// of float or of the head's storage type (bf16, fp16), in the backend's memory; `bias` holds
/// num_classes floats when the head has a bias, and is empty otherwise. Overwritten, every entry.
/// Why: a framework's gradient is its own tensor in the weights' dtype (PyTorch's `.grad` of a
/// bf16 weight is bf16). Written there directly, a step needs no fp32 N x dim gradient beside it
/// (2.4 GB at 262144 x 2304) and no conversion pass; in the storage type, each element is rounded
/// once per row block (`full_softmax::training_plan`) from its fp32 sum.
template <class T>
struct dense_gradient {
  matrix_view<T> weights;
  vector_view<float> bias = {};
};

/// How a head's weights are initialised when the head owns them.
struct init_options {
  unsigned long long seed = 0;
  /// Uniform in [-scale, scale) from a counter-based generator of (seed, element index): the same
  /// weights on every backend, filled where they live. Negative means 1 / sqrt(dim).
  float scale = -1.f;
  bool zero = false;   ///< all zeros (word2vec initialises inner nodes this way)
};

}  // namespace xsoftmax
