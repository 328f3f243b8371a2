"""Encoder windows: whole documents through blocks that were trained on short sequences.

A pre-trained encoder's positions cover a few hundred tokens (MiniLM was trained on 128). A
document longer than that is cut into consecutive windows of at most ``window`` tokens,
optionally overlapping by ``overlap``; the positions restart in every window, and each window
is encoded alone: the windows of a whole batch are the rows the blocks see. The global
attention pool then reads every token of every window at once, so the pool, the exact
contributions and every word-score method cover the whole document, and the cost stays linear
in its length.

Windows are cut by each token's *document position*, not its place in the batch row, so a copy
of a document with some tokens removed (erasure checks cut them out to save work) puts every
kept token in the window, and at the in-window position, it had in the whole document: the
same as masking the removed tokens out.

A token inside an overlap is encoded twice; the pool reads the copy from the window in which
it has more context on its shorter side, its **owner**. A window none of whose
tokens it owns is not encoded at all.

Shape notation: B documents, T tokens per document row, E (token, window) entries, N window
rows, L the longest row (≤ window), D width.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class WindowLayout(NamedTuple):
    """Where every real token of a batch sits in the encoder's window rows.

    One entry per (token, window) pair; a token in an overlap has two.
    """

    rows: int  # N, window rows with at least one owned token
    width: int  # L, tokens in the longest row
    document: torch.Tensor  # [E] long: the entry's document (batch row)
    token: torch.Tensor  # [E] long: its token index in that document's row
    row: torch.Tensor  # [E] long: its window row
    slot: torch.Tensor  # [E] long: its column in that row (rows are packed left)
    position: torch.Tensor  # [E] long: its position inside the window (0 … window-1)
    owner: torch.Tensor  # [E] bool: the copy the pool reads
    row_mask: torch.Tensor  # [N, L] bool: True = real token

    def to_rows(self, values: torch.Tensor, owners_only: bool = False) -> torch.Tensor:
        """``[B,T,...]`` per-token values → ``[N,L,...]`` per-row values (0 where empty).

        With ``owners_only``, only each token's owning copy gets its value (the others 0).
        """
        out = values.new_zeros(self.rows, self.width, *values.shape[2:])
        keep = self.owner if owners_only else slice(None)
        out[self.row[keep], self.slot[keep]] = values[self.document[keep], self.token[keep]]
        return out

    def to_tokens(
        self, values: torch.Tensor, batch: int, length: int, owners_only: bool = True
    ) -> torch.Tensor:
        """``[N,L,...]`` per-row values → ``[B,T,...]`` per-token values (0 where no token).

        ``owners_only``: each token takes its owning copy's value (token states); otherwise
        the values of all its copies are summed (relevance carried back through the rows).
        """
        out = values.new_zeros(batch, length, *values.shape[2:])
        if owners_only:
            keep = self.owner
            out[self.document[keep], self.token[keep]] = values[self.row[keep], self.slot[keep]]
        else:
            out.index_put_(
                (self.document, self.token), values[self.row, self.slot], accumulate=True
            )
        return out


def window_layout(
    mask: torch.Tensor, positions: torch.Tensor, window: int, overlap: int = 0
) -> WindowLayout:
    """Cut a batch's real tokens into encoder windows.

    Args:
        mask: ``[B,T]`` bool, True = real token.
        positions: ``[B,T]`` long, each token's position in its document, increasing along
            each row (0, 1, 2, … for a whole document; with gaps for a copy with tokens cut out).
        window: most tokens per window (the encoder's positions).
        overlap: tokens shared by consecutive windows (``0 <= overlap < window``).

    Returns:
        The :class:`WindowLayout`; window ``k`` of a document holds its positions
        ``[k·s, k·s + window)``, ``s = window - overlap``.
    """
    if not 0 <= overlap < window:
        raise ValueError(f"overlap must be in [0, window={window}), got {overlap}")
    stride = window - overlap
    document, token = mask.nonzero(as_tuple=True)  # real tokens, in row-major order
    where = positions[document, token]
    copies = -(-window // stride)  # the most windows one position can fall in
    # (copies, R): the windows each real token falls in, the last one first.
    first = where // stride
    windows = first[None, :] - torch.arange(copies, device=mask.device)[:, None]
    inside = (windows >= 0) & (where[None, :] < windows * stride + window)
    # The owner: the window that gives the token the most context on its shorter side (the
    # document's last window may be short); ties go to the earlier window.
    last = torch.zeros(mask.shape[0], dtype=where.dtype, device=mask.device)
    last = last.scatter_reduce(0, document, where, reduce="amax")[document]
    start = windows * stride
    end = torch.minimum(start + window - 1, last[None, :])
    margin = torch.minimum(where[None, :] - start, end - where[None, :]).float()
    margin = torch.where(inside, margin, -torch.inf)
    earlier_first = 1e-3 * torch.arange(copies, device=mask.device)[:, None]
    owner_copy = (margin + earlier_first).argmax(0)
    owner = torch.zeros_like(inside)
    owner[owner_copy, torch.arange(len(where), device=mask.device)] = True
    # Flatten the valid (token, window) pairs: E entries.
    copy_index, entry = inside.nonzero(as_tuple=True)
    document, token, where = document[entry], token[entry], where[entry]
    windows, owner = windows[copy_index, entry], owner[copy_index, entry]
    # A window that owns no token adds nothing the pool reads: leave it out.
    span = int(windows.max()) + 1 if len(windows) else 1
    key = document * span + windows
    owned_keys = torch.unique(key[owner])
    kept = torch.isin(key, owned_keys)
    document, token, where, windows, owner, key = (
        t[kept] for t in (document, token, where, windows, owner, key)
    )
    # Rows ordered by (document, window); entries inside a row by position.
    row = torch.searchsorted(owned_keys, key)
    order = torch.argsort(row * (int(where.max()) + 1 if len(where) else 1) + where)
    document, token, where, windows, owner, row = (
        t[order] for t in (document, token, where, windows, owner, row)
    )
    counts = torch.bincount(row, minlength=len(owned_keys))
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(row), device=mask.device) - starts[row]
    width = int(counts.max()) if len(counts) else 1
    row_mask = torch.arange(width, device=mask.device)[None, :] < counts[:, None]
    return WindowLayout(
        rows=len(owned_keys),
        width=width,
        document=document,
        token=token,
        row=row,
        slot=slot,
        position=where - windows * stride,
        owner=owner,
        row_mask=row_mask,
    )
