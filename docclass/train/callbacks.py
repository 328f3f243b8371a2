"""Lightning callbacks that write a run's outputs (metrics, split, predictions) and keep a run
resumable (random state) and honest (stop on a non-finite loss).

Figures are drawn from ``metrics.json`` by the report layer (:func:`docclass.report.figures.
write_run_figures`), which the command line calls after testing: training code never renders.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.loggers import CSVLogger

from docclass.artifacts.hashing import weights_fingerprint
from docclass.data.streaming import process_rank
from docclass.errors import ConfigError, TrainingDiverged
from docclass.files import write_atomically
from docclass.metrics import classification_scores

log = logging.getLogger(__name__)


def machine_summary() -> dict[str, Any]:
    """Where the figures were measured."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def gather_by_document(indices: torch.Tensor, *columns: torch.Tensor) -> list[np.ndarray]:
    """Every rank's rows, once per document, in document order (the local rows without DDP).

    Under DDP each rank evaluates its own batches, and a split of fewer documents than ranks
    repeats some so that every rank steps: metrics from one rank, or from all rows, would be wrong.
    """
    local = [indices.numpy(), *(column.numpy() for column in columns)]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, local)
        local = [np.concatenate(parts) for parts in zip(*gathered, strict=True)]
    _, first = np.unique(local[0], return_index=True)
    return [column[first] for column in local[1:]]


class RandomState(pl.Callback):
    """Saves the random generators' state with every checkpoint and restores it on resume.

    Lightning checkpoints weights, optimiser, scheduler and loop counters but not the global
    torch generator that dropout and word dropout draw from; without it a resumed run takes
    different random decisions from the run it continues. Saved as tensors and lists, so
    ``torch.load(weights_only=True)`` still reads the checkpoint.

    A checkpoint written mid-epoch gets its state set again when training starts: resuming
    creates the training loader's iterator once more, and that draws a seed from the global
    generator which the uninterrupted run drew before the checkpoint was written.
    """

    def __init__(self) -> None:
        self._state: dict[str, Any] | None = None
        self._set_again_at_train_start = False
        self._at_batch_start: tuple | None = None
        self._batches: Any = None  # the fit loop's batch counters, while a fit runs

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # SLURM's requeue signal saves a checkpoint inside a step, after its dropout draws; the
        # resumed run does that step again, and must draw what it drew the first time.
        # Captured as the generators give it, every step; made savable only when saved.
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self._at_batch_start = (torch.get_rng_state(), random.getstate(), cuda)
        self._batches = trainer.fit_loop.epoch_loop.batch_progress.current

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._at_batch_start = None

    def state_dict(self) -> dict[str, Any]:
        # Only while the step is not yet counted as processed: from then on a resume goes on
        # with the next batch, which draws on from the state now.
        batches = self._batches
        inside_step = batches is not None and batches.processed < batches.started
        at_start = self._at_batch_start if inside_step else None
        state = _saved_generators(*at_start) if at_start else _generator_state()
        rank, world = process_rank()
        if world > 1:
            # Every rank builds the checkpoint, only rank 0 writes it: without gathering, every
            # rank would resume with rank 0's generators.
            gathered: list[Any] = [None] * world
            torch.distributed.all_gather_object(gathered, state)
            return {"ranks": gathered}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "ranks" in state_dict:
            rank, _ = process_rank()
            ranks = state_dict["ranks"]
            # Resumed with fewer or more processes than it was saved with: no state is "own";
            # rank 0's keeps the run reproducible for the ranks that existed.
            state_dict = ranks[rank] if rank < len(ranks) else ranks[0]
        self._state = state_dict
        _set_generators(state_dict)

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        progress = checkpoint.get("loops", {}).get("fit_loop", {})
        batches = progress.get("epoch_loop.batch_progress", {})
        self._set_again_at_train_start = bool(
            batches.get("current", {}).get("processed") and not batches.get("is_last_batch")
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._set_again_at_train_start and self._state is not None:
            _set_generators(self._state)
        self._set_again_at_train_start = False


class EpochEndResume(pl.Callback):
    """Makes a run with ``trainer.max_steps`` resume from an epoch-end checkpoint into the next
    epoch, as a run without it does.

    Lightning 2.6 treats every restart of a step-limited run as a restart inside an epoch.
    From a checkpoint written at an epoch's end (the epoch counted as processed, not yet as
    completed, its last batch done) it then finishes that epoch a second time: the epoch
    counter moves on by one with no batch trained. With ``--trainer.max_epochs 2`` the
    resumed run stopped at once, "max_epochs=2 reached", after one epoch of training. Such a
    checkpoint is marked here as of a completed epoch whose batches are all behind it, which
    is the state Lightning starts the next epoch from; the weights and batches then match an
    uninterrupted run's. Checkpoints written inside an epoch resume rightly and are left alone.
    """

    def __init__(self) -> None:
        self._marked = False

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        fit = checkpoint.get("loops", {}).get("fit_loop")
        if trainer.max_steps == -1 or not fit:
            return
        epochs, batches = fit["epoch_progress"], fit["epoch_loop.batch_progress"]
        total = epochs["total"]
        at_epoch_end = (
            total["ready"] == total["started"] == total["processed"] == total["completed"] + 1
        )
        if not (at_epoch_end and batches["is_last_batch"]):
            return
        for counters in (epochs["total"], epochs["current"]):
            counters["completed"] = counters["processed"]
        # The per-epoch counters of the next epoch start at zero; the totals carry on.
        optimizer = fit["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]
        for counters in (
            batches["current"],
            fit["epoch_loop.scheduler_progress"]["current"],
            optimizer["step"]["current"],
            optimizer["zero_grad"]["current"],
        ):
            counters.update(dict.fromkeys(counters, 0))
        batches["is_last_batch"] = False
        self._marked = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._marked:
            # The next epoch starts whole, as without max_steps: left "restarting", the epoch
            # loop counts one step more for the logger, and every figure it logs after the
            # resume sits one step later than the uninterrupted run's.
            trainer.fit_loop.epoch_loop.restarting = False
        self._marked = False


def _generator_state() -> dict[str, Any]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return _saved_generators(torch.get_rng_state(), random.getstate(), cuda)


def _saved_generators(torch_state: Any, python_state: tuple, cuda: Any) -> dict[str, Any]:
    """The generators' states as a checkpoint keeps them (``weights_only`` reads lists)."""
    version, internal, gauss = python_state
    state: dict[str, Any] = {"torch": torch_state, "python": [version, list(internal), gauss]}
    if cuda is not None:
        state["cuda"] = cuda
    return state


def _set_generators(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


class StopOnNonFiniteLoss(pl.Callback):
    """Stops training at the first NaN or infinite training loss, before it reaches a checkpoint.

    Checkpoints are written at epoch ends, so the last one on disk predates the fault; the
    error names it. The command line prints the message as one line and exits 2.
    """

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None or bool(torch.isfinite(loss).all()):
            return
        last = Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"
        kept = f"the last good checkpoint is {last}" if last.exists() else "no checkpoint yet"
        raise TrainingDiverged(
            f"training loss became {float(loss)} at epoch {trainer.current_epoch}, step "
            f"{trainer.global_step}: stopped ({kept}); lower model.lr or check the data"
        )


class TrainingTokenBudget(pl.Callback):
    """Sets the number of epochs from the corpus: enough to feed the model ``tokens`` training
    tokens, at least ``trainer.min_epochs`` and at most ``trainer.max_epochs``.

    A fixed epoch count tuned on one corpus gives a corpus of fewer or shorter documents far
    less training; a token budget gives every corpus about the same training time. Applied at
    ``setup``, after the training split is tokenized and before the learning-rate schedule is
    planned from the trainer's epoch count.
    """

    def __init__(self, tokens: int) -> None:
        if tokens < 1:
            raise ConfigError(f"train_tokens is {tokens}; give a positive number of tokens")
        self.tokens = tokens
        self.plan: dict[str, int] = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.max_steps != -1:
            raise ConfigError(
                f"train_tokens and trainer.max_steps ({trainer.max_steps}) both set the length "
                "of training; set one of them"
            )
        per_epoch = trainer.datamodule.training_tokens() if trainer.datamodule else None
        if not per_epoch:
            log.warning(
                "train_tokens: the training set's size is not known (streamed); training for "
                "trainer.max_epochs = %s",
                trainer.max_epochs,
            )
            return
        cap = trainer.max_epochs if trainer.max_epochs not in (None, -1) else math.inf
        floor = trainer.min_epochs or 1
        if floor > cap:
            raise ConfigError(
                f"trainer.min_epochs ({floor}) is above trainer.max_epochs ({cap}); lower "
                "min_epochs or raise max_epochs"
            )
        epochs = int(max(floor, min(cap, math.ceil(self.tokens / per_epoch))))
        trainer.fit_loop.max_epochs = epochs
        self.plan = {"train_tokens": self.tokens, "tokens_per_epoch": per_epoch, "epochs": epochs}
        log.info(
            "training for %d epochs: %d tokens per epoch, budget %d tokens (train_tokens), "
            "at least %d (trainer.min_epochs), at most %s (trainer.max_epochs)",
            epochs,
            per_epoch,
            self.tokens,
            floor,
            cap,
        )


class RunReport(pl.Callback):
    """Writes ``metrics.json`` (test scores and confusion matrix, final validation figures,
    times, data statistics, the config, the machine, and where the metric log is) and
    ``split.json`` into the run folder (the trainer's ``default_root_dir``) after testing.

    Args:
        run_config: the resolved configuration, stored in ``metrics.json`` for comparison.
    """

    def __init__(self, run_config: dict | None = None) -> None:
        self.run_config = run_config or {}
        self.train_seconds: float | None = None
        # The figures of the latest validation pass, and the training step it saw: kept beside
        # the test figures only where it saw the weights tested (the fit's end makes sure).
        self.final_validation: dict[str, float] = {}
        self.validated_at_step: int | None = None
        self.written: Path | None = None  # the metrics file the last test wrote (rank 0)
        self._fit_started = 0.0
        self._test_started = 0.0
        self._preds: list[torch.Tensor] = []
        self._labels: list[torch.Tensor] = []

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fit_started = time.perf_counter()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.train_seconds = time.perf_counter() - self._fit_started

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.final_validation = {
            key.split("/", 1)[1]: float(value)
            for key, value in trainer.callback_metrics.items()
            if key.startswith("val/")
        }
        self.validated_at_step = trainer.global_step

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._preds, self._labels, self._indices = [], [], []
        self._test_started = time.perf_counter()

    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._preds.append(outputs["preds"].cpu())
        self._labels.append(outputs["labels"].cpu())
        self._indices.append(outputs["index"].cpu())

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        preds, labels = gather_by_document(
            torch.cat(self._indices), torch.cat(self._preds), torch.cat(self._labels)
        )
        if not trainer.is_global_zero:
            return
        run_dir = Path(trainer.default_root_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        label_names = list(pl_module.label_names)
        n = len(label_names)
        matrix = np.bincount(labels * n + preds, minlength=n * n).reshape(n, n)
        scores = classification_scores(matrix)
        datamodule = trainer.datamodule
        metrics = {
            "run": run_dir.name,
            "test": {
                **scores,
                "confusion_matrix": matrix.tolist(),
                "label_names": label_names,
                # Which weights were tested: a run keeps several checkpoints, and these scores
                # belong to one of them (export and the API compare it with theirs).
                "weights": weights_fingerprint(pl_module.model.state_dict()),
            },
            "val": self.final_validation,
            "train_time_s": self.train_seconds,
            "test_time_s": time.perf_counter() - self._test_started,
            "epochs_trained": trainer.current_epoch,
            "global_steps": trainer.global_step,
            "token_budget": next(
                (c.plan for c in trainer.callbacks if isinstance(c, TrainingTokenBudget)), None
            ),
            "data": dict(getattr(datamodule, "stats", {})),
            "config": self.run_config,
            # What this process's training steps computed in ("bfloat16 autocast", "float32"),
            # model.cpu_train_precision's "auto" and trainer.precision alike; None: no fit here.
            # A resumed fit adds its checkpoint's ("bfloat16 autocast, then float32 after
            # resuming").
            "training_steps_precision": getattr(pl_module, "training_steps_precision", None),
            # What these test (and the validation) figures computed in: Lightning's precision
            # ("bf16-mixed" is autocast), while classify, serve and the report run float32.
            "evaluation_precision": str(trainer.precision),
            "machine": machine_summary(),
        }
        metric_log = self._metric_log(trainer)
        metrics["metric_log"] = str(metric_log) if metric_log else None
        path = run_dir / "metrics.json"
        if self.train_seconds is None and _written_by_a_fit(path):
            # `docclass test` of a checkpoint in its run's folder: the fit's metrics.json (its
            # training record, its tested weights' scores) and split.json stay whole.
            path = run_dir / f"metrics.{Path(trainer.ckpt_path or 'test').stem}.json"
        elif datamodule is not None and hasattr(datamodule, "write_split"):
            datamodule.write_split(run_dir / "split.json")
        # metrics.json last and whole: its presence says the run finished (docclass audit and
        # the benchmarks reuse such runs), so a kill must leave it absent, never half-written.
        write_atomically(path, json.dumps(metrics, indent=2, default=str))
        self.written = path
        print(
            f"test accuracy {scores['accuracy']:.4f}  macro-F1 {scores['macro_f1']:.4f}  "
            f"({scores['n_documents']} documents)  → {path}"
        )

    @staticmethod
    def _metric_log(trainer: pl.Trainer) -> Path | None:
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):
                # Flush first: the logger buffers rows until its save interval.
                logger.save()
                path = Path(logger.log_dir) / "metrics.csv"
                if path.is_file():
                    return path
        return None


def _written_by_a_fit(path: Path) -> bool:
    """Whether ``path`` is a ``metrics.json`` that a fit wrote (it trained some steps)."""
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")).get("global_steps"))
    except (OSError, ValueError):
        return False


class PredictionWriter(BasePredictionWriter):
    """Writes one JSON line per document of the predicted split, as batches finish.

    ``score`` and ``probs`` are calibrated where ``temperature_of`` (set by the command line,
    which knows where calibrations are kept) finds a temperature for the predicted weights;
    ``temperature`` says which, and ``raw_probs`` keeps the softmax. A threshold chosen on
    calibrated probabilities selected other rows on raw ones.

    Args:
        path: output file; relative paths are inside the run folder.
    """

    def __init__(self, path: str = "predictions.jsonl") -> None:
        super().__init__(write_interval="batch")
        self.path = path
        self._handle = None
        # (module, checkpoint path) -> the temperature fitted on these weights, or None.
        self.temperature_of: Callable[[pl.LightningModule, str | None], float | None] | None = None
        self.temperature: float | None = None

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        path = Path(self.path)
        if not path.is_absolute():
            path = Path(trainer.default_root_dir) / path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.resolved_path = path
        # The checkpoint's weights are in the module by now.
        self.temperature = (
            self.temperature_of(pl_module, trainer.ckpt_path) if self.temperature_of else None
        )
        if trainer.is_global_zero:
            # An earlier run's file must not outlive a predict that fails before its merge.
            path.unlink(missing_ok=True)
        # Each rank predicts its own shard into its own file; rank 0 merges them at the end,
        # in split order. One process too: its batches come in length order, and the file's
        # order differed between one process and several.
        self._handle = self._rank_path(path, trainer.global_rank).open("w", encoding="utf-8")

    @staticmethod
    def _rank_path(path: Path, rank: int) -> Path:
        return path.with_name(f"{path.name}.rank{rank}")

    def write_on_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        datamodule = trainer.datamodule
        split = datamodule.splits[datamodule.predict_split]
        names = pl_module.label_names
        indices = prediction["index"].tolist()
        rows = split.select(indices)
        raw = prediction["logits"].softmax(-1)
        calibrated = (prediction["logits"] / (self.temperature or 1.0)).softmax(-1)
        for index, row, probs, raw_probs, truncated in zip(
            indices,
            rows,
            calibrated.tolist(),
            raw.tolist(),
            prediction["truncated"].tolist(),
            strict=True,
        ):
            best = int(np.argmax(probs))
            record = {
                "id": row["id"],
                "label": names[best],
                "score": probs[best],
                "probs": dict(zip(names, probs, strict=True)),
                "temperature": self.temperature,
                "true_label": names[row["label"]],
                "truncated": truncated,
            }
            if self.temperature is not None:
                record["raw_probs"] = dict(zip(names, raw_probs, strict=True))
            record["_index"] = index
            self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._handle is not None:
            self._handle.close()
            trainer.strategy.barrier("predictions written")
            if trainer.is_global_zero:
                self._merge_shards(trainer.world_size)
            trainer.strategy.barrier("predictions merged")
            if not trainer.is_global_zero:
                return
            log.info("predictions written to %s", self.resolved_path)
            print(f"predictions → {self.resolved_path}")

    def _merge_shards(self, world_size: int) -> None:
        """One file in split order; repeated documents appear once."""
        by_index: dict[int, dict] = {}
        shards = [self._rank_path(self.resolved_path, rank) for rank in range(world_size)]
        for shard in shards:
            with shard.open(encoding="utf-8") as handle:
                for line in handle:
                    record = json.loads(line)
                    by_index.setdefault(record.pop("_index"), record)
        partial = self.resolved_path.with_name(f".{self.resolved_path.name}.partial")
        with partial.open("w", encoding="utf-8") as handle:
            for index in sorted(by_index):
                handle.write(json.dumps(by_index[index], ensure_ascii=False) + "\n")
        os.replace(partial, self.resolved_path)  # whole or absent, never half
        for shard in shards:
            shard.unlink()
