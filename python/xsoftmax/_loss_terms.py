# SPDX-License-Identifier: Apache-2.0
"""The loss terms every exact and selective module takes (the C++ ``loss_options``): label smoothing
and z-loss as ``F.cross_entropy`` and PaLM name them, the additive margins of face recognition
(ArcFace, CosFace) on L2-normalised rows and weights, and logit soft-capping as Gemma 2, Cut
Cross-Entropy and Liger name it (``softcap``); the full softmax's gradient filtering (Cut
Cross-Entropy's ``filter_eps``, per entry: ``gradient_filter``); and the per-class weights every
module takes (``class_weight``, ``F.cross_entropy``'s ``weight``). One check for every module."""
import math

MARGINS = {None: 0, "arcface": 1, "cosface": 2}
DEFAULT_M = {"arcface": 0.5, "cosface": 0.35}


def check_loss_terms(label_smoothing, z_loss, margin, margin_scale, margin_m, bias, softcap=0.0,
                     gradient_filter=0.0):
    """The terms as ``_C.set_loss_terms`` takes them after the head handle: (label_smoothing, z_loss,
    margin code, scale, m, softcap, gradient_filter). Raises ValueError naming the argument and value."""
    ls, z = float(label_smoothing), float(z_loss)
    if not 0.0 <= ls <= 1.0:
        raise ValueError(f"label_smoothing = {label_smoothing} must be in [0, 1]")
    if not (z >= 0.0 and math.isfinite(z)):
        raise ValueError(f"z_loss = {z_loss} must be finite and >= 0")
    if margin not in MARGINS:
        raise ValueError(f"margin = {margin!r} must be None, 'arcface' or 'cosface'")
    if margin is not None and bias:
        raise ValueError(f"margin = {margin!r} needs bias=False (logits are scaled cosines)")
    s = float(margin_scale)
    m = float(margin_m if margin_m is not None else DEFAULT_M.get(margin, 0.0))
    if margin is not None and not (s > 0.0 and math.isfinite(s)):
        raise ValueError(f"margin_scale = {margin_scale} must be finite and > 0")
    if margin == "arcface" and not 0.0 <= m < math.pi / 2:
        raise ValueError(f"margin_m = {margin_m} must be in [0, pi/2) for 'arcface' (radians)")
    if margin == "cosface" and not m >= 0.0:
        raise ValueError(f"margin_m = {margin_m} must be >= 0 for 'cosface'")
    c = float(softcap)
    if not (c >= 0.0 and math.isfinite(c)):
        raise ValueError(f"softcap = {softcap} must be finite and >= 0 (0: no soft-capping)")
    if c > 0.0 and margin is not None:
        raise ValueError(f"softcap = {softcap} with margin = {margin!r}: the margin's logits are bounded by "
                         f"margin_scale already; use one of them")
    f = float(gradient_filter)
    if not 0.0 <= f < 1.0:
        raise ValueError(f"gradient_filter = {gradient_filter} must be in [0, 1) (0: the exact gradient)")
    return ls, z, MARGINS[margin], s, m, c, f


def any_terms(terms):
    """Whether the checked terms change the loss or its gradient (else a module needs no handle for
    them)."""
    return terms[0] != 0.0 or terms[1] != 0.0 or terms[2] != 0 or terms[5] != 0.0 or terms[6] != 0.0


def check_class_weight(class_weight, num_classes):
    """``class_weight`` as a module keeps it: None, or a float32 tensor of ``num_classes`` finite
    values >= 0 (any float or integer tensor or sequence is converted). Raises ValueError."""
    import torch

    if class_weight is None:
        return None
    w = torch.as_tensor(class_weight).detach()
    if w.is_complex() or w.dtype == torch.bool:
        raise ValueError(f"class_weight.dtype = {w.dtype} must be a real number type")
    w = w.to(torch.float32).reshape(-1) if w.dim() <= 1 else w
    if w.dim() != 1 or w.numel() != num_classes:
        raise ValueError(f"class_weight has shape {tuple(w.shape)}; expected ({num_classes},), one weight per class")
    if w.device.type != "meta" and not bool(((w >= 0) & torch.isfinite(w)).all()):
        raise ValueError("class_weight must be finite and >= 0")
    return w
