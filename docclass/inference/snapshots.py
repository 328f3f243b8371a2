"""A training callback that writes report pages while the model trains.

It lives above the report layer (it renders pages), so training code never imports rendering:
configs name it by class path (``docclass.inference.snapshots.AttentionSnapshots``).
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl

from docclass.artifacts.load import TrainedClassifier
from docclass.inference.reporting import documents_from_datamodule, make_report


class AttentionSnapshots(pl.Callback):
    """Writes report pages for a few fixed validation documents every ``every_n_epochs``.

    Open ``<run>/attention/epoch_NNN/index.html`` from successive epochs to watch where the
    model's attention settles while it trains.

    Args:
        every_n_epochs: write after every this many validation epochs.
        n_documents: how many validation documents (the first ones of the split: the same
            documents every time).
        dirname: folder under the run's ``default_root_dir``.
    """

    def __init__(
        self, every_n_epochs: int = 1, n_documents: int = 4, dirname: str = "attention"
    ) -> None:
        if every_n_epochs < 1 or n_documents < 1:
            raise ValueError("every_n_epochs and n_documents must be positive")
        self.every_n_epochs = every_n_epochs
        self.n_documents = n_documents
        self.dirname = dirname

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch = trainer.current_epoch
        # Validation passes of a fit alone: the one at the fit's end (weights no pass saw)
        # is not an epoch's, and would be filed as the next epoch's pages.
        fitting = trainer.state.fn == "fit"
        if trainer.sanity_checking or not trainer.is_global_zero or not fitting:
            return
        if (epoch + 1) % self.every_n_epochs:
            return
        datamodule = trainer.datamodule
        documents = documents_from_datamodule(datamodule, "val")
        classifier = TrainedClassifier(
            model=pl_module.model,
            tokenizer=datamodule.tokenizer,
            label_names=list(datamodule.label_names),
            max_tokens=datamodule.max_tokens,
        )
        was_training = pl_module.model.training
        out_dir = Path(trainer.default_root_dir) / self.dirname / f"epoch_{epoch:03d}"
        try:
            make_report(
                classifier,
                documents,
                out_dir,
                title=f"attention after epoch {epoch}",
                limit=self.n_documents,
                device=str(pl_module.device),
                # Snapshots show how attention settles; faithfulness is the final report's job.
                faithfulness=False,
            )
        finally:
            pl_module.model.train(was_training)
