"""The ``docclass`` command: LightningCLI subcommands ``fit``, ``validate``, ``test``, ``predict``.

Every run writes into its trainer's ``default_root_dir`` (``reports/<run-name>/`` in the
shipped configs): ``checkpoints/``, CSV and TensorBoard logs, and after testing
``metrics.json``, ``confusion_matrix.png``, ``training_curves.png`` and ``split.json``.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import datasets
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from docclass.callbacks import PredictionWriter, RunReport
from docclass.checkpoint import read_artifact
from docclass.data import DocDataModule
from docclass.errors import ConfigError, UserError
from docclass.lit_module import DocClassifierModule

# Named checkpoints Lightning resolves itself; anything else given as ckpt_path is a file.
LIGHTNING_CKPT_ALIASES = {"last", "best", "hpc", "registry"}


class DocClassCLI(LightningCLI):
    """LightningCLI with the data sizes wired into the model and the run's outputs added."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # The model's sizes come from the data (tokenizer vocabulary, label set): never typed twice.
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=True,
            help="after 'fit', evaluate the final weights on the test split and write the report",
        )

    def _subcommand_section(self, namespace):
        """A subcommand's part of a namespace; the whole of it when run without a subcommand."""
        return namespace[self.subcommand] if self.subcommand else namespace

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads the checkpoint's hyperparameters here, before any hook of ours runs;
        # check the file first so a missing or damaged one gets a one-line error.
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and ckpt_path not in LIGHTNING_CKPT_ALIASES:
            read_artifact(ckpt_path)
        super()._parse_ckpt_path()

    def before_instantiate_classes(self) -> None:
        config = self._subcommand_section(self.config)
        ckpt_path = config.get("ckpt_path")
        if ckpt_path and ckpt_path not in LIGHTNING_CKPT_ALIASES and not config.data.tokenizer_from:
            # A checkpoint's weights only make sense with its own tokenizer and label order.
            config.data.tokenizer_from = ckpt_path
        max_tokens, max_positions = config.data.max_tokens, config.model.max_positions
        if config.model.positions == "learned" and (
            max_tokens is None or max_tokens > max_positions
        ):
            # Caught here rather than at the first long batch, minutes into training.
            raise ConfigError(
                f"learned positions cover {max_positions} tokens but data.max_tokens is "
                f"{max_tokens}; set data.max_tokens <= model.max_positions or positions: sinusoidal"
            )

    def instantiate_trainer(self, **kwargs):
        trainer_config = self._subcommand_section(self.config_init)["trainer"]
        run_dir = Path(trainer_config.get("default_root_dir") or "reports/run")
        configured = trainer_config.get("callbacks") or []
        if not isinstance(configured, list):
            configured = [configured]
        run_config = self._subcommand_section(self.config).as_dict()
        kwargs.setdefault(
            "callbacks",
            [
                *configured,
                ModelCheckpoint(
                    dirpath=run_dir / "checkpoints",
                    filename="best",
                    monitor="val/acc",
                    mode="max",
                    enable_version_counter=False,
                ),
                # Lightning 2.6's save_last refreshes last.ckpt only when the monitored metric
                # improved; an unmonitored checkpoint is rewritten after every epoch instead.
                ModelCheckpoint(
                    dirpath=run_dir / "checkpoints",
                    filename="last",
                    save_top_k=1,
                    enable_version_counter=False,
                ),
                RunReport(run_config),
                PredictionWriter(),
            ],
        )
        if trainer_config.get("logger") in (None, True):
            kwargs["logger"] = [
                CSVLogger(run_dir, name="logs"),
                TensorBoardLogger(run_dir, name="tensorboard"),
            ]
        return super().instantiate_trainer(**kwargs)

    def after_fit(self) -> None:
        if self.config.fit.get("test_after_fit") and not self.trainer.interrupted:
            # The weights in memory are the last epoch's: validation is too small to pick epochs.
            self.trainer.test(self.model, datamodule=self.datamodule, verbose=False)


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``docclass`` console script."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    datasets.disable_progress_bars()
    # Batches are tokenized ahead of time and collate is trivial: workers only add start-up cost.
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    try:
        DocClassCLI(
            DocClassifierModule,
            DocDataModule,
            seed_everything_default=0,
            save_config_kwargs={"overwrite": True},
            args=args,
        )
    except UserError as error:
        print(f"docclass: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
