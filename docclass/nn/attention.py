"""Attention building blocks: masked softmax, scoring functions, self-attention, attention pool.

Shape notation used throughout: B batch, T tokens, H heads, Q queries, D model width,
Dh = D // H head width. Mask convention: ``True`` marks a real token, ``False`` padding.

Attention pooling is a weighted average of values whose weights are a softmax over scores
between a query and each key. Three scores are offered, each of the form ``score(q, k)``:

* ``dot``      scaled dot product ``q·k / sqrt(Dh)``
* ``additive`` ``wᵀ tanh(W_q q + W_k k)``
* ``gaussian`` ``-‖q - k‖² / 2`` (the Nadaraya–Watson kernel-regression form)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from docclass.nn import relevance

SCORE_KINDS = ("dot", "additive", "gaussian")


def masked_softmax(scores: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis that gives masked keys exactly zero weight.

    Args:
        scores: ``[..., T]`` raw scores.
        key_mask: boolean, broadcastable to ``scores``; ``True`` = real key.

    Returns:
        Weights of the same shape as ``scores``. Each row sums to 1 over its real keys; a row
        with no real key is all zeros (never NaN).
    """
    # The most negative finite number, not -inf: a row that is entirely masked then stays finite
    # (uniform) instead of NaN, and the final multiply turns it into zeros.
    very_negative = torch.finfo(scores.dtype).min
    weights = torch.softmax(scores.masked_fill(~key_mask, very_negative), dim=-1)
    return weights * key_mask


def scaled_scores(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``q·k / sqrt(Dh)`` for ``[B,H,Q,Dh]`` and ``[B,H,T,Dh]``, scaling the queries (``Q·Dh``
    numbers) rather than the scores (``Q·T``), as the fused kernel does."""
    return (queries * queries.shape[-1] ** -0.5) @ keys.transpose(-2, -1)


class DotScore(nn.Module):
    """Scaled dot product ``q·k / sqrt(Dh)``; has no parameters."""

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``queries [B,H,Q,Dh]``, ``keys [B,H,T,Dh]`` → scores ``[B,H,Q,T]``."""
        return scaled_scores(queries, keys)


class AdditiveScore(nn.Module):
    """Additive (Bahdanau) score ``wᵀ tanh(W_q q + W_k k)``, one set of weights per head.

    Args:
        n_heads: number of heads H.
        head_dim: query/key width Dh.
        hidden: width of the tanh layer.
    """

    def __init__(self, n_heads: int, head_dim: int, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or head_dim
        self.query_proj = nn.Parameter(torch.empty(n_heads, head_dim, hidden))
        self.key_proj = nn.Parameter(torch.empty(n_heads, head_dim, hidden))
        self.out = nn.Parameter(torch.empty(n_heads, hidden))
        for weight in (self.query_proj, self.key_proj):
            nn.init.normal_(weight, std=head_dim**-0.5)
        nn.init.normal_(self.out, std=hidden**-0.5)

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``queries [B,H,Q,Dh]``, ``keys [B,H,T,Dh]`` → scores ``[B,H,Q,T]``."""
        projected_q = torch.einsum("bhqd,hde->bhqe", queries, self.query_proj)  # (B, H, Q, E)
        projected_k = torch.einsum("bhtd,hde->bhte", keys, self.key_proj)  # (B, H, T, E)
        # (B, H, Q, 1, E) + (B, H, 1, T, E): every query meets every key.
        hidden = torch.tanh(projected_q.unsqueeze(-2) + projected_k.unsqueeze(-3))
        return torch.einsum("bhqte,he->bhqt", hidden, self.out)


class GaussianScore(nn.Module):
    """Gaussian-kernel score ``-‖q - k‖² / 2``; has no parameters."""

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``queries [B,H,Q,Dh]``, ``keys [B,H,T,Dh]`` → scores ``[B,H,Q,T]``."""
        # ‖q-k‖² = ‖q‖² - 2 q·k + ‖k‖², which avoids building a [B,H,Q,T,Dh] difference tensor.
        # The three terms nearly cancel for nearby q and k: in bf16 (8 bits of mantissa) the
        # difference would be mostly rounding error, so it is computed in float32.
        # The result goes back to the inputs' dtype: rounding it loses little, cancelling did.
        dtype = queries.dtype
        with torch.autocast(queries.device.type, enabled=False):
            queries, keys = queries.float(), keys.float()
            q_sq = queries.pow(2).sum(-1, keepdim=True)  # (B, H, Q, 1)
            k_sq = keys.pow(2).sum(-1).unsqueeze(-2)  # (B, H, 1, T)
            return (-(q_sq - 2 * queries @ keys.transpose(-2, -1) + k_sq) / 2).to(dtype)


def make_score(kind: str, n_heads: int, head_dim: int) -> nn.Module:
    """Build the scoring module named ``kind`` (one of :data:`SCORE_KINDS`)."""
    if kind == "dot":
        return DotScore()
    if kind == "additive":
        return AdditiveScore(n_heads, head_dim)
    if kind == "gaussian":
        return GaussianScore()
    raise ValueError(f"unknown attention score {kind!r}: choose one of {', '.join(SCORE_KINDS)}")


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``[B,T,D]`` → ``[B,H,T,Dh]``."""
    batch, tokens, width = x.shape
    return x.view(batch, tokens, n_heads, width // n_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``[B,H,T,Dh]`` → ``[B,T,D]``."""
    batch, heads, tokens, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, tokens, heads * head_dim)


def _band(window: int, device: torch.device) -> torch.Tensor:
    """``[w, 3w]`` bool: query ``a`` of a block may see key ``c`` of the three-block window
    (previous, own, next block) when their distance ``|c - w - a|`` is at most ``w``."""
    queries = torch.arange(window, device=device)[:, None]
    keys = torch.arange(3 * window, device=device)[None, :]
    return (keys - window - queries).abs() <= window


def _key_windows(x: torch.Tensor, window: int) -> torch.Tensor:
    """``[B,H,Tp,E]`` (Tp a multiple of w) → ``[B,H,nb,3w,E]``: each block's three-block window."""
    padded = F.pad(x, (0, 0, window, window))  # one empty block before and after
    return padded.unfold(2, 3 * window, window).transpose(-2, -1)


def local_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    key_mask: torch.Tensor,
    window: int,
    need_weights: bool = False,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Windowed (band) attention: token ``i`` attends to real tokens ``j`` with ``|i-j| <= w``.

    Cost O(T·w) instead of O(T²): the sequence is cut into blocks of ``w`` and each block's
    queries meet only the keys of the block before, their own and the one after (3w keys),
    with the band and padding masked.

    Args:
        queries, keys, values: ``[B,H,T,Dh]``.
        key_mask: ``[B,T]`` bool, True = real token.
        window: w, the largest distance attended to.
        need_weights: also return the weights, banded: ``[B,H,nb,w,3w]`` (see
            :func:`banded_to_dense`).
        dropout: dropout on the weights (training only; forces the explicit path on CPU).

    Returns:
        ``([B,H,T,Dh], banded weights or None)``.
    """
    batch, heads, length, head_dim = queries.shape
    blocks = max(1, math.ceil(length / window))
    extra = blocks * window - length
    if extra:
        queries, keys, values = (F.pad(t, (0, 0, 0, extra)) for t in (queries, keys, values))
        key_mask = F.pad(key_mask, (0, extra), value=False)
    q_blocks = queries.view(batch, heads, blocks, window, head_dim)
    k_windows, v_windows = _key_windows(keys, window), _key_windows(values, window)
    mask_windows = _key_windows(key_mask[:, None, :, None].float(), window)[..., 0].bool()
    # (B, 1, nb, w, 3w): the band, and the keys that are real.
    allowed = _band(window, queries.device) & mask_windows[:, :, :, None, :]
    if need_weights or dropout > 0:
        scores = q_blocks @ k_windows.transpose(-2, -1) / math.sqrt(head_dim)
        weights = masked_softmax(scores, allowed)  # (B, H, nb, w, 3w)
        attended = F.dropout(weights, dropout, dropout > 0) @ v_windows
    else:
        # A padded query may have no real key in reach: let it see its band (never pooled).
        allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
        attended = F.scaled_dot_product_attention(
            q_blocks.reshape(batch, heads * blocks, window, head_dim),
            k_windows.reshape(batch, heads * blocks, 3 * window, head_dim),
            v_windows.reshape(batch, heads * blocks, 3 * window, head_dim),
            attn_mask=allowed.expand(batch, heads, blocks, window, 3 * window).reshape(
                batch, heads * blocks, window, 3 * window
            ),
        )
        weights = None
    attended = attended.reshape(batch, heads, blocks * window, head_dim)[:, :, :length]
    return attended, weights


def banded_to_dense(banded: torch.Tensor, length: int) -> torch.Tensor:
    """Banded weights ``[B,H,nb,w,3w]`` → the full ``[B,H,T,T]`` matrix (zeros off the band).

    O(T²) memory: for inspecting short documents, not for long ones.
    """
    batch, heads, blocks, window, _ = banded.shape
    padded = blocks * window
    dense = banded.new_zeros(batch, heads, padded, padded + 2 * window)
    for block in range(blocks):
        start = block * window
        # Key column c of block n is position (n-1)·w + c, i.e. column n·w + c of the dense
        # matrix shifted right by one block.
        dense[:, :, start : start + window, start : start + 3 * window] = banded[:, :, block]
    return dense[:, :, :length, window : window + length]


def banded_flow(flow: torch.Tensor, banded: torch.Tensor) -> torch.Tensor:
    """``flow [B,T] @ A`` for a banded ``A`` given as ``[B,nb,w,3w]``, without building it."""
    batch, blocks, window, _ = banded.shape
    length = flow.shape[1]
    padded_flow = F.pad(flow, (0, blocks * window - length)).view(batch, blocks, 1, window)
    per_block = (padded_flow @ banded).squeeze(2)  # (B, nb, 3w): mass sent to each window key
    out = flow.new_zeros(batch, (blocks + 2) * window)
    for offset in range(3):
        # Window part ``offset`` of block n lands on block n - 1 + offset (shifted by one).
        part = per_block[:, :, offset * window : (offset + 1) * window].reshape(batch, -1)
        out[:, offset * window : offset * window + blocks * window] += part
    return out[:, window : window + length]


class MultiHeadSelfAttention(nn.Module):
    """Multi-head intra-attention: every token attends to every real token of its document.

    Q, K and V are projected per head, attended in parallel, concatenated and projected with
    W_o. The fused ``F.scaled_dot_product_attention`` kernel computes the output; with
    ``need_weights`` the weights are also computed, beside it and outside autograd (banded
    attention, ``window``, takes its own explicit path).

    Args:
        d_model: model width D.
        n_heads: number of heads H; must divide D.
        attn_dropout: dropout on attention weights. On CPU any value above 0 makes the fused
            kernel fall back to a much slower path, so keep 0 there.
        window: 0 for full attention; otherwise each token attends only to tokens at most
            this far away (:func:`local_attention`, O(T·w)), and weights come back banded.
    """

    def __init__(
        self, d_model: int, n_heads: int, attn_dropout: float = 0.0, window: int = 0
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads = n_heads
        self.attn_dropout = attn_dropout
        self.window = window
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        need_weights: bool = False,
        propagation: relevance.Propagation = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend.

        Args:
            x: ``[B,T,D]`` token states.
            mask: ``[B,T]`` bool, True = real token; None when every token is real (the
                fused kernel then runs without a mask, faster on CPU).
            need_weights: also return the attention weights.
            propagation: a rule of :mod:`docclass.nn.relevance` (same values, other gradients).

        Returns:
            ``([B,T,D], [B,H,T,T] or None)``; weights rows sum to 1 over real keys. With a
            window the weights are banded, ``[B,H,nb,w,3w]``.
        """
        queries, keys, values = relevance.attention_inputs(
            *(
                split_heads(part, self.n_heads)
                for part in relevance.linear(x, self.qkv, propagation).chunk(3, dim=-1)
            ),
            propagation,
        )  # each (B, H, T, Dh)
        attended, weights = self._attend(queries, keys, values, mask, need_weights)
        attended = relevance.attention_output(attended, propagation)
        return relevance.linear(merge_heads(attended), self.out_proj, propagation), weights

    def _attend(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None,
        need_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[B,H,T,Dh]`` each → (attended ``[B,H,T,Dh]``, weights or None)."""
        if _bfloat16_backward_on_cpu(queries, keys, values):
            # On the CPU the fused kernel's backward pass in bfloat16 took 2.5 times its
            # float32 one (16 windows of 512, 12 heads of 32: 0.36 s against 0.14 s forward
            # and backward; 0.18 s with the casts), and forward they cost alike. So a bf16
            # training step attends in float32 and keeps bf16 for its linear layers: the
            # demo's top-block steps ran 1.04 times faster (`make cpu-bf16-speed`).
            with torch.autocast("cpu", enabled=False):
                attended, weights = self._attend(
                    queries.float(), keys.float(), values.float(), mask, need_weights
                )
            if weights is not None:
                weights = weights.to(queries.dtype)
            return attended.to(queries.dtype), weights
        dropout = self.attn_dropout if self.training else 0.0
        if need_weights and not self.window:
            # The fused kernel gives the output and its backward pass: on the CPU the explicit
            # softmax(QKᵀ)·V in autograd made a MiniLM forward pass with weights 1.7× a plain
            # one, before any backward pass through it. The weights are read (rollout, the
            # maps), never differentiated: they are computed beside it, outside autograd.
            attended, _ = self._attend(queries, keys, values, mask, need_weights=False)
            with torch.no_grad():
                scores = scaled_scores(queries, keys)  # (B, H, T, T)
                if mask is None:
                    return attended, torch.softmax(scores, dim=-1)
                # masked_softmax without its copies (nothing is differentiated here): padded
                # keys get exactly zero, and a row with no real key zeros, not uniform.
                scores.masked_fill_(~mask[:, None, None, :], torch.finfo(scores.dtype).min)
                weights = torch.softmax(scores, dim=-1)
                return attended, weights.masked_fill_(~mask.any(dim=-1)[:, None, None, None], 0)
        if mask is None:  # every position real (the caller checked): no mask, fastest kernel
            if not self.window:
                attended = F.scaled_dot_product_attention(queries, keys, values, dropout_p=dropout)
                return attended, None
            mask = queries.new_ones(queries.shape[0], queries.shape[2], dtype=torch.bool)
        if self.window:
            return local_attention(queries, keys, values, mask, self.window, need_weights, dropout)
        key_mask = mask[:, None, None, :]  # (B, 1, 1, T)
        # A document with no real token would give the fused kernel an all-masked row (NaN);
        # let such rows see every position instead: their output is never pooled anyway.
        empty = ~mask.any(dim=-1)[:, None, None, None]
        attended = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=key_mask | empty, dropout_p=dropout
        )
        return attended, None


def _bfloat16_backward_on_cpu(*tensors: torch.Tensor) -> bool:
    """Whether these bf16 CPU tensors will be differentiated (a training step, not inference)."""
    return (
        tensors[0].device.type == "cpu"
        and tensors[0].dtype == torch.bfloat16
        and torch.is_grad_enabled()
        and any(tensor.requires_grad for tensor in tensors)
    )


class AttentionPool(nn.Module):
    """Global attention pool: H learned queries weigh all tokens at once.

    Each head scores its learned query against every token's key, takes a masked softmax, and
    averages that head's value vectors with those weights. Head outputs are concatenated and
    projected with W_o. Everything after the softmax is linear in the values, so a token's
    contribution to the pooled vector is exactly ``weight · W_o[:, head] · value``.

    Args:
        d_model: model width D.
        n_heads: number of pooling heads H; must divide D.
        score: scoring function, one of :data:`SCORE_KINDS`.
    """

    def __init__(self, d_model: int, n_heads: int, score: str = "dot") -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by pool heads ({n_heads})")
        self.n_heads = n_heads
        head_dim = d_model // n_heads
        self.queries = nn.Parameter(torch.randn(n_heads, 1, head_dim) * head_dim**-0.5)
        self.key_proj = nn.Linear(d_model, d_model)
        self.value_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.score = make_score(score, n_heads, head_dim)
        # Without gradients a dot-score pool can skip projecting every token's key and value
        # (:meth:`_folded`); off, it always takes the explicit path (benchmarks compare them).
        self.fold_without_grad = score == "dot"

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, propagation: relevance.Propagation = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pool.

        Args:
            x: ``[B,T,D]`` token states.
            mask: ``[B,T]`` bool, True = real token.
            propagation: a rule of :mod:`docclass.nn.relevance` (same values, other gradients).

        Returns:
            ``(pooled [B,D], weights [B,H,T])``; weights are exactly 0 on padding.
        """
        if self.fold_without_grad and not torch.is_grad_enabled() and self._plain_projections():
            return self._folded(x, mask)
        keys = split_heads(self.key_proj(x), self.n_heads)  # (B, H, T, Dh)
        values = split_heads(self.value_proj(x), self.n_heads)  # (B, H, T, Dh)
        queries = self.queries.unsqueeze(0).expand(x.shape[0], -1, -1, -1)  # (B, H, 1, Dh)
        scores = self.score(queries, keys)  # (B, H, 1, T)
        weights = masked_softmax(scores, mask[:, None, None, :])  # (B, H, 1, T)
        averaged = relevance.pool_weights(weights, propagation) @ values  # (B, H, 1, Dh)
        pooled = merge_heads(relevance.attention_output(averaged, propagation)).squeeze(1)
        return self.out_proj(pooled), weights.squeeze(2)

    def _plain_projections(self) -> bool:
        """Whether the key and value projections are float ``nn.Linear`` layers (folding reads
        their weights; a quantised copy's are packed and take the explicit path)."""
        return isinstance(self.key_proj, nn.Linear) and isinstance(self.value_proj, nn.Linear)

    def _folded(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` for the dot score, the same sums in another order (to ~1e-7).

        A head's score ``q·(W_k x + b_k)/√Dh`` is ``x·(W_kᵀ q)/√Dh`` plus a constant, and its
        output ``Σ_t w_t (W_v x_t + b_v)`` is ``W_v (Σ_t w_t x_t) + b_v Σ_t w_t``. So the pool
        projects H query vectors and H averaged tokens instead of T keys and T values: two of
        the fourteen D×D products per token of a one-block model (``make inference-options``).
        """
        batch, _, width = x.shape
        heads, head_dim = self.n_heads, width // self.n_heads
        queries = self.queries.squeeze(1) / math.sqrt(head_dim)  # (H, Dh)
        key_weight = self.key_proj.weight.view(heads, head_dim, width)
        query_in_x = torch.einsum("he,hed->dh", queries, key_weight)  # (D, H)
        query_bias = (queries * self.key_proj.bias.view(heads, head_dim)).sum(-1)  # (H,)
        scores = (x @ query_in_x + query_bias).transpose(1, 2)  # (B, H, T)
        weights = masked_softmax(scores, mask[:, None, :])  # (B, H, T)
        averaged = weights @ x  # (B, H, D): each head's weighted average of the tokens
        value_weight = self.value_proj.weight.view(heads, head_dim, width)
        pooled = torch.einsum("bhd,hed->bhe", averaged, value_weight)
        # A document with no real token has all-zero weights: no value bias, as in forward.
        pooled = pooled + self.value_proj.bias.view(heads, head_dim) * weights.sum(-1, True)
        return self.out_proj(pooled.reshape(batch, width)), weights
