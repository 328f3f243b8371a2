"""The ``docclass`` command: the one entry point, and the only module that wires every layer.

``fit | validate | test | predict`` are LightningCLI subcommands
(:class:`docclass.train.lightning_cli.TrainingCLI`); after testing this module adds the run's
figures and, after ``fit``, the HTML report of the test split in ``<default_root_dir>/report/``.

``report``, ``classify``, ``faithfulness`` and ``serve`` take their flags from the typed
signatures of the functions they run (jsonargparse, which LightningCLI brings): the function's
docstring is the help, its types check the values.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
from jsonargparse import ArgumentError, ArgumentParser

from docclass.errors import UserError
from docclass.inference.classify import classify_command
from docclass.inference.export import export_command, push_command
from docclass.inference.reporting import (
    documents_from_datamodule,
    faithfulness_command,
    make_report,
    report_command,
)
from docclass.inference.serve import serve
from docclass.report.figures import write_run_figures
from docclass.train.checkpoint import TrainedClassifier
from docclass.train.lightning_cli import LIGHTNING_SUBCOMMANDS, TrainingCLI, training_cli

# name → (function, its positional list parameter and that parameter's help, if any)
COMMANDS: dict[str, tuple[Callable[..., Any], tuple[str, str] | None]] = {
    "report": (report_command, None),
    "classify": (
        classify_command,
        (
            "inputs",
            "files, folders (recursive), globs, '-' (stdin, one document per line), or "
            "CSV / JSONL / Parquet tables (one document per row)",
        ),
    ),  # fmt: skip
    "faithfulness": (faithfulness_command, None),
    "serve": (serve, None),
    "export": (export_command, None),
    "push": (push_command, None),
}


class DocClassCLI(TrainingCLI):
    """:class:`TrainingCLI` plus what the upper layers add: figures after testing, and the
    report of the test split after ``fit``."""

    def after_test(self) -> None:
        run_dir = Path(self.trainer.default_root_dir)
        if self.trainer.is_global_zero and (run_dir / "metrics.json").is_file():
            write_run_figures(run_dir)

    def after_fit(self) -> None:
        super().after_fit()
        tested = self.config.fit.get("test_after_fit") and not self.trainer.interrupted
        if not (tested and self.config.fit.get("report_after_fit") and self.trainer.is_global_zero):
            return
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
            max_documents=self.config.fit.get("report_max_documents"),
            faithfulness_documents=self.config.fit.get("report_faithfulness_documents"),
        )
        print(f"report: {summary['documents']} documents → {summary['index']}")


def command_parser(name: str) -> ArgumentParser:
    """The parser of a non-Lightning command, built from its function's signature."""
    function, positional = COMMANDS[name]
    summary = (function.__doc__ or "").split("\n\n")[0]
    parser = ArgumentParser(
        prog=f"docclass {name}", description=" ".join(summary.split()), exit_on_error=False
    )
    if positional:
        # A list parameter given as several words (``docclass classify a.txt b.txt``).
        parser.add_argument(positional[0], nargs="+", help=positional[1])
    skip = {positional[0]} if positional else None
    parser.add_function_arguments(function, skip=skip, as_group=False)
    return parser


def run_command(name: str, argv: list[str]) -> Any:
    """Parse ``argv`` with the command's parser and call its function."""
    function, _ = COMMANDS[name]
    return function(**command_parser(name).parse_args(argv).as_dict())


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``docclass`` console script."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    datasets.disable_progress_bars()
    # Batches are tokenized ahead of time and collate is trivial: workers only add start-up cost.
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    argv = sys.argv[1:] if args is None else list(args)
    try:
        if argv[:1] and argv[0] in COMMANDS:
            run_command(argv[0], argv[1:])
            return
        if argv[:1] in (["-h"], ["--help"]):
            # LightningCLI lists only its own subcommands; name ours before its help exits.
            for name, (function, _) in COMMANDS.items():
                first_line = (function.__doc__ or "").strip().splitlines()[0]
                print(f"docclass {name}: {first_line} (see --help)")
            print()
        training_cli(args=args, cli_class=DocClassCLI)
    except UserError as error:
        print(f"docclass: error: {error}", file=sys.stderr)
        sys.exit(2)
    except ArgumentError as error:
        message = " ".join(str(error).split())
        known = (*LIGHTNING_SUBCOMMANDS, *COMMANDS)
        command = f"docclass {argv[0]}" if argv[:1] and argv[0] in known else "docclass"
        print(f"docclass: error: {message} (see '{command} --help')", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
