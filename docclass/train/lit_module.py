"""The LightningModule: loss, metrics, optimiser and schedule, and what a checkpoint carries."""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from docclass.artifacts.checkpoint import ARTIFACT_KEY, FORMAT_VERSION
from docclass.artifacts.encoders import (
    encoder_model_settings,
    encoder_state_dict,
    is_encoder_parameter,
    locate_encoder,
)
from docclass.errors import ConfigError
from docclass.nn.model import ClassifierOutput, DocumentClassifier, ModelConfig
from docclass.train.callbacks import gather_by_document
from docclass.train.encoder_cache import EncoderStateCache


def _check_training_settings(settings: Mapping[str, Any]) -> None:
    """Refuse settings that cannot train as asked, before the encoder is located or read."""
    lr, warmup_fraction = settings["lr"], settings["warmup_fraction"]
    label_smoothing, word_dropout = settings["label_smoothing"], settings["word_dropout"]
    encoder, cache = settings["encoder"], settings["cache_encoder_states"]
    _check_freeze_settings(settings)
    frozen_encoder = bool(encoder and (settings["freeze_encoder"] or settings["freeze_blocks"]))
    if lr <= 0:
        raise ConfigError(f"model.lr must be positive, got {lr}")
    _check_encoder_settings(settings)
    if not 0 <= warmup_fraction < 1:
        raise ConfigError(f"model.warmup_fraction must be in [0, 1), got {warmup_fraction}")
    if not 0 <= label_smoothing < 1:
        raise ConfigError(f"model.label_smoothing must be in [0, 1), got {label_smoothing}")
    # 32 as YAML writes it (an integer) or as a string, like Lightning's own precision.
    if str(settings["cpu_train_precision"]) not in ("32", "bf16", "auto"):
        raise ConfigError(
            "model.cpu_train_precision must be 32, bf16 or auto, got "
            f"{settings['cpu_train_precision']!r}"
        )
    if cache and not frozen_encoder:
        raise ConfigError(
            "model.cache_encoder_states needs model.encoder and model.freeze_encoder: true or "
            "model.freeze_blocks above 0 (only frozen blocks' states stay the same between "
            "epochs)"
        )
    if cache and word_dropout > 0:
        # The cached states were computed with every word in view: a word dropped above them
        # would still have shaped its neighbours below.
        raise ConfigError(
            "model.word_dropout with model.cache_encoder_states: the cached states saw every "
            "word; set model.word_dropout: 0 or model.cache_encoder_states: false"
        )


def _check_encoder_settings(settings: Mapping[str, Any]) -> None:
    """Refuse encoder settings that would train otherwise than they read: ``encoder_lr`` 0
    trained the encoder at ``lr`` (``0 or lr``), a negative one climbed the loss, and without
    ``model.encoder`` ``encoder_lr`` and ``freeze_encoder`` had nothing to act on."""
    encoder_lr = settings["encoder_lr"]
    if encoder_lr is not None and encoder_lr <= 0:
        raise ConfigError(
            f"model.encoder_lr must be positive or null (lr), got {encoder_lr}; hold the "
            "encoder with model.freeze_encoder: true instead"
        )
    if settings["weight_decay"] < 0:
        raise ConfigError(f"model.weight_decay must be 0 or more, got {settings['weight_decay']}")
    given = [name for name in ("encoder_lr", "freeze_encoder") if settings[name]]
    if given and not settings["encoder"]:
        raise ConfigError(
            f"model.{given[0]} applies to a pre-trained encoder: set model.encoder, or drop it"
        )


def native_cpu_bf16() -> bool:
    """Whether this CPU computes bf16 dot products in hardware (x86's AVX512-BF16 or AMX).
    Without them bf16 is emulated, and slower than float32 (torch exposes the probes privately:
    a torch without them, or another architecture, counts as no)."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def _stage_metrics(num_classes: int) -> torch.nn.ModuleDict:
    # Computed once per epoch, on every rank, from the split's rows gathered once per document
    # (DocClassifierModule._log_once_per_document): syncing them again would count each rank's
    # figures twice.
    return torch.nn.ModuleDict(
        {
            f"{stage}_{name}": metric(
                num_classes=num_classes, average=average, sync_on_compute=False
            )
            for stage in ("val", "test")
            for name, metric, average in (
                ("acc", MulticlassAccuracy, "micro"),
                # Over the classes in labels or predictions, as metrics.json's macro-F1
                # (docclass.metrics; tests/test_metrics.py holds the two together).
                ("f1", MulticlassF1Score, "macro"),
            )
        }
    )


def _check_freeze_settings(settings: Mapping[str, Any]) -> None:
    """Refuse a freeze_blocks no encoder could take, before the encoder is even located."""
    freeze_blocks = settings["freeze_blocks"]
    if not freeze_blocks:
        return
    if not settings["encoder"]:
        raise ConfigError(
            "model.freeze_blocks holds pre-trained blocks at their weights: it needs "
            "model.encoder, or set model.freeze_blocks: 0"
        )
    if freeze_blocks < 0:
        raise ConfigError(
            "model.freeze_blocks must be 1 to one less than the encoder's blocks (0: none "
            f"held), got {freeze_blocks}"
        )
    if settings["freeze_encoder"]:
        raise ConfigError(
            "model.freeze_blocks and model.freeze_encoder: set one (freeze_encoder holds every "
            "block)"
        )
    windows_overlap = settings["window_tokens"] and settings["window_overlap"]
    if settings["cache_encoder_states"] and windows_overlap:
        raise ConfigError(
            "model.cache_encoder_states with model.freeze_blocks keeps one state per token, but "
            "a token in a window overlap has one per window: set model.window_overlap: 0"
        )


def _check_frozen_blocks(settings: Mapping[str, Any], config: ModelConfig) -> None:
    """Refuse more held blocks than the encoder has, read from its config before its weights
    are loaded."""
    freeze_blocks = settings["freeze_blocks"]
    if freeze_blocks and not freeze_blocks < config.n_layers:
        raise ConfigError(
            f"model.freeze_blocks must be 1 to {config.n_layers - 1} for an encoder of "
            f"{config.n_layers} blocks (0: none held), got {freeze_blocks}; "
            "model.freeze_encoder: true holds them all"
        )


def balanced_class_weights(datamodule, power: float = 1.0) -> torch.Tensor:
    """``(n / (C · n_c))^power`` per class from the training split's labels (0 for an absent
    class): power 1 weighs every class alike, 0.5 ("sqrt") only halfway, on a log scale."""
    if datamodule is None or getattr(datamodule, "stream", None):
        raise ConfigError(
            "model.class_weights needs the training split's class counts; a streamed "
            "training set has none up front: use class_weights: none"
        )
    counts = torch.bincount(
        torch.as_tensor(datamodule.splits["train"]["label"]), minlength=datamodule.num_classes
    ).double()
    weights = (counts.sum() / (len(counts) * counts.clamp(min=1))) ** power
    return torch.where(counts > 0, weights, torch.zeros_like(weights)).float()


# class_weights: auto weighs classes (by "sqrt") only when the largest training class is at
# least this many times the smallest: Reuters R8 (108×), SMS spam (7.0×) and TREC (14.5×) are
# weighed, BBC (1.45×) is not, so a balanced corpus trains exactly as unweighted.
IMBALANCE_RATIO = 3.0
# The checkpoint's record of what its training steps computed in, read back when a fit resumes.
STEPS_PRECISION_KEY = "docclass_training_steps_precision"


def class_weighting(setting: str, datamodule) -> torch.Tensor | None:
    """The training loss's class weights for ``model.class_weights`` (None: unweighted)."""
    if setting == "none":
        return None
    if setting == "auto":
        if datamodule is None or getattr(datamodule, "stream", None):
            return None  # a stream's class counts are unknown up front: unweighted
        counts = torch.bincount(
            torch.as_tensor(datamodule.splits["train"]["label"]), minlength=datamodule.num_classes
        )
        present = counts[counts > 0]
        if present.max() < IMBALANCE_RATIO * present.min():
            return None
        setting = "sqrt"
    return balanced_class_weights(datamodule, 1.0 if setting == "balanced" else 0.5)


def _refuse_conflicts(settings: dict, fixed: dict, encoder: str) -> None:
    """A setting the encoder fixes may be left at its default or match it; any other value
    would be silently overruled, so it is refused. vocab_size must match: it is linked from the
    data's tokenizer, which must be the encoder's."""
    defaults = inspect.signature(DocClassifierModule.__init__).parameters
    for name, value in fixed.items():
        if name not in settings:  # not an argument of ours (norm placement, epsilon, ...)
            continue
        given = settings[name]
        if name == "vocab_size" and given != value:
            raise ConfigError(
                f"model.vocab_size {given} differs from encoder {encoder!r}'s {value}: its "
                "tokenizer must be the data's (set model.encoder, not data.tokenizer_from)"
            )
        if given not in (value, defaults[name].default):
            raise ConfigError(
                f"model.{name} is {given} but encoder {encoder!r} has {value}; leave "
                f"model.{name} out (the encoder fixes it)"
            )


class DocClassifierModule(pl.LightningModule):
    """Trains :class:`~docclass.nn.model.DocumentClassifier` with AdamW, warm-up and cosine decay.

    Args:
        vocab_size: embedding rows; linked from the DataModule's tokenizer by the CLI.
        num_classes: number of labels; linked from the DataModule by the CLI.
        d_model: token vector width.
        n_heads: heads per self-attention block.
        n_layers: self-attention blocks.
        pool_heads: learned queries of the attention pool.
        pool_score: pool scoring function (dot, additive, gaussian).
        ffn_mult: feed-forward width as a multiple of d_model.
        dropout: residual and read-out dropout.
        attn_dropout: attention-weight dropout (slow on CPU when above 0).
        attention_window: 0 for full self-attention; w > 0 lets each token attend only to
            tokens at most w away (O(T·w)), for documents read whole (``data.max_tokens: null``).
        window_tokens: 0 reads each document as one sequence; w > 0 cuts it into windows of at
            most w tokens encoded separately, positions restarting in each, and one attention
            pool reads every token of every window: how a pre-trained encoder (whose positions
            cover a few hundred tokens) reads a whole document (``data.max_tokens`` is then the
            document's limit).
        window_overlap: tokens shared by consecutive windows (at most half a window); a
            shared token is read by the pool from the window where it has more context.
        embed_dropout: dropout on embedded tokens.
        word_dropout: fraction of tokens hidden from the model during training.
        positions: sinusoidal, learned or none.
        max_positions: longest sequence a learned position table covers.
        lr: peak learning rate.
        weight_decay: AdamW decoupled weight decay on weight matrices and embeddings.
        warmup_fraction: share of all steps spent warming the learning rate up from 0.
        label_smoothing: cross-entropy label smoothing.
        class_weights: "balanced" weighs each class's training loss by the inverse of its
            share of the training split (n / (C · n_c)), so rare classes count as much as common
            ones; "sqrt" by its square root (a class 25 times rarer weighs 5 times more, not
            25: the rarest classes do not swamp the loss); "auto" is "sqrt" when the largest
            class has at least 3 times the documents of the smallest, else "none"; "none" weighs
            every document alike. Validation and test losses stay unweighted.
        compile: ``torch.compile`` the network when the trainer sets the model up (GPUs; with
            ``data.pad_to_multiple`` to bound recompiles).
        encoder: start from a pre-trained BERT-family encoder (a folder with config.json,
            model.safetensors, tokenizer.json, or a hub id; ``minilm`` for
            sentence-transformers/all-MiniLM-L6-v2). It fixes the width, heads, blocks and
            positions (set to anything else, those arguments are refused), and its tokenizer
            replaces the trained one; the attention pool and read-out start fresh.
        encoder_lr: peak learning rate of the pre-trained part (None: ``lr``); the new pool
            and read-out use ``lr``.
        freeze_encoder: train only the pool and read-out.
        freeze_blocks: k > 0 holds the encoder's embeddings and its lowest k blocks at their
            pre-trained weights and fine-tunes the blocks above, the pool and the read-out
            (with ``cache_encoder_states`` the lowest k blocks then run once per document).
        cache_encoder_states: with a frozen encoder, compute each document's token states once
            and train the pool and read-out on them every epoch (the CPU path: an epoch then
            costs almost nothing after the first); with ``freeze_blocks``, the states the
            frozen blocks give, and every epoch runs the blocks above them.
        cpu_train_precision: on a CPU, "bf16" runs training steps (the cached states of the
            training split included) under bf16 autocast; "auto" does so where the CPU has
            native bf16 dot products (AVX512-BF16 or AMX), else leaves them as "32" does, as
            ``trainer.precision`` makes them: elsewhere bf16 is emulated and slower.
            Validation and test run as ``trainer.precision`` says (float32 by default: every
            figure is then the float32 model's, the one ``classify`` runs); calibration and
            the report always run in float32. No effect on a GPU.
    """

    def __init__(
        self,
        vocab_size: int = 20000,
        num_classes: int = 2,
        d_model: int = 128,
        n_heads: int = 4,
        n_layers: int = 1,
        pool_heads: int = 4,
        pool_score: str = "dot",
        ffn_mult: int = 4,
        dropout: float = 0.1,
        attn_dropout: float = 0.0,
        attention_window: int = 0,
        window_tokens: int = 0,
        window_overlap: int = 0,
        embed_dropout: float = 0.1,
        word_dropout: float = 0.0,
        positions: str = "sinusoidal",
        max_positions: int = 4096,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        warmup_fraction: float = 0.1,
        label_smoothing: float = 0.0,
        class_weights: Literal["none", "balanced", "sqrt", "auto"] = "none",
        compile: bool = False,
        encoder: str | None = None,
        encoder_lr: float | None = None,
        freeze_encoder: bool = False,
        cache_encoder_states: bool = False,
        freeze_blocks: int = 0,
        # The integer too, as YAML writes 32; in a Literal of its own, so that a typo's error
        # names the choices.
        cpu_train_precision: Literal["32", "bf16", "auto"] | Literal[32] = "32",
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        _check_training_settings(self.hparams)
        self._build_model(encoder, freeze_encoder)
        self._freeze_lower_blocks(freeze_blocks)
        self.metrics = _stage_metrics(num_classes)
        self.encoder_cache = (
            EncoderStateCache(freeze_blocks or None) if cache_encoder_states else None
        )
        # Per-class loss weights, computed from the training split in setup(); not saved (a
        # resumed run computes the same ones from the same split).
        self.register_buffer("loss_weights", None, persistent=False)
        self.training_steps_precision: str | None = None
        # What the steps of the run this one resumes computed in (from its checkpoint).
        self._resumed_steps_precision: str | None = None
        self._steps_precision_noted = False
        # Filled from the DataModule in setup(), written into every checkpoint.
        self.tokenizer_json: str | None = None
        self.label_names: list[str] = []
        self.max_tokens: int | None = None
        # This evaluation pass's rows on this rank, by stage: (index, loss, prediction, label)
        # per batch.
        self._rows: dict[str, list[tuple[torch.Tensor, ...]]] = {"val": [], "test": []}

    def _build_model(self, encoder: str | None, freeze_encoder: bool) -> None:
        # The model's own settings are the subset of these arguments that ModelConfig names.
        settings = {
            f.name: self.hparams[f.name] for f in fields(ModelConfig) if f.name in self.hparams
        }
        folder = locate_encoder(encoder) if encoder else None
        if folder is not None:
            fixed = encoder_model_settings(folder)
            _refuse_conflicts(settings, fixed, encoder)
            settings.update(fixed)
        self.config = ModelConfig(**settings)
        _check_frozen_blocks(self.hparams, self.config)
        self.model = DocumentClassifier(self.config)
        if folder is not None:
            self._load_encoder(folder, freeze_encoder)

    def _load_encoder(self, folder, freeze: bool) -> None:
        weights = encoder_state_dict(folder, self.config.n_layers)
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        fresh = [name for name in missing if is_encoder_parameter(name)]
        if fresh or unexpected:
            raise ConfigError(f"{folder}: encoder weights do not fit: {fresh + unexpected}")
        if freeze:
            for name, parameter in self.model.named_parameters():
                if is_encoder_parameter(name):
                    parameter.requires_grad_(False)

    def _freeze_lower_blocks(self, blocks: int) -> None:
        """The embeddings and the lowest ``blocks`` blocks keep their pre-trained weights."""
        if not blocks:
            return
        frozen = {"embed", "position_table", "embedding_norm"}
        for name, parameter in self.model.named_parameters():
            parts = name.split(".")
            if parts[0] in frozen or (parts[0] == "blocks" and int(parts[1]) < blocks):
                parameter.requires_grad_(False)

    def frozen_modules(self) -> list[torch.nn.Module]:
        """The parts that keep the encoder's weights: the embedding's dropout and the blocks
        held (every block with ``freeze_encoder``)."""
        if not self.hparams.encoder:
            return []
        if self.hparams.freeze_encoder:
            return [self.model.embed_dropout, *self.model.blocks]
        held = self.hparams.get("freeze_blocks", 0)
        return [self.model.embed_dropout, *self.model.blocks[:held]] if held else []

    def train(self, mode: bool = True) -> DocClassifierModule:
        """As ``nn.Module.train``, but frozen parts stay in eval mode: they are evaluated, never
        trained, so without dropout, exactly as the encoder cache computes them. With the cache
        and without it, a run then trains the very same model."""
        super().train(mode)
        if mode:
            self._hold_frozen_in_eval()
        return self

    def on_fit_start(self) -> None:
        if self.device.type == "cpu" and str(self.hparams.cpu_train_precision) != "32":
            bf16 = self.cpu_train_precision_used == "bf16"
            precision = (
                "bf16 autocast" if bf16 else "as trainer.precision says (no native bf16 here)"
            )
            rank_zero_info(f"model.cpu_train_precision: training steps {precision}")

    @property
    def cpu_train_precision_used(self) -> str | None:
        """What ``cpu_train_precision`` resolves to here: "bf16" or "32" on a CPU ("auto"
        resolved), None on another device. What the steps really ran in, Lightning's own
        precision included, is :attr:`training_steps_precision`."""
        if self.device.type != "cpu":
            return None
        setting = str(self.hparams.cpu_train_precision)
        return "bf16" if setting == "bf16" or (setting == "auto" and native_cpu_bf16()) else "32"

    def _note_step_precision(self) -> None:
        """Record, at the first training step, the precision it computes in: an autocast's
        dtype ("bfloat16 autocast"), else the trained weights' ("float32"). metrics.json keeps
        it; None until a step has run in this process. A resumed fit starts from its
        checkpoint's record, and names both when its own steps compute otherwise."""
        if self._steps_precision_noted:
            return
        self._steps_precision_noted = True
        device = self.device.type
        trained = [p.dtype for p in self.parameters() if p.requires_grad]
        weights = str(trained[0] if trained else torch.get_default_dtype()).removeprefix("torch.")
        if torch.is_autocast_enabled(device):
            dtype = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
            # bf16-true weights under an autocast: pure bf16, no float32 master weights.
            extra = "" if weights == "float32" else f", {weights} weights"
            now = f"{dtype} autocast{extra}"
        else:
            now = weights
        before = self._resumed_steps_precision
        if before is None or before.split(", then ")[-1].removesuffix(" after resuming") == now:
            self.training_steps_precision = before or now
        else:  # a resumed run whose steps compute otherwise: both, in the order they ran
            self.training_steps_precision = f"{before}, then {now} after resuming"

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        # Lightning does not call train() on the module: it restores each submodule's own
        # flag after validation, and other code (the snapshots, the cache) sets the inner
        # model's mode as a whole. So the held parts are put back in eval before every step.
        self._hold_frozen_in_eval()

    def _hold_frozen_in_eval(self) -> None:
        for module in self.frozen_modules():
            module.eval()

    def configure_model(self) -> None:
        # In place (nn.Module.compile): the state dict keeps its keys, so checkpoints load into
        # an uncompiled model. In one quick measurement on a 2-core CPU a compiled training step
        # ran at 0.9x eager after 45 s of compiling, so this is for GPUs; pair it with
        # data.pad_to_multiple.
        if self.hparams.compile and not getattr(self, "_compiled", False):
            self.model.compile()
            self._compiled = True

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> ClassifierOutput:
        return self.model(input_ids, attention_mask)

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None and getattr(datamodule, "tokenizer", None) is not None:
            self.tokenizer_json = datamodule.tokenizer.to_str()
            self.label_names = list(datamodule.label_names)
            self.max_tokens = datamodule.max_tokens
        if stage == "fit":
            self.loss_weights = class_weighting(self.hparams.class_weights, datamodule)
            if self.encoder_cache is not None and getattr(datamodule, "stream", None):
                # Streamed rows carry no stable row number (every one is -1), so they would all
                # share one cache slot and train on one document's states.
                raise ConfigError(
                    "model.cache_encoder_states needs a training set read whole: a streamed one "
                    "has no row numbers to cache by; set it to false, or turn data.stream off"
                )

    def _shared_step(
        self,
        batch: dict[str, torch.Tensor],
        weights: torch.Tensor | None = None,
        split: str = "train",
        reduction: str = "mean",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.encoder_cache is not None:
            states = self.encoder_cache.token_states(self.model, split, batch)
            if self.encoder_cache.blocks is None:
                logits, _ = self.model.read_out(states, batch["attention_mask"])
            else:
                logits, _ = self.model.classify_from_block(
                    states, batch["attention_mask"], self.encoder_cache.blocks
                )
        else:
            logits = self.model(batch["input_ids"], batch["attention_mask"]).logits
        loss = F.cross_entropy(
            logits.float(),
            batch["labels"],
            weight=weights,
            label_smoothing=self.hparams.label_smoothing,
            reduction=reduction,
        )
        return loss, logits

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        # Entered only for bf16: an autocast entered disabled would switch off the one
        # Lightning's bf16-mixed opened around this step.
        bf16 = self.cpu_train_precision_used == "bf16"
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            self._note_step_precision()
            loss, _ = self._shared_step(batch, self.loss_weights)
        batch_size = len(batch["labels"])
        self.log(
            "train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=batch_size
        )
        self.log(
            "train/real_tokens",
            batch["attention_mask"].sum().float(),
            reduce_fx="sum",
            on_step=False,
            on_epoch=True,
            batch_size=batch_size,
            sync_dist=True,  # every rank's tokens, not rank 0's share
        )
        return loss

    def _evaluate(self, batch: dict[str, torch.Tensor], stage: str) -> dict[str, torch.Tensor]:
        # Kept per document and logged at the epoch's end (_log_once_per_document): under DDP
        # the sampler repeats a few documents so that every rank's share is equal.
        losses, logits = self._shared_step(batch, split=stage, reduction="none")
        preds = logits.argmax(dim=-1)
        self._rows[stage].append((batch["index"], losses.detach(), preds, batch["labels"]))
        return {
            "preds": preds,
            "labels": batch["labels"],
            "probs": logits.float().softmax(-1),
            "index": batch["index"],
        }

    def on_validation_epoch_start(self) -> None:
        self._rows["val"] = []

    def on_test_epoch_start(self) -> None:
        self._rows["test"] = []

    def on_validation_epoch_end(self) -> None:
        self._log_once_per_document("val")

    def on_test_epoch_end(self) -> None:
        self._log_once_per_document("test")

    def _log_once_per_document(self, stage: str) -> None:
        """Logs ``<stage>/loss``, ``/acc`` and ``/f1`` over every document of the split once,
        the same on every rank (EarlyStopping and the checkpoints read them on each): the
        ranks' rows are gathered and the documents the batch sampler repeated are
        dropped."""
        rows, self._rows[stage] = self._rows[stage], []
        if rows:
            columns = [torch.cat(column).cpu() for column in zip(*rows, strict=True)]
        else:  # a rank with no batch still joins the gather
            dtypes = (torch.long, torch.float, torch.long, torch.long)
            columns = [torch.empty(0, dtype=dtype) for dtype in dtypes]
        losses, preds, labels = (
            torch.from_numpy(column).to(self.device) for column in gather_by_document(*columns)
        )
        if not len(labels):
            return
        # Every rank holds the same figures: "max" merely keeps them exact through Lightning's
        # sync (which it asks for when a rank logs an epoch's figure in a distributed run).
        logged = {"sync_dist": True, "reduce_fx": "max"}
        self.log(f"{stage}/loss", losses.mean(), prog_bar=True, **logged)
        for name in ("acc", "f1"):
            metric = self.metrics[f"{stage}_{name}"]  # not synced: these rows are every rank's
            metric.reset()
            metric.update(preds, labels)
            self.log(f"{stage}/{name}", metric.compute(), prog_bar=name == "acc", **logged)
            metric.reset()

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        return self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        return self._evaluate(batch, "test")

    def on_predict_start(self) -> None:
        # In float32, as the temperature was fitted and classify and serve compute: under
        # trainer.precision bf16-mixed the rows, each saying "calibrated", were up to 0.003 off
        # classify's probabilities. A bf16-true model is read through a float32 copy.
        float32 = all(parameter.dtype == torch.float32 for parameter in self.model.parameters())
        # In a tuple: a module set as an attribute would join this one's submodules.
        self._predicting = (self.model if float32 else copy.deepcopy(self.model).float(),)

    def on_predict_end(self) -> None:
        self._predicting = None

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        predicting = getattr(self, "_predicting", None)
        model = predicting[0] if predicting else self.model
        with torch.autocast(batch["input_ids"].device.type, enabled=False):
            logits = model(batch["input_ids"], batch["attention_mask"]).logits
        return {
            "logits": logits.float(),
            "index": batch["index"],
            "truncated": batch["truncated"],
        }

    def parameter_groups(self) -> list[dict]:
        """AdamW groups: pre-trained vs new parameters (their own peak rates), each split into
        decayed weight matrices and undecayed biases and LayerNorm gains (1-D: decaying them
        only fights the normalisation)."""
        encoder_lr = self.hparams.encoder_lr or self.hparams.lr
        groups: dict[tuple[bool, bool], list] = {}
        for name, parameter in self.model.named_parameters():
            if not parameter.requires_grad:
                continue
            pretrained = bool(self.hparams.encoder) and is_encoder_parameter(name)
            groups.setdefault((pretrained, parameter.ndim >= 2), []).append(parameter)
        return [
            {
                "params": params,
                "lr": encoder_lr if pretrained else self.hparams.lr,
                "weight_decay": self.hparams.weight_decay if decayed else 0.0,
            }
            for (pretrained, decayed), params in sorted(groups.items())
        ]

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameter_groups(), lr=self.hparams.lr)
        # Lightning answers max_steps (-1 unless set) for a training set without a length.
        estimated = self.trainer.estimated_stepping_batches
        if not math.isfinite(estimated) or estimated < 1:
            raise ConfigError(
                "a streamed training set without data.steps_per_epoch has no known length, so "
                "the learning-rate schedule cannot be planned: set data.steps_per_epoch or "
                "trainer.max_steps"
            )
        total = max(1, int(estimated))
        warmup = int(self.hparams.warmup_fraction * total)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def on_train_epoch_start(self) -> None:
        # Lightning sets the epoch on samplers, not on iterable datasets: a streamed training
        # set would otherwise shuffle the same way every epoch.
        dataset = getattr(self.trainer.train_dataloader, "dataset", None)
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(self.current_epoch)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Plain types only, so the file loads with torch.load(weights_only=True).
        checkpoint[ARTIFACT_KEY] = {
            "format_version": FORMAT_VERSION,
            "model_config": self.config.to_dict(),
            "tokenizer": self.tokenizer_json,
            "label_names": list(self.label_names),
            "max_tokens": self.max_tokens,
        }
        checkpoint[STEPS_PRECISION_KEY] = self.training_steps_precision

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        artifact = checkpoint.get(ARTIFACT_KEY) or {}
        # _trainer: the trainer property raises when none is attached (load_from_checkpoint).
        if self._trainer is not None and self._trainer.state.fn == "fit":
            # A resumed fit: its metrics.json names these steps too, even with none left.
            self._resumed_steps_precision = checkpoint.get(STEPS_PRECISION_KEY)
            self.training_steps_precision = self._resumed_steps_precision
        self.tokenizer_json = artifact.get("tokenizer", self.tokenizer_json)
        self.label_names = artifact.get("label_names", self.label_names)
        self.max_tokens = artifact.get("max_tokens", self.max_tokens)
