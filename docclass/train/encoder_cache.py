"""A frozen encoder's token states, computed once per document and reused every epoch.

With ``model.freeze_encoder`` nothing below the attention pool changes while training, so the
encoder's output for a document is the same every time it is seen. On a CPU that output is
nearly all of a step's cost; cached, an epoch trains only the pool and the read-out. With
``model.freeze_blocks: k`` the same holds below block ``k``: the states the lowest ``k``
blocks give are cached, and every epoch runs only the blocks above them (BBC's whole articles,
MiniLM with its lowest five blocks frozen: an epoch took about a sixth of its cost, since the
five blocks ran forward once and never backward). States are kept per split and row (the
batch's ``index``) on the CPU, in the precision they were computed in, so training sees exactly
what inference will (with ``model.cpu_train_precision: bf16`` the training split's states carry
bf16's rounding, a median 0.45 % of a state's length on BBC; validation's and test's stay
float32, exact): BBC's 2,225 documents at 128 tokens and width 384 take about 440 MB in
float32, whole (about 1.07 million tokens) about 1.6 GB.
"""

from __future__ import annotations

import torch

from docclass.data.batching import pad_token_ids
from docclass.errors import ConfigError
from docclass.nn.model import DocumentClassifier


class EncoderStateCache:
    """Token states of every (split, row) seen so far, computed in eval mode without grad.

    Each entry keeps the token ids it was computed for: a row that comes back with other ids
    is refused rather than given another document's states. A document's states are computed
    beside the other new documents of its batch, and padding width changes their rounding
    (about 3e-8): a run resumed from a checkpoint after its first epoch, whose cache starts
    empty, trains on states equal to the uninterrupted run's to that rounding, not bit for
    bit. Computing each document alone would fix it at 2-4x the cost on a CPU.

    Args:
        blocks: None: the whole encoder's output (the pool's input); ``k``: the states after
            the lowest ``k`` blocks (:meth:`DocumentClassifier.lower_block_states`).
    """

    def __init__(self, blocks: int | None = None) -> None:
        self.blocks = blocks
        # (split, row) -> (the document's token ids, its states [T,D] on the CPU)
        self.states: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        # The entries computed in float32 without autocast (on a GPU, without TF32): the
        # states the model itself gives.
        self.exact: set[tuple[str, int]] = set()

    def __len__(self) -> int:
        return len(self.states)

    def token_states(
        self, model: DocumentClassifier, split: str, batch: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """``[B,T,D]`` on the batch's device, padding rows zero."""
        rows = batch["index"].tolist()
        if min(rows) < 0:
            # A row without a number (a streamed document) has no slot of its own: refusing
            # beats silently giving every such document the last cached one's states.
            raise ConfigError(
                f"model.cache_encoder_states: the {split} batch has rows without a row number "
                "(streamed); set cache_encoder_states: false"
            )
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        ids = [batch["input_ids"][i, : lengths[i]].cpu() for i in range(len(rows))]
        missing = [i for i, row in enumerate(rows) if (split, row) not in self.states]
        if missing:
            computed = self._compute(model, [ids[i] for i in missing], batch["input_ids"].device)
            device_type = batch["input_ids"].device.type
            # Float32 as the model itself computes it: no autocast, float32 states, and on a GPU
            # no TF32 matrix products.
            exact = (
                not torch.is_autocast_enabled(device_type)
                and computed[0].dtype == torch.float32
                and (device_type != "cuda" or torch.get_float32_matmul_precision() == "highest")
            )
            for i, state in zip(missing, computed, strict=True):
                # A copy: on the CPU the slice is a view, which would keep the whole padded
                # batch (shared memory when loaded by workers) alive for every cached document.
                self.states[(split, rows[i])] = (ids[i].clone(), state)
                if exact:
                    self.exact.add((split, rows[i]))
        width = batch["input_ids"].shape[1]
        found = []
        for i, row in enumerate(rows):
            cached_ids, state = self.states[(split, row)]
            if not torch.equal(cached_ids, ids[i]):
                raise ConfigError(
                    f"model.cache_encoder_states: {split} row {row} is not the document its "
                    "states were cached for (another dataset under the same model?); start a "
                    "new run, or set cache_encoder_states: false"
                )
            found.append(state)
        states = torch.zeros(len(rows), width, model.config.d_model, dtype=found[0].dtype)
        for i, state in enumerate(found):
            states[i, : lengths[i]] = state
        return states.to(batch["input_ids"].device)

    def logits_function(
        self, model: DocumentClassifier, splits: tuple[str, ...] = ("val", "test")
    ) -> CachedLogits:
        """The logits of documents of ``splits`` found here by their token ids, for ``model``,
        the one whose held blocks computed the states (:class:`CachedLogits`)."""
        found = {
            tuple(self.states[key][0].tolist()): self.states[key][1]
            for key in self.exact
            if key[0] in splits
        }
        return CachedLogits(found, self.blocks, model)

    def _compute(
        self, model: DocumentClassifier, documents: list[torch.Tensor], device
    ) -> list[torch.Tensor]:
        """Each document's ``[T,D]`` states, on the CPU, computed in one padded batch."""
        input_ids, mask = pad_token_ids([d.tolist() for d in documents], model.config.pad_id)
        # Each submodule's own mode, restored after: a held block in eval mode stays so.
        modes = [(module, module.training) for module in model.modules()]
        model.eval()  # no dropout: the cached states are the encoder's, not a noisy draw
        try:
            with torch.no_grad():
                input_ids, mask = input_ids.to(device), mask.to(device)
                if self.blocks is None:
                    states = model(input_ids, mask).token_states
                else:
                    states = model.lower_block_states(input_ids, mask, self.blocks)
        finally:
            for module, training in modes:
                module.training = training
        # Copies: a view would keep the whole padded batch alive for every document.
        return [states[i, : len(d)].to("cpu").clone() for i, d in enumerate(documents)]


class CachedLogits:
    """``(model, input_ids [B,T], attention_mask [B,T]) -> logits [B,C]`` in eval mode, for
    documents found by their token ids, not their rows: a batch whose documents all have exact
    states in the cache (float32, no autocast, no TF32) runs only the blocks above them, any other
    batch, or any other model than the one whose held blocks computed the states (a float32
    copy of bf16 weights, say), the whole model.

    The after-fit calibration reads validation and test this way, whose states validation and
    testing computed with the same held weights: BBC's two splits through MiniLM's five held
    blocks took 36 s on 2 CPU cores, from the cache 7 s (``reports/demo-fresh-clone.json``).
    The logits equal the whole model's up to padding's rounding (about 1e-7).

    Attributes:
        from_cache: documents whose logits came from cached states so far.
        whole: documents the whole model read.
    """

    def __init__(
        self,
        found: dict[tuple[int, ...], torch.Tensor],
        blocks: int | None,
        model: DocumentClassifier,
    ) -> None:
        self.found, self.blocks, self.model = found, blocks, model
        self.from_cache = self.whole = 0

    def __call__(
        self, model: DocumentClassifier, input_ids: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        lengths = mask.sum(dim=1).tolist()
        rows = [tuple(input_ids[i, :n].tolist()) for i, n in enumerate(lengths)]
        if model is not self.model or not all(row in self.found for row in rows):
            self.whole += len(rows)
            return model(input_ids, mask).logits
        self.from_cache += len(rows)
        states = torch.zeros(*input_ids.shape, model.config.d_model)
        for i, row in enumerate(rows):
            states[i, : lengths[i]] = self.found[row]
        states = states.to(input_ids.device)
        if self.blocks is None:
            return model.read_out(states, mask)[0]
        return model.classify_from_block(states, mask, self.blocks)[0]
