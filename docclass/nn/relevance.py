"""Propagation rules: how a backward pass carries a logit back to the words.

Plain autograd gives the gradient; gradient × input at the word vectors is then a first-order
estimate that LayerNorms and softmaxes break (a LayerNorm does not change when its centred
input is scaled, so the gradient there is orthogonal to the input, and gradient · input is
close to zero by construction). Layer-wise relevance propagation (LRP) instead changes what the
backward pass does at those operations, while the forward values stay exactly the same, so
that gradient × input at the word vectors becomes a *relevance* that is carried back whole:

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
    in the word vectors, so the words' relevance plus what no word causes (biases, positions,
    LayerNorm offsets) equals the logit exactly.
``"attnlrp"``
    AttnLRP (Achtibat et al. 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation
    for Transformers"), as its reference library ``lxt`` implements it for BERT: LayerNorm and
    GELU as above; relevance also flows through the softmax (its gradient × input rule), and
    each product of two inputs (query·key, probabilities·values) gives each factor half (the
    uniform rule). Nearly conservative: the softmax rule leaves a little relevance in biases.

One forward pass can serve ``"gradient"`` and ``"cp"`` alike: their forward graphs differ only
in whether the attention probabilities pass relevance on. An :class:`AttentionValve` given as
the propagation builds ``"gradient"``'s graph with a valve on every block's queries and keys
and on the pool's probabilities; closed during a backward pass, that pass is ``"cp"``'s.

Torch only; :mod:`docclass.nn.model` calls these where a rule applies.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

PROPAGATIONS = ("gradient", "cp", "attnlrp")


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
    :attr:`open`, ``"cp"``'s when closed (the attention probabilities then take no relevance).
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
    rule."""
    if propagation is not None:
        return ffn[2](identity_gelu(ffn[0](x)))
    return ffn(x)


def attention_inputs(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, propagation: Propagation
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys and values of an attention under ``propagation``: ``cp`` stops relevance
    at the probabilities (queries and keys detached); ``attnlrp`` gives query and key a quarter
    each and the values half (the uniform rule at both products, with the output halved by
    :func:`attention_output`)."""
    if propagation == "cp":
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
    """The pool's probabilities under ``propagation``: constant for ``cp``. (Under ``attnlrp``
    they take relevance like any softmax; the pool's query is a weight, not an input, so its
    score is linear in the keys and needs no split; the product with the values is split by
    :func:`attention_output`.)"""
    if isinstance(propagation, AttentionValve):
        return propagation(weights)
    return weights.detach() if propagation == "cp" else weights


def check_propagation(propagation: Propagation) -> None:
    """Refuse an unknown propagation name."""
    if isinstance(propagation, AttentionValve):
        return
    if propagation is not None and propagation not in PROPAGATIONS:
        raise ValueError(f"propagation must be one of {PROPAGATIONS} or None, got {propagation!r}")
