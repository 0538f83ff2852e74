# SPDX-License-Identifier: Apache-2.0
"""The loss terms every exact and selective module takes (the C++ ``loss_options``): label smoothing
and z-loss as ``F.cross_entropy`` and PaLM name them, and the additive margins of face recognition
(ArcFace, CosFace) on L2-normalised rows and weights. One check for every module."""
import math

MARGINS = {None: 0, "arcface": 1, "cosface": 2}
DEFAULT_M = {"arcface": 0.5, "cosface": 0.35}


def check_loss_terms(label_smoothing, z_loss, margin, margin_scale, margin_m, bias):
    """The terms as ``_C.set_loss_terms`` takes them after the head handle: (label_smoothing, z_loss,
    margin code, scale, m). Raises ValueError naming the argument and value."""
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
    return ls, z, MARGINS[margin], s, m


def any_terms(terms):
    """Whether the checked terms change the loss (else a module needs no handle for them)."""
    return terms[0] != 0.0 or terms[1] != 0.0 or terms[2] != 0
