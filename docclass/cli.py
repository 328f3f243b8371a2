"""The ``docclass`` command.

LightningCLI subcommands ``fit``, ``validate``, ``test``, ``predict``: every run writes into its
trainer's ``default_root_dir`` (``reports/<run-name>/`` in the shipped configs):
``checkpoints/``, CSV and TensorBoard logs, and after testing ``metrics.json``,
``confusion_matrix.png``, ``training_curves.png``, ``split.json`` and (after ``fit``) the HTML
report of the test split in ``report/``.

``docclass report --ckpt CKPT --data CONFIG_OR_SOURCE --out DIR`` explains documents with a
trained checkpoint and writes the standalone HTML report; ``docclass classify`` classifies
documents in bulk; ``docclass serve`` answers HTTP requests (``docclass.serve``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

import datasets
from jsonargparse import ArgumentError
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from docclass.callbacks import PredictionWriter, RandomState, RunReport, StopOnNonFiniteLoss
from docclass.checkpoint import AtomicCheckpointIO, TrainedClassifier, read_artifact
from docclass.data import DocDataModule
from docclass.errors import ConfigError, UserError
from docclass.lit_module import DocClassifierModule
from docclass.reporting import documents_from_datamodule, make_report, report_command

LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test", "predict")

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
        parser.add_argument(
            "--report_after_fit",
            type=bool,
            default=True,
            help="after testing, write the HTML word-score report of the test split to "
            "<default_root_dir>/report/",
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
                RandomState(),
                StopOnNonFiniteLoss(),
            ],
        )
        if not trainer_config.get("plugins"):
            kwargs.setdefault("plugins", [AtomicCheckpointIO()])
        if trainer_config.get("logger") in (None, True):
            kwargs["logger"] = [
                CSVLogger(run_dir, name="logs"),
                TensorBoardLogger(run_dir, name="tensorboard"),
            ]
        return super().instantiate_trainer(**kwargs)

    def after_fit(self) -> None:
        if not self.config.fit.get("test_after_fit") or self.trainer.interrupted:
            return
        # The weights in memory are the last epoch's: validation is too small to pick epochs.
        self.trainer.test(self.model, datamodule=self.datamodule, verbose=False)
        if self.config.fit.get("report_after_fit") and self.trainer.is_global_zero:
            run_dir = Path(self.trainer.default_root_dir)
            classifier = TrainedClassifier(
                model=self.model.model,
                tokenizer=self.datamodule.tokenizer,
                label_names=list(self.datamodule.label_names),
                max_tokens=self.datamodule.max_tokens,
            )
            summary = make_report(
                classifier,
                documents_from_datamodule(self.datamodule, "test"),
                run_dir / "report",
                run_dir=run_dir,
                title=f"docclass report · {run_dir.name}",
                device=str(self.model.device),
            )
            print(f"report: {summary['documents']} documents → {summary['index']}")


def report_parser() -> argparse.ArgumentParser:
    """Arguments of ``docclass report``."""
    parser = argparse.ArgumentParser(
        prog="docclass report",
        description="Explain documents with a trained checkpoint and write a standalone HTML "
        "report: index.html, one page per document, explanations.jsonl.",
    )
    parser.add_argument("--ckpt", required=True, help="checkpoint written by 'docclass fit'")
    parser.add_argument(
        "--data",
        required=True,
        help="a YAML config (its --split, split exactly as in training) or a data source: "
        "a CSV/JSONL/Parquet file, a folder of <class>/*.txt, 'bbc' or a hub dataset name",
    )
    parser.add_argument("--out", required=True, help="folder for the report (created)")
    parser.add_argument("--split", default="test", help="split to explain (default: test)")
    parser.add_argument("--text-column", default="text", help="text column of a data file")
    parser.add_argument(
        "--label-column",
        default="label",
        help="label column of a data file; 'none' for unlabelled documents",
    )
    parser.add_argument("--limit", type=int, default=None, help="explain only the first N")
    parser.add_argument("--batch-size", type=int, default=16, help="documents per forward pass")
    parser.add_argument(
        "--all-classes",
        action="store_true",
        help="also store every word's contribution to every class (pages offer each)",
    )
    parser.add_argument(
        "--faithfulness",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure each method's ERASER comprehensiveness per document (the pages' badges "
        "and the index's table); about doubles the report's time",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, …")
    return parser


def classify_parser() -> argparse.ArgumentParser:
    """Arguments of ``docclass classify``."""
    parser = argparse.ArgumentParser(
        prog="docclass classify",
        description="Classify documents in bulk: one output row per input document, in order.",
    )
    parser.add_argument("--ckpt", required=True, help="checkpoint written by 'docclass fit'")
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="files, folders (recursive), globs, '-' (stdin, one document per line), or "
        "CSV / JSONL / Parquet tables (one document per row)",
    )
    parser.add_argument("--out", help="output file: .csv for CSV, else JSON Lines (default stdout)")
    parser.add_argument("--text-column", default="text", help="text column of table inputs")
    parser.add_argument(
        "--top-words", type=int, default=0, metavar="K", help="add the K most attended words"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="documents per forward pass")
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda")
    parser.add_argument(
        "--strict", action="store_true", help="exit with status 1 if any document got an error"
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    return parser


def _classify_main(args: list[str]) -> None:
    from docclass.classify import run_classify

    options = classify_parser().parse_args(args)
    if options.batch_size < 1 or options.top_words < 0:
        raise ConfigError("--batch-size must be positive and --top-words non-negative")
    counts = run_classify(
        ckpt=options.ckpt,
        inputs=options.inputs,
        out=options.out,
        text_column=options.text_column,
        top_words=options.top_words,
        batch_size=options.batch_size,
        device=options.device,
        progress=options.progress,
    )
    print(
        f"classified {counts['documents'] - counts['errors']} of {counts['documents']} documents"
        f" ({counts['errors']} errors, {counts['warnings']} warnings, "
        f"{counts['truncated']} truncated)",
        file=sys.stderr,
    )
    if options.strict and counts["errors"]:
        sys.exit(1)


def _report_main(args: list[str]) -> None:
    options = report_parser().parse_args(args)
    summary = report_command(
        ckpt=options.ckpt,
        data=options.data,
        out=options.out,
        split=options.split,
        text_column=options.text_column,
        label_column=None if options.label_column.lower() == "none" else options.label_column,
        limit=options.limit,
        batch_size=options.batch_size,
        all_classes=options.all_classes,
        device=options.device,
        faithfulness=options.faithfulness,
    )
    print(
        f"report: {summary['documents']} documents in {summary['total_s']:.1f} s "
        f"→ {summary['index']}"
    )


def faithfulness_parser() -> argparse.ArgumentParser:
    """Arguments of ``docclass faithfulness``."""
    parser = argparse.ArgumentParser(
        prog="docclass faithfulness",
        description="ERASER comprehensiveness and sufficiency (AOPC over 1-50%% of the words) of "
        "every word-score method beside a random ranking, permuted-pool and randomised-weight "
        "sanity checks, and on a sample integrated gradients and rank agreement with "
        "leave-one-word-out; writes faithfulness.json and .png (and updates a report in --out).",
    )
    parser.add_argument("--ckpt", required=True, help="checkpoint written by 'docclass fit'")
    parser.add_argument("--data", required=True, help="a YAML config (its split) or a source")
    parser.add_argument("--out", required=True, help="folder for faithfulness.json and .png")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=None, help="only the first N documents")
    parser.add_argument(
        "--removal",
        nargs="+",
        default=["mask", "unk"],
        choices=["mask", "unk"],
        help="remove words by masking their tokens out, by replacing them with [UNK], or both",
    )
    parser.add_argument(
        "--sample",
        type=_non_negative,
        default=20,
        help="documents (a fixed random sample) for integrated gradients, leave-one-word-out "
        "and the randomised-weights check; 0 skips them",
    )
    parser.add_argument(
        "--ig-steps", type=_non_negative, default=32, help="integrated-gradients steps; 0 skips"
    )
    parser.add_argument(
        "--permutations", type=_positive, default=20, help="pool shuffles per document"
    )
    parser.add_argument("--device", default="cpu")
    return parser


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return number


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return number


def _faithfulness_main(args: list[str]) -> None:
    from docclass.faithfulness import faithfulness_command

    options = faithfulness_parser().parse_args(args)
    figures = faithfulness_command(
        options.ckpt, options.data, options.out, options.split, options.limit,
        options.removal, options.device, options.sample, options.ig_steps, options.permutations,
    )  # fmt: skip
    for removal, result in figures["removal"].items():
        print(f"removal by {removal} ({result['seconds']} s, {figures['documents']} documents):")
        table = result["aopc"]
        floor = max(table["random"]["comprehensiveness"], 1e-9)
        for name, row in sorted(table.items(), key=lambda kv: -kv[1]["comprehensiveness"]):
            print(
                f"  {name:16s} comprehensiveness {row['comprehensiveness']:.3f} "
                f"({row['comprehensiveness'] / floor:.1f}× random)  "
                f"sufficiency {row['sufficiency']:.3f}"
            )
    permuted = figures["permuted_pool"]
    print(
        f"permuted pool: median total variation {permuted['median_total_variation']}, "
        f"{100 * permuted['documents_any_label_change']:.1f} % of documents change label"
    )
    if "sample" in figures:
        sample = figures["sample"]
        stages = sample["randomised_weights"]
        last = list(stages)[-1]
        print(f"sample of {sample['documents']} documents: τ vs leave-one-out, ρ all randomised")
        for name, row in sample["kendall_tau_vs_leave_one_out"].items():
            rho = stages[last].get(name, {}).get("mean", float("nan"))
            print(f"  {name:20s} τ {row['mean']:+.2f} ± {row['std']:.2f}   ρ {rho:+.2f}")
    print(f"→ {options.out}/faithfulness.json, {options.out}/faithfulness.png")
    if "report" in figures:
        print(f"→ {figures['report']} (rendered again with these figures)")


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``docclass`` console script."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    datasets.disable_progress_bars()
    # Batches are tokenized ahead of time and collate is trivial: workers only add start-up cost.
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    argv = sys.argv[1:] if args is None else list(args)
    try:
        if argv[:1] == ["report"]:
            _report_main(argv[1:])
            return
        if argv[:1] == ["classify"]:
            _classify_main(argv[1:])
            return
        if argv[:1] == ["faithfulness"]:
            _faithfulness_main(argv[1:])
            return
        if argv[:1] == ["serve"]:
            from docclass.serve import serve_main

            serve_main(argv[1:])
            return
        if argv[:1] in (["-h"], ["--help"]):
            # LightningCLI lists only its own subcommands; name ours before its help exits.
            print("docclass report: explain documents and write the HTML report (see --help)")
            print("docclass classify: classify documents in bulk (see --help)")
            print("docclass serve: classify over HTTP on 127.0.0.1 (see --help)")
            print("docclass faithfulness: how faithful each word-score method is (see --help)\n")
        DocClassCLI(
            DocClassifierModule,
            DocDataModule,
            seed_everything_default=0,
            save_config_kwargs={"overwrite": True},
            # Parse errors come back as exceptions, so they can be said in one line below
            # instead of the full usage text followed by a two-line message.
            parser_kwargs={
                "exit_on_error": False,
                **{name: {"exit_on_error": False} for name in LIGHTNING_SUBCOMMANDS},
            },
            args=args,
        )
    except UserError as error:
        print(f"docclass: error: {error}", file=sys.stderr)
        sys.exit(2)
    except ArgumentError as error:
        message = " ".join(str(error).split())
        command = (
            f"docclass {argv[0]}" if argv[:1] and argv[0] in LIGHTNING_SUBCOMMANDS else "docclass"
        )
        print(f"docclass: error: {message} (see '{command} --help')", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
