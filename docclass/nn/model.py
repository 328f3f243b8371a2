"""The document classifier as a plain ``nn.Module`` (torch only: no Lightning, no I/O).

Shape notation: B batch, T tokens, H heads, D model width, C classes, L layers.
Mask convention: ``True`` = real token.

    token ids ─► embedding + positions ─► L encoder blocks ─► LayerNorm
              ─► global attention pool (H learned queries) ─► linear read-out ─► logits

Blocks are pre-LayerNorm when trained from scratch (stable without warm-up tricks) or
post-LayerNorm, the BERT layout, when a pre-trained encoder's weights are loaded into them
(``norm="post"``: then the last block's output LayerNorm is ``final_norm``, and an embedding
LayerNorm follows word + position vectors).

With ``window_tokens`` (pre-trained encoders, whose positions cover a few hundred tokens) a
document is cut into windows encoded separately, positions restarting in each, and the pool
reads every token of every window (:mod:`docclass.nn.windows`).

Everything after the pool's softmax is linear, so each token's exact contribution to each
class logit can be recovered from ``pool_weights`` and the value vectors. ``propagation``
(:mod:`docclass.nn.relevance`) changes what a backward pass carries, never the values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from docclass.errors import ConfigError
from docclass.nn import relevance
from docclass.nn.attention import SCORE_KINDS, AttentionPool, MultiHeadSelfAttention
from docclass.nn.windows import WindowLayout, window_layout

POSITION_KINDS = ("sinusoidal", "learned", "none")
NORM_PLACEMENTS = ("pre", "post")


@dataclass
class ModelConfig:
    """Everything needed to rebuild the network; stored in every checkpoint."""

    vocab_size: int  # rows of the token embedding (the tokenizer's vocabulary size)
    num_classes: int  # C, number of labels
    d_model: int = 128  # D, width of every token vector
    n_heads: int = 4  # heads of each self-attention block
    n_layers: int = 1  # stacked self-attention blocks; 0 = embeddings straight into the pool
    pool_heads: int = 4  # learned queries of the global attention pool
    pool_score: str = "dot"  # pool scoring function: dot | additive | gaussian
    ffn_mult: int = 4  # hidden width of each block's feed-forward layer, as a multiple of D
    dropout: float = 0.1  # residual and read-out dropout
    attn_dropout: float = 0.0  # > 0 forces the slow attention path on CPU
    # 0: every token attends to every token (O(T²)); w > 0: only to tokens at most w away
    # (O(T·w)), so long documents can be read whole. The pool always sees every token.
    attention_window: int = 0
    embed_dropout: float = 0.1  # dropout on the embedded tokens
    word_dropout: float = 0.0  # fraction of real tokens hidden from the model while training
    positions: str = "sinusoidal"  # sinusoidal | learned | none
    max_positions: int = 4096  # longest sequence a learned position table covers
    pad_id: int = 0  # token id used for padding
    # pre: LayerNorm before attention and feed-forward (from scratch); post: after each
    # residual sum, as BERT-family encoders were trained (their weights need it).
    norm: str = "pre"
    norm_eps: float = 1e-5  # every LayerNorm's epsilon (BERT checkpoints use 1e-12)
    embedding_norm: bool = False  # LayerNorm over word + position vectors (BERT)
    # Multiply token vectors by sqrt(D) (from scratch: see DocumentClassifier.__init__);
    # pre-trained embeddings were trained without it.
    scale_embeddings: bool = True
    # 0: a document is one sequence. w > 0: it is cut into windows of at most w tokens, each
    # encoded alone with positions restarting (a pre-trained encoder's positions cover a few
    # hundred tokens); the pool reads every token of every window (nn/windows.py).
    window_tokens: int = 0
    window_overlap: int = 0  # tokens shared by consecutive windows (at most half a window)

    def __post_init__(self) -> None:
        problems = []
        if self.vocab_size < 2:
            problems.append(f"vocab_size must be at least 2, got {self.vocab_size}")
        if self.num_classes < 2:
            problems.append(f"num_classes must be at least 2, got {self.num_classes}")
        if self.d_model < 1 or self.n_heads < 1 or self.pool_heads < 1:
            problems.append("d_model, n_heads and pool_heads must be positive")
        elif self.d_model % self.n_heads:
            problems.append(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        elif self.d_model % self.pool_heads:
            problems.append(
                f"d_model ({self.d_model}) must be divisible by pool_heads ({self.pool_heads})"
            )
        if self.attention_window < 0:
            problems.append(f"attention_window must be >= 0, got {self.attention_window}")
        if self.n_layers < 0:
            problems.append(f"n_layers must be >= 0, got {self.n_layers}")
        if self.window_tokens < 0:
            problems.append(f"window_tokens must be >= 0, got {self.window_tokens}")
        elif not 0 <= self.window_overlap <= self.window_tokens // 2:
            # The encoder's cost grows as window_tokens / (window_tokens - overlap): up to 512
            # times at 511 of 512 (447 times on a 4,000-token document), from a stored config a
            # served model would load. At half a window every token's reading already has at
            # least a quarter window of context on each side (what the owning copy, the one
            # with the most context, gets). A config stored with more is refused.
            problems.append(
                f"window_overlap must be in [0, window_tokens // 2 = {self.window_tokens // 2}]"
                f", got {self.window_overlap}"
            )
        if self.window_tokens and self.attention_window:
            problems.append(
                "window_tokens and attention_window are two ways to read long "
                "documents: set one of them"
            )
        if (
            self.positions == "learned"
            and self.window_tokens
            and self.window_tokens > self.max_positions
        ):
            problems.append(
                f"window_tokens {self.window_tokens} exceeds the {self.max_positions} learned "
                "positions"
            )
        for name in ("dropout", "attn_dropout", "embed_dropout", "word_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                problems.append(f"{name} must be in [0, 1), got {value}")
        if self.pool_score not in SCORE_KINDS:
            problems.append(f"pool_score must be one of {SCORE_KINDS}, got {self.pool_score!r}")
        if self.norm not in NORM_PLACEMENTS:
            problems.append(f"norm must be one of {NORM_PLACEMENTS}, got {self.norm!r}")
        if self.positions not in POSITION_KINDS:
            problems.append(f"positions must be one of {POSITION_KINDS}, got {self.positions!r}")
        problems += self._type_problems()
        if problems:
            raise ConfigError("model config: " + "; ".join(problems))

    def _type_problems(self) -> list[str]:
        """Values of the wrong kind, as a hand-edited config.json holds them: "1e-5" was a
        traceback inside layer_norm, -1 made every output NaN, "no" a true switch."""
        problems = []
        eps = self.norm_eps
        if type(eps) not in (int, float) or not (math.isfinite(eps) and 0 < eps < 1):
            problems.append(f"norm_eps must be a positive number below 1, got {eps!r}")
        for field in fields(self):
            if field.type in ("bool", bool) and type(getattr(self, field.name)) is not bool:
                problems.append(
                    f"{field.name} must be true or false, got {getattr(self, field.name)!r}"
                )
        return problems

    def to_dict(self) -> dict:
        """Plain-type dict, safe to store in a ``weights_only`` checkpoint."""
        return asdict(self)


class ClassifierOutput(NamedTuple):
    """What the model returns.

    logits: ``[B,C]``.
    pool_weights: ``[B,H,T]``; each row sums to 1 over real tokens and is exactly 0 on padding.
    layer_weights: one ``[B,H,T,T]`` per block when asked for, else None.
    token_states: ``[B,T,D]``, the normalised token vectors the pool reads; with
        ``pool_weights`` they give every token's exact share of each logit
        (:meth:`DocumentClassifier.token_contributions`).
    windows: with ``window_tokens``, where each token sat in the window rows the blocks read
        (then ``layer_weights`` are per row, ``[N,H,L,L]``); None when every document was one
        sequence.
    """

    logits: torch.Tensor
    pool_weights: torch.Tensor
    layer_weights: list[torch.Tensor] | None
    token_states: torch.Tensor
    windows: WindowLayout | None = None


class Stage(NamedTuple):
    """Which part of the encoder a pass runs (the whole of it by default)."""

    start: int = 0  # first block
    stop: int | None = None  # block after the last (None: through the top)
    embed: bool = True  # the input is the words' own vectors: positions and embedding norm first
    final: bool = True  # the final LayerNorm after the last block


def sinusoidal_positions(length: int, width: int, device: torch.device) -> torch.Tensor:
    """The fixed sine/cosine table ``[T,D]`` of "Attention Is All You Need"."""
    position = torch.arange(length, device=device, dtype=torch.float32).unsqueeze(1)
    frequency = torch.exp(
        torch.arange(0, width, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / width)
    )
    table = torch.zeros(length, width, device=device)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: width // 2])
    return table


class EncoderBlock(nn.Module):
    """Transformer block: self-attention then feed-forward, each residual.

    Pre-LN: ``x + attn(LN(x))`` then ``x + ffn(LN(x))``. Post-LN (BERT): ``LN(x + attn(x))``
    then ``LN(x + ffn(x))``; ``output_norm=False`` leaves the second LayerNorm to the caller
    (the model's ``final_norm`` holds it for the last block).
    """

    def __init__(self, config: ModelConfig, output_norm: bool = True) -> None:
        super().__init__()
        self.post_norm = config.norm == "post"
        self.attn_norm = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.attn = MultiHeadSelfAttention(
            config.d_model, config.n_heads, config.attn_dropout, config.attention_window
        )
        self.ffn_norm = (
            nn.LayerNorm(config.d_model, eps=config.norm_eps)
            if output_norm or not self.post_norm
            else nn.Identity()
        )
        self.ffn = nn.Sequential(
            nn.Linear(config.d_model, config.ffn_mult * config.d_model),
            nn.GELU(),
            nn.Linear(config.ffn_mult * config.d_model, config.d_model),
        )
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        need_weights: bool = False,
        propagation: relevance.Propagation = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x [B,T,D]``, ``mask [B,T]`` (None: all real) → ``([B,T,D], [B,H,T,T] or None)``;
        ``propagation`` as in :mod:`docclass.nn.relevance` (same values, other gradients)."""
        norm, ffn = relevance.norm, relevance.feed_forward
        if self.post_norm:
            attended, weights = self.attn(x, mask, need_weights, propagation)
            x = norm(x + self.dropout(attended), self.attn_norm, propagation)
            x = x + self.dropout(ffn(x, self.ffn, propagation))
            return norm(x, self.ffn_norm, propagation), weights
        attended, weights = self.attn(
            norm(x, self.attn_norm, propagation), mask, need_weights, propagation
        )
        x = x + self.dropout(attended)
        x = x + self.dropout(ffn(norm(x, self.ffn_norm, propagation), self.ffn, propagation))
        return x, weights


# A window row joins the current group while it has at least this share of the group's longest
# row (then the width is rounded up, below, and groups of one width merge).
GROUP_FILL = 0.75
# Group widths are rounded up to a multiple of this (never past the rows' width), so a compiled
# model on a GPU meets few distinct shapes.
GROUP_MULTIPLE = 8


def length_groups(
    lengths: torch.Tensor, width: int | None = None
) -> list[tuple[torch.Tensor, int]]:
    """Row indices grouped by similar length, longest first: ``[(indices, group width)]``, the
    width the group's longest row rounded up to :data:`GROUP_MULTIPLE` (at most ``width``)."""
    order = torch.argsort(lengths, descending=True, stable=True)
    ordered = lengths[order].tolist()
    limit = width if width is not None else max(ordered, default=1)
    groups: list[tuple[torch.Tensor, int]] = []
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] < GROUP_FILL * ordered[start]:
            longest = max(int(ordered[start]), 1)
            rounded = -(-longest // GROUP_MULTIPLE) * GROUP_MULTIPLE
            group_width = max(longest, min(rounded, limit))
            if groups and groups[-1][1] == group_width:  # one pass, not two, at one width
                groups[-1] = (torch.cat([groups[-1][0], order[start:i]]), group_width)
            else:
                groups.append((order[start:i], group_width))
            start = i
    return groups


class DocumentClassifier(nn.Module):
    """Embeddings + positions, stacked self-attention blocks, attention pool, linear read-out."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_id)
        # Stored at scale 1/sqrt(D) and multiplied by sqrt(D) in token_vectors: token vectors start
        # at unit scale like the sinusoids, while AdamW's per-coordinate steps move them sqrt(D)
        # times further relative to that scale. With the embedding at unit scale instead, a few
        # hundred steps barely move it off its random start (BBC validation 0.92 vs 0.97).
        nn.init.normal_(self.embed.weight, std=config.d_model**-0.5)
        with torch.no_grad():
            self.embed.weight[config.pad_id].zero_()
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0
        self.position_table = (
            nn.Embedding(config.max_positions, config.d_model)
            if config.positions == "learned"
            else None
        )
        self.embedding_norm = (
            nn.LayerNorm(config.d_model, eps=config.norm_eps)
            if config.embedding_norm
            else nn.Identity()
        )
        self.embed_dropout = nn.Dropout(config.embed_dropout)
        # Post-LN: the last block's output LayerNorm is final_norm (one norm, not two).
        self.blocks = nn.ModuleList(
            EncoderBlock(config, output_norm=i < config.n_layers - 1)
            for i in range(config.n_layers)
        )
        self.final_norm = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.pool = AttentionPool(config.d_model, config.pool_heads, config.pool_score)
        self.readout_dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.d_model, config.num_classes)

    def token_vectors(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids [B,T]`` → the words' own vectors ``[B,T,D]`` (positions not added): what
        gradient-based word scores are taken at."""
        return self.embed(input_ids) * self.embed_scale

    def position_vectors(
        self, length: int, device: torch.device, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor | None:
        """``[T,D]`` added to the token vectors, or None without positions."""
        if self.position_table is not None:
            if length > self.config.max_positions:
                raise ValueError(
                    f"sequence of {length} tokens exceeds max_positions={self.config.max_positions}"
                )
            return self.position_table.weight[:length]
        if self.config.positions == "sinusoidal":
            return sinusoidal_positions(length, self.config.d_model, device).to(dtype)
        return None

    def _with_positions(self, vectors: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``vectors [...,D]`` plus the position vectors of ``positions [...]`` (long)."""
        table = self.position_vectors(int(positions.max()) + 1, vectors.device, vectors.dtype)
        return vectors if table is None else vectors + table[positions]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        need_layer_weights: bool | Literal["mean"] = False,
        token_vectors: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        propagation: relevance.Propagation = None,
        entry_scale: torch.Tensor | None = None,
    ) -> ClassifierOutput:
        """Classify a batch.

        Args:
            input_ids: ``[B,T]`` long token ids.
            attention_mask: ``[B,T]`` bool, True = real token.
            need_layer_weights: also return every block's ``[B,H,T,T]`` attention (full
                attention: detached, computed beside the fused kernel; O(T²) memory per head);
                banded ``[B,H,nb,w,3w]`` with an attention window; per window row ``[N,H,L,L]`` with
                ``window_tokens``. ``"mean"``: each block's weights averaged over its heads
                instead, with the head axis kept (size 1): rollout reads no more, and a
                MiniLM forward pass keeping every head of every block cost more than twice
                a plain one on the CPU (16 BBC test articles).
            token_vectors: optional ``[B,T,D]`` replacement for :meth:`token_vectors`, for
                gradient-based word scores (positions are added by the model).
            positions: optional ``[B,T]`` long: each token's position in its document,
                increasing along a row (default ``0 … T-1``). A copy of a document with tokens
                cut out keeps the others where they were: the same result as masking them.
            propagation: None for plain gradients, a rule of :mod:`docclass.nn.relevance`,
                or its :class:`~docclass.nn.relevance.AttentionValve` (the forward values are
                the same).
            entry_scale: optional ``[B,T]`` multiplier of what each token brings to the first
                block: its word and position vectors after the embedding norm, less the norm's
                offset (the same for every token). Ones that require gradients change no value,
                and the gradient on each is gradient × input there: the relevance of the
                token's word and position together, which masking the token out of every block
                removes; a token in two overlapping windows gets the sum over both.

        Returns:
            :class:`ClassifierOutput`.
        """
        relevance.check_propagation(propagation)
        if need_layer_weights not in (False, True, "mean"):
            raise ValueError(
                f"need_layer_weights: False, True or 'mean', not {need_layer_weights!r}"
            )
        mask = attention_mask.bool()
        if self.training and self.config.word_dropout > 0:
            mask = drop_words(mask, self.config.word_dropout)
        vectors = self.token_vectors(input_ids) if token_vectors is None else token_vectors
        batch, length = mask.shape
        if positions is None:
            positions = torch.arange(length, device=mask.device).expand(batch, -1)
        token_states, layer_weights, layout = self._through_blocks(
            vectors, mask, positions, Stage(), need_layer_weights, propagation, entry_scale
        )
        logits, pool_weights = self.read_out(token_states, mask, propagation)
        return ClassifierOutput(logits, pool_weights, layer_weights, token_states, layout)

    def lower_block_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, blocks: int
    ) -> torch.Tensor:
        """Each token's vector after the embedding and the first ``blocks`` blocks, ``[B,T,D]``
        (0 on padding): what the blocks above take, and what a run that trains only those
        caches once (``model.freeze_blocks``). Documents are read from position 0, in windows
        as :meth:`forward` reads them.

        Args:
            input_ids: ``[B,T]`` long token ids.
            attention_mask: ``[B,T]`` bool, True = real token.
            blocks: how many of the lowest blocks to run, ``0 <= blocks < n_layers``.
        """
        self._check_split(blocks)
        mask = attention_mask.bool()
        batch, length = mask.shape
        positions = torch.arange(length, device=mask.device).expand(batch, -1)
        states, _, _ = self._through_blocks(
            self.token_vectors(input_ids), mask, positions, Stage(stop=blocks, final=False)
        )
        return states.masked_fill(~mask.unsqueeze(-1), 0.0)

    def classify_from_block(
        self, states: torch.Tensor, attention_mask: torch.Tensor, first_block: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rest of :meth:`forward` from :meth:`lower_block_states`: blocks ``first_block``
        onwards, the final LayerNorm, the pool and the read-out → ``(logits [B,C],
        pool_weights [B,H,T])``; the same values as :meth:`forward` on the same documents.

        Args:
            states: ``[B,T,D]`` from ``lower_block_states(..., blocks=first_block)``.
            attention_mask: ``[B,T]`` bool, True = real token.
            first_block: the first block to run, as ``blocks`` there.
        """
        self._check_split(first_block)
        mask = attention_mask.bool()
        if self.training and self.config.word_dropout > 0:
            mask = drop_words(mask, self.config.word_dropout)
        batch, length = mask.shape
        positions = torch.arange(length, device=mask.device).expand(batch, -1)
        token_states, _, _ = self._through_blocks(
            states, mask, positions, Stage(start=first_block, embed=False)
        )
        return self.read_out(token_states, mask)

    def _check_split(self, block: int) -> None:
        if not 0 <= block < self.config.n_layers:
            raise ValueError(
                f"a split between blocks must be in [0, {self.config.n_layers}), got {block}"
            )
        if self.config.window_tokens and self.config.window_overlap:
            # A token in an overlap has a state in each of its windows; one per token cannot
            # stand for both.
            raise ValueError("states between blocks are per token: no window_overlap")

    def _through_blocks(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        stage: Stage,
        need_layer_weights: bool | Literal["mean"] = False,
        propagation: relevance.Propagation = None,
        entry_scale: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None, WindowLayout | None]:
        """Per-token vectors ``[B,T,D]`` through ``stage`` of the encoder, in window rows when
        the documents are longer than ``window_tokens`` → per-token states ``[B,T,D]``, each
        block's attention when asked, and the window layout (None without windows).
        ``entry_scale [B,T]`` as in :meth:`forward` (only with ``stage.embed``)."""
        if entry_scale is not None and not stage.embed:
            raise ValueError(
                "entry_scale multiplies the embedded states: a stage from the embedding"
            )
        batch, length = mask.shape
        window = self.config.window_tokens
        if window and length and int(positions.max()) >= window:
            layout = window_layout(mask, positions, window, self.config.window_overlap)
            rows = layout.to_rows(x)
            if stage.embed:
                rows = self._with_positions(rows, self._row_positions(layout))
            # Every copy of a token takes the token's one multiplier, so its gradient sums theirs.
            row_scale = None
            if entry_scale is not None:  # 1 on empty slots, whose values then stay as they were
                empty = ~layout.row_mask[..., None]
                row_scale = layout.to_rows(entry_scale[..., None]) + empty.to(entry_scale.dtype)
            states, layer_weights = self._encode_rows(
                rows, layout.row_mask, need_layer_weights, propagation, stage, row_scale
            )
            return layout.to_tokens(states, batch, length), layer_weights, layout
        if stage.embed and length:
            x = self._with_positions(x, positions)
        scale = None if entry_scale is None else entry_scale[..., None]
        states, layer_weights = self._encode(x, mask, need_layer_weights, propagation, stage, scale)
        return states, layer_weights, None

    @staticmethod
    def _row_positions(layout: WindowLayout) -> torch.Tensor:
        """``[N,L]`` long: the in-window position of every slot of the rows (0 where empty)."""
        positions = torch.zeros(
            layout.rows, layout.width, dtype=torch.long, device=layout.row_mask.device
        )
        positions[layout.row, layout.slot] = layout.position
        return positions

    def _encode_rows(
        self,
        rows: torch.Tensor,
        row_mask: torch.Tensor,
        need_layer_weights: bool | Literal["mean"],
        propagation: relevance.Propagation,
        stage: Stage,
        entry_scale: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Window rows ``[N,L,D]`` through ``stage`` of the encoder in groups of similar length
        (``entry_scale [N,L,1]`` as :meth:`_encode` takes it).

        A document's last window is usually short, and padding it to the longest row cost a
        third more slots and more attention (BBC's test split: 1.30x the real tokens, 1.43x
        the attention scores). Rows never interact in the blocks, so each group runs padded
        only to its own width (a group of whole windows needs no mask at all); the states, and
        the weights when asked, come back in the rows' order and width. Beyond a group's width
        both are zero; inside it, as in one padded run, padded keys get zero weight and padded
        query slots hold values no token reads."""
        groups = length_groups(row_mask.sum(dim=1), row_mask.shape[1])
        if len(groups) == 1:
            return self._encode(rows, row_mask, need_layer_weights, propagation, stage, entry_scale)
        count, width = row_mask.shape
        states = rows.new_zeros(count, width, self.config.d_model)
        weights: list[torch.Tensor] | None = None
        for index, length in groups:
            part, part_weights = self._encode(
                rows[index, :length],
                row_mask[index, :length],
                need_layer_weights,
                propagation,
                stage,
                None if entry_scale is None else entry_scale[index, :length],
            )
            states = states.index_copy(0, index, F.pad(part, (0, 0, 0, width - length)))
            if part_weights is not None:
                if weights is None:
                    # Uninitialised: every slot is written once below, rather than zeroed first.
                    weights = [w.new_empty(count, w.shape[1], width, width) for w in part_weights]
                for full, layer in zip(weights, part_weights, strict=True):
                    full[index, :, :length, :length] = layer
                    full[index, :, length:] = 0.0
                    full[index, :, :length, length:] = 0.0
        return states, weights

    def _encode(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        need_layer_weights: bool | Literal["mean"],
        propagation: relevance.Propagation,
        stage: Stage,
        entry_scale: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Rows ``[R,S,D]`` through ``stage``: from positioned vectors to normalised token
        states for the whole encoder; each block's attention when asked. ``entry_scale
        [R,S,1]`` multiplies the states entering the first block (see :meth:`forward`)."""
        if stage.embed:
            # Every propagation rule holds the embedding LayerNorm's scale constant: gradient ·
            # input taken before a LayerNorm whose scale moves would be ~0.
            x = relevance.norm(x, self.embedding_norm, propagation)
            if entry_scale is not None:
                # The norm's offset is the same for every token: a bias, not the token's.
                offset = getattr(self.embedding_norm, "bias", None)
                x = x * entry_scale if offset is None else offset + (x - offset) * entry_scale
            x = self.embed_dropout(x)
        layer_weights: list[torch.Tensor] | None = [] if need_layer_weights else None
        blocks = self.blocks[stage.start : stage.stop]
        # A batch without padding (length buckets often give one) needs no attention mask, and
        # SDPA without one ran 1.1x faster on a 2-core CPU (make encoder-speed).
        block_mask = None if blocks and bool(mask.all()) else mask
        if len(x):
            for block in blocks:
                x, weights = block(x, block_mask, bool(need_layer_weights), propagation)
                if layer_weights is not None:
                    if need_layer_weights == "mean":
                        weights = weights.mean(dim=1, keepdim=True)
                    layer_weights.append(weights)
        if not stage.final:
            return x, layer_weights
        return relevance.norm(x, self.final_norm, propagation), layer_weights

    def read_out(
        self,
        token_states: torch.Tensor,
        mask: torch.Tensor,
        propagation: relevance.Propagation = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``token_states [B,T,D]`` (after ``final_norm``), ``mask [B,T]`` → ``(logits [B,C],
        pool_weights [B,H,T])``: the attention pool and the linear read-out alone (what trains
        on a frozen encoder's cached token states)."""
        pooled, pool_weights = self.pool(token_states, mask, propagation)
        return self.head(self.readout_dropout(pooled)), pool_weights

    def token_contributions(
        self, token_states: torch.Tensor, pool_weights: torch.Tensor
    ) -> torch.Tensor:
        """Each token's exact additive share of each class logit (eval mode).

        ``logits[b, c] == token_contributions(...)[b, :, c].sum() + contribution_bias()[c]``
        for every document with a real token, because everything after the pool's softmax is
        linear. A token's value is ``W_v (γ ⊙ x̂_t) + (W_v β + b_v)``: the first part is what the
        token brings; the second is the same for every token, and since each head's weights
        sum to 1 it adds the same to every document's logit, so it belongs to the bias, not to
        the words (left in, it would credit each word in proportion to its attention).

        Args:
            token_states: ``[B,T,D]`` from :class:`ClassifierOutput` (after the final LayerNorm).
            pool_weights: ``[B,H,T]`` from :class:`ClassifierOutput`.

        Returns:
            ``[B,T,C]``; exactly 0 on padding.
        """
        batch, length, _ = token_states.shape
        heads = self.pool.n_heads
        brought = F.linear(token_states - self.final_norm.bias, self.pool.value_proj.weight)
        values = brought.view(batch, length, heads, -1)  # (B, T, H, Dh)
        readout = (self.head.weight @ self.pool.out_proj.weight).view(
            self.config.num_classes, heads, -1
        )  # (C, H, Dh)
        return torch.einsum("bht,bthd,chd->btc", pool_weights, values, readout)

    def contribution_bias(self) -> torch.Tensor:
        """``[C]``: the part of each logit no token accounts for: the value every token shares
        (``W_v β + b_v``) carried through the pool's output, plus ``w_cᵀ b_o + b_c``."""
        shared_value = (
            self.pool.value_proj.weight @ self.final_norm.bias + self.pool.value_proj.bias
        )
        pooled_constant = self.pool.out_proj.weight @ shared_value + self.pool.out_proj.bias
        return self.head.weight @ pooled_constant + self.head.bias


def drop_words(mask: torch.Tensor, rate: float) -> torch.Tensor:
    """Hide a random ``rate`` of each document's real tokens, never all of them.

    Args:
        mask: ``[B,T]`` bool, True = real token.
        rate: probability of hiding each real token.
    """
    kept = mask & (torch.rand(mask.shape, device=mask.device) >= rate)
    # A document that lost every token keeps its original mask rather than becoming empty.
    emptied = ~kept.any(dim=-1, keepdim=True)
    return torch.where(emptied, mask, kept)
