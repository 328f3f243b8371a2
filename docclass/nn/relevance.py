"""Propagation rules: how a backward pass carries a logit back to the words.

Plain autograd gives the gradient; gradient × input at the word vectors is then a first-order
estimate that LayerNorms and softmaxes break (a LayerNorm does not change when its centred
input is scaled, so the gradient there is orthogonal to the input, and gradient · input is
close to zero by construction). Layer-wise relevance propagation (LRP) instead changes what the
backward pass does at those operations, while the forward values stay exactly the same, so
that gradient × input at the input becomes a *relevance* that is carried back whole:

``"gradient"``
    Gradient × input as it is defined for ReLU networks, where it equals LRP-0 (Ancona et al.
    2018): every LayerNorm's ``1/σ`` and every GELU gate ``Φ(x)`` held constant (for ReLU the
    gate's gradient is zero anyway), the attention softmax differentiated as it is. Through a
    LayerNorm the plain gradient is orthogonal to the centred input, and through GELU it adds
    ``x·φ(x)`` terms no ReLU network has; with them, on the BBC MiniLM model, gradient × input
    beat random ranking on 30 % of documents (taken where the word enters the first block),
    80 % with the LayerNorms held and 92.5 % with the GELU gates too (40 documents, masking;
    93 % of 60, docs/faithfulness.md).
    What separates it from ``"cp"`` is the attention: here relevance also flows through the
    probabilities to the queries and keys.
``"cp"``
    Conservative propagation (Ali et al. 2022, "XAI for Transformers: Better Explanations
    through Conservative Propagation"): every LayerNorm's ``1/σ`` and every attention
    probability (the blocks' and the pool's) held constant, and GELU by the identity rule
    (``x·Φ(x)`` with ``Φ(x)`` held constant; Achtibat et al. 2024). The network is then affine
    in its sources (word vectors, position vectors, biases, LayerNorm offsets), so their
    relevance adds up to the logit exactly; the records give each token its word's and its
    position's, and what no word causes is the biases' and offsets'.
``"cp-gamma"``
    ``"cp"`` with LRP-γ (Montavon et al. 2019) at every linear layer of the blocks: each
    output's relevance is split among its inputs by ``z_ij + γ·z_ij⁺`` (for an output below
    zero, ``z_ij + γ·z_ij⁻``), with ``z_ij = x_i·w_ij``, so contributions that agree with the
    output's sign weigh a little more; each bias keeps its own share (it is not boosted by γ).
    Still conservative: the words' relevance plus what no word causes (the biases' shares
    among it) equals the logit. With :data:`GAMMA` = 0.01 its comprehensiveness was 0.008 to
    0.009 higher than ``"cp"``'s on 80 BBC validation articles under masking, through the
    fully fine-tuned MiniLM (0.466 against 0.459) and the demo model (0.442 against 0.433); on
    the fully fine-tuned one γ = 0.002 to 0.02 all did better than 0, and larger ones worse
    (docs/faithfulness.md). The records' conservative method is this rule, started from the
    predicted class's lead over its rivals (:data:`docclass.interpret.methods.EXPLAINED`).
``"attnlrp"``
    AttnLRP (Achtibat et al. 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation
    for Transformers"), as its reference library ``lxt`` implements it for BERT: LayerNorm and
    GELU as above; relevance also flows through the softmax (its gradient × input rule), and
    each product of two inputs (query·key, probabilities·values) gives each factor half (the
    uniform rule). Nearly conservative: the softmax rule leaves a little relevance in biases.

One forward pass can serve ``"gradient"`` and ``"cp-gamma"`` alike: their forward values are the
same, and their backward passes differ only in whether the attention probabilities pass
relevance on and in how the blocks' linear layers split it. An :class:`AttentionValve` given as
the propagation builds ``"gradient"``'s graph with a valve on every block's queries and keys,
on the pool's probabilities and at every linear layer of the blocks; closed during a backward
pass, that pass is ``"cp-gamma"``'s.

The rules hold whichever input the product is read at. The records read conservative
propagation at what each token brings to the first block, after the embedding norm
(``entry_scale`` in :meth:`docclass.nn.model.DocumentClassifier.forward`: its word and position
vectors, which masking it removes), and gradient × input at the word vector
(:class:`docclass.interpret.methods.ReadPoints`).

Torch only; :mod:`docclass.nn.model` calls these where a rule applies.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

PROPAGATIONS = ("gradient", "cp", "cp-gamma", "attnlrp")
# The rules that hold every attention probability constant (relevance reaches only the values).
CONSERVATIVE = ("cp", "cp-gamma")
# LRP-γ's γ at the blocks' linear layers under ``"cp-gamma"``, chosen on BBC's validation split
# (module docstring).
GAMMA = 0.01
# Added to a γ-rule denominator, with its sign, so an output near zero cannot divide by zero.
STABILISER = 1e-6


class _MapGradient(torch.autograd.Function):
    """Identity forward; backward, the gradient passed through ``mapping`` (called then)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mapping: Callable) -> torch.Tensor:  # noqa: D102
        ctx.mapping = mapping
        return x.view_as(x)

    @staticmethod
    def backward(ctx, gradient: torch.Tensor):  # noqa: D102
        return ctx.mapping(gradient), None


class AttentionValve:
    """A propagation for two backward passes through one forward: ``"gradient"``'s rule while
    :attr:`open`, ``"cp-gamma"``'s when closed (the attention probabilities then take no
    relevance, and the blocks' linear layers split it by LRP-γ).
    Read when each backward pass runs, so set it before calling ``torch.autograd.grad``."""

    def __init__(self) -> None:
        self.open = True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _MapGradient.apply(x, self._through)

    def _through(self, gradient: torch.Tensor) -> torch.Tensor:
        return gradient if self.open else torch.zeros_like(gradient)


# What the model's ``propagation`` argument takes: None (plain gradients), a rule's name, or a
# valve.
Propagation = str | AttentionValve | None


class _GammaLinear(torch.autograd.Function):
    """``F.linear(x, weight, bias)``; backward, LRP-γ in gradient form (plain while ``valve``,
    if one is given, is open).

    Relevance reaches an output as ``g·y``; LRP-γ gives input ``i`` the share ``Σ_j (z_ij +
    γ·z_ij^±) · g_j·y_j / ẑ_j`` with ``ẑ_j = y_j + γ·Σ_i z_ij^±`` (``±`` the output's sign), so
    the gradient handed on is ``s·W + γ·(sign-matched parts of s·W)`` with ``s = g·y / ẑ``, and
    the bias's gradient is ``s`` (its share ``s·b``). The weight gets no gradient:
    :func:`linear` hands it over detached (relevance goes to the inputs, not the parameters)."""

    @staticmethod
    def forward(ctx, x, weight, bias, valve):  # noqa: D102
        y = F.linear(x, weight, bias)
        ctx.save_for_backward(x, weight, bias, y)
        ctx.valve = valve
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable  # in-place work on fresh tensors
    def backward(ctx, gradient):  # noqa: D102
        x, weight, bias, y = ctx.saved_tensors
        wants_x, _, wants_bias, _ = ctx.needs_input_grad  # the weight comes detached
        if ctx.valve is not None and ctx.valve.open:
            bias_gradient = gradient.flatten(0, -2).sum(0) if wants_bias else None
            return gradient @ weight, None, bias_gradient, None
        # Every sign-matched sum comes from one product with |W| beside the plain one, since
        # z⁺ = (z + |z|)/2 and z⁻ = (z − |z|)/2 for z_ij = x_i·w_ij: the output's favoured
        # part Σ_i z_ij^± is (x·W ± |x|·|W|)/2, ± the output's sign. Three matrix products
        # where writing the positive and negative weights out took the work of five: the
        # backward pass is about twice as fast at MiniLM's layer sizes, the same in float32
        # and float64 to rounding.
        absolute = weight.abs()
        favoured = F.linear(x.abs(), absolute).copysign_(y).add_(y)
        if bias is not None:
            favoured = favoured.sub_(bias)  # 2·Σ_i z_ij^± (the bias is not boosted)
        denominator = favoured.mul_(0.5 * GAMMA).add_(y)  # ẑ
        stabiliser = torch.where(denominator >= 0, STABILISER, -STABILISER)
        denominator = denominator.add_(stabiliser.to(denominator.dtype))
        # y/ẑ before the gradient: a ẑ as small as the stabiliser would overflow g/ẑ in
        # float16, and inf·0 is NaN where y is 0.
        share = gradient * (y / denominator)  # s = g·y / ẑ
        plain = share @ weight
        # Input i's sign-matched part of s·W, for x_i of either sign, is
        # (s·W + sign(x_i)·(s·sign(y))·|W|)/2, where s·sign(y) = g·|y| / ẑ.
        signed = (gradient * (y.abs() / denominator)) @ absolute
        direction = torch.sign(x)  # 0 for an input at zero, which takes no γ share
        # plain + γ·(sign-matched part), the γ part summed on its own: 1 + γ/2 formed first
        # would round to 1.0078 in bfloat16 and scale every gradient.
        boost = direction.abs().mul_(plain).addcmul_(direction, signed)
        x_gradient = plain.add_(boost, alpha=0.5 * GAMMA)
        bias_gradient = share.flatten(0, -2).sum(0) if wants_bias else None
        return x_gradient if wants_x else None, None, bias_gradient, None


def linear(x: torch.Tensor, layer: nn.Linear, propagation: Propagation) -> torch.Tensor:
    """A block's linear layer under ``propagation``: LRP-γ's backward under ``"cp-gamma"`` and
    a closed valve, plain otherwise (the same values forward)."""
    if propagation == "cp-gamma" or isinstance(propagation, AttentionValve):
        valve = propagation if isinstance(propagation, AttentionValve) else None
        # Relevance is carried to the inputs (and the biases' shares), never to the weights:
        # detached, they spare every backward pass a weight gradient no caller reads.
        return _GammaLinear.apply(x, layer.weight.detach(), layer.bias, valve)
    return layer(x)


def fixed_scale_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """``norm(x)`` with ``1/σ`` held constant in the backward pass (the same value forward)."""
    centred = x - x.mean(dim=-1, keepdim=True)
    scale = torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + norm.eps).detach()
    return centred * scale * norm.weight + norm.bias


def identity_gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact GELU, ``x·Φ(x)``, with ``Φ(x)`` held constant: the identity rule for an
    element-wise activation (relevance passes through it unchanged)."""
    gate = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
    return x * gate.detach()


def divide_gradient(x: torch.Tensor, factor: float) -> torch.Tensor:
    """``x`` unchanged; its gradient divided by ``factor`` (the uniform rule's split)."""
    return _MapGradient.apply(x, lambda gradient: gradient / factor)


def norm(x: torch.Tensor, layer: nn.Module, propagation: Propagation) -> torch.Tensor:
    """A block's LayerNorm (or Identity) under ``propagation``: ``1/σ`` constant under every
    rule, plain without one."""
    if propagation is not None and isinstance(layer, nn.LayerNorm):
        return fixed_scale_norm(x, layer)
    return layer(x)


def feed_forward(x: torch.Tensor, ffn: nn.Sequential, propagation: Propagation) -> torch.Tensor:
    """The block's ``Linear → GELU → Linear``, with the identity rule at the GELU under every
    rule (and LRP-γ at the linear layers under ``"cp-gamma"``)."""
    if propagation is not None:
        hidden = identity_gelu(linear(x, ffn[0], propagation))
        return linear(hidden, ffn[2], propagation)
    return ffn(x)


def attention_inputs(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, propagation: Propagation
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys and values of an attention under ``propagation``: ``cp`` and ``cp-gamma``
    stop relevance at the probabilities (queries and keys detached); ``attnlrp`` gives query
    and key a quarter each and the values half (the uniform rule at both products, with the
    output halved by :func:`attention_output`)."""
    if propagation in CONSERVATIVE:
        return queries.detach(), keys.detach(), values
    if isinstance(propagation, AttentionValve):
        return propagation(queries), propagation(keys), values
    if propagation == "attnlrp":
        return divide_gradient(queries, 2.0), divide_gradient(keys, 2.0), values
    return queries, keys, values


def attention_output(attended: torch.Tensor, propagation: Propagation) -> torch.Tensor:
    """The product probabilities·values under ``propagation`` (AttnLRP halves its relevance)."""
    return divide_gradient(attended, 2.0) if propagation == "attnlrp" else attended


def pool_weights(weights: torch.Tensor, propagation: Propagation) -> torch.Tensor:
    """The pool's probabilities under ``propagation``: constant for ``cp`` and ``cp-gamma``.
    (Under ``attnlrp`` they take relevance like any softmax; the pool's query is a weight, not
    an input, so its score is linear in the keys and needs no split; the product with the
    values is split by :func:`attention_output`.)"""
    if isinstance(propagation, AttentionValve):
        return propagation(weights)
    return weights.detach() if propagation in CONSERVATIVE else weights


def check_propagation(propagation: Propagation) -> None:
    """Refuse an unknown propagation name."""
    if isinstance(propagation, AttentionValve):
        return
    if propagation is not None and propagation not in PROPAGATIONS:
        raise ValueError(f"propagation must be one of {PROPAGATIONS} or None, got {propagation!r}")
