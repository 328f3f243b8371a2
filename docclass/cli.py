"""The ``docclass`` command: the one entry point, and the only module that wires every layer.

``fit | validate | test | predict`` are LightningCLI subcommands
(:class:`docclass.train.lightning_cli.TrainingCLI`); after testing this module adds the run's
figures and, after ``fit``, the HTML report of the test split in ``<default_root_dir>/report/``.

``report``, ``classify``, ``faithfulness`` and ``serve`` take their flags from the typed
signatures of the functions they run (jsonargparse, which LightningCLI brings): the function's
docstring is the help, its types check the values.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import logging
import os
import re
import select
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentError, ArgumentParser

from docclass.errors import UserError

# Lightning, datasets and the report's dependencies take seconds to import: classify, serve,
# export and push must start without them, so every command is imported when it runs.
# name → (module, function, its positional list parameter and that parameter's help, if any)
COMMANDS: dict[str, tuple[str, str, tuple[str, str] | None]] = {
    "report": ("docclass.inference.reporting", "report_command", None),
    "classify": (
        "docclass.inference.bulk",
        "classify_command",
        (
            "inputs",
            "files, folders (recursive), globs, '-' (stdin, one document per line), or "
            "CSV / JSONL / Parquet tables (one document per row)",
        ),
    ),  # fmt: skip
    "faithfulness": ("docclass.inference.reporting", "faithfulness_command", None),
    "calibrate": ("docclass.inference.calibration", "calibrate_command", None),
    "audit": ("docclass.inference.audit", "audit_command", None),
    "serve": ("docclass.inference.serve", "serve", None),
    "export": ("docclass.inference.export", "export_command", None),
    "push": ("docclass.inference.export", "push_command", None),
}
# The Lightning subcommands' one-line help, for `docclass --help` without importing Lightning.
TRAINING_COMMANDS = {
    "fit": "train a model (then test it and write the report of its test split)",
    "validate": "score a checkpoint on the validation split",
    "test": "score a checkpoint on the test split (metrics.json and figures; in its run's "
    "folder, metrics.<checkpoint>.json and confusion_matrix.<checkpoint>.png)",
    "predict": "write predictions of a checkpoint for a split",
}
# Commands that read datasets (whose progress bars would flood a log).
READS_DATASETS = {"report", "faithfulness", "calibrate", "audit", *TRAINING_COMMANDS}


def command_function(name: str) -> Callable[..., Any]:
    module, function, _ = COMMANDS[name]
    return getattr(importlib.import_module(module), function)


def command_summary(name: str) -> str:
    """The first line of a command function's docstring, read from its source, not imported."""
    module, function, _ = COMMANDS[name]
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    text = " ".join((ast.get_docstring(node) or "").split("\n\n")[0].split())
    sentence = re.split(r"(?<=\.)\s", text)[0]
    return sentence if len(sentence) <= 100 else sentence[:99] + "…"


def __getattr__(name: str) -> Any:
    # The training CLI subclasses Lightning's: built on first use (PEP 562), so importing this
    # module stays free of Lightning.
    if name == "DocClassCLI":
        return doc_class_cli()
    raise AttributeError(f"module 'docclass.cli' has no attribute {name!r}")


def _metrics_written(trainer: Any) -> Path | None:
    """The metrics file the trainer's last test wrote (``metrics.json``, or
    ``metrics.<checkpoint>.json`` in a run's folder), if there is one."""
    written = next((c.written for c in trainer.callbacks if getattr(c, "written", None)), None)
    return written if written is not None and written.is_file() else None


@functools.cache
def doc_class_cli() -> type:
    from docclass.artifacts.load import TrainedClassifier
    from docclass.inference.reporting import documents_from_datamodule, make_report
    from docclass.report.figures import write_run_figures
    from docclass.train.callbacks import PredictionWriter
    from docclass.train.lightning_cli import TrainingCLI

    class DocClassCLI(TrainingCLI):
        """:class:`TrainingCLI` plus what the upper layers add: figures after testing, and the
        report of the test split after ``fit``."""

        def after_test(self) -> None:
            # The figures of the scores just written: testing best.ckpt in its run's folder
            # redrew the fit's confusion matrix, of other weights.
            if self.trainer.is_global_zero and (written := _metrics_written(self.trainer)):
                write_run_figures(self.trainer.default_root_dir, written.name)

        def after_fit(self) -> None:
            super().after_fit()
            tested = self.config.fit.get("test_after_fit") and not self.trainer.interrupted
            if not (tested and self.trainer.is_global_zero):
                return
            run_dir = Path(self.trainer.default_root_dir)
            classifier = TrainedClassifier(
                model=self.model.model,
                tokenizer=self.datamodule.tokenizer,
                label_names=list(self.datamodule.label_names),
                max_tokens=self.datamodule.max_tokens,
            )
            # Where training ran: Lightning's teardown after testing moved the module to the
            # CPU, and a GPU run's calibration and report (explaining every test document
            # through every block) then ran there, many times slower.
            device = str(self.trainer.strategy.root_device)
            if self.config.fit.get("calibrate_after_fit", True):
                self._calibrate(classifier, run_dir, device)
            if not self.config.fit.get("report_after_fit"):
                return
            summary = make_report(
                classifier,
                documents_from_datamodule(self.datamodule, "test"),
                run_dir / "report",
                run_dir=run_dir,
                title=f"docclass report · {run_dir.name}",
                device=device,
                max_documents=self.config.fit.get("report_max_documents"),
                faithfulness_documents=self.config.fit.get("report_faithfulness_documents"),
            )
            print(f"report: {summary['documents']} documents → {summary['index']}")

        def _calibrate(self, classifier, run_dir: Path, device: str) -> None:
            calibrate_after_fit(self.model, self.datamodule, classifier, run_dir, device)

        def before_predict(self) -> None:
            # predictions.jsonl's probabilities, calibrated as classify's and serve's are.
            for callback in self.trainer.callbacks:
                if isinstance(callback, PredictionWriter):
                    callback.temperature_of = predicted_weights_temperature

    return DocClassCLI


def predicted_weights_temperature(module, ckpt_path: str | None) -> float | None:
    """The temperature the checkpoint's run fitted on these weights, None if it fitted none."""
    from docclass.artifacts.hashing import weights_fingerprint
    from docclass.inference.model_facts import fitted_temperature, run_calibration, run_dir_of

    if not ckpt_path:
        return None
    fingerprint = functools.partial(weights_fingerprint, module.model.state_dict())
    # Raw, as /info says, where none fitted.
    return fitted_temperature(run_calibration(run_dir_of(ckpt_path), fingerprint))


def calibrate_after_fit(module, datamodule, classifier, run_dir: Path, device: str) -> None:
    """The tested weights' temperature, fitted on the validation split."""
    from docclass.inference.calibration import calibrate, summary_line, write_calibration
    from docclass.inference.reporting import documents_from_datamodule

    splits = getattr(datamodule, "splits", None) or {}
    if not (splits.get("val") and splits.get("test")):
        print("calibration: no validation or test split held in memory; skipped")
        return
    # With held blocks cached, validation and testing have already run them over both splits
    # in float32: only the blocks above run again.
    cache = getattr(module, "encoder_cache", None)
    logits_of = cache.logits_function(module.model) if cache is not None else None
    facts = calibrate(
        classifier,
        documents_from_datamodule(datamodule, "val"),
        documents_from_datamodule(datamodule, "test"),
        device,
        logits_of=logits_of,
    )
    if logits_of is not None:
        read = logits_of.from_cache + logits_of.whole
        print(
            f"calibration: {logits_of.from_cache} of {read} documents read from the held "
            "blocks' cached states"
        )
    print(f"calibration: {summary_line(facts)} → {write_calibration(run_dir, facts)}")


def command_parser(name: str) -> ArgumentParser:
    """The parser of a non-Lightning command, built from its function's signature."""
    _, _, positional = COMMANDS[name]
    function = command_function(name)
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
    return command_function(name)(**command_parser(name).parse_args(argv).as_dict())


def print_help() -> None:
    """The command list: Lightning's own help (``docclass fit --help``) imports Lightning, this
    one does not."""
    print("usage: docclass COMMAND [options]   (docclass COMMAND --help for its options)\n")
    for name, summary in TRAINING_COMMANDS.items():
        print(f"  {name:13s} {summary}")
    for name in COMMANDS:
        print(f"  {name:13s} {command_summary(name)}")


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``docclass`` console script."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # Batches are tokenized ahead of time and collate is trivial: workers only add start-up cost.
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    argv = sys.argv[1:] if args is None else list(args)
    try:
        if argv[:1] and argv[0] in READS_DATASETS:
            import datasets

            datasets.disable_progress_bars()
        if argv[:1] and argv[0] in COMMANDS:
            run_command(argv[0], argv[1:])
            return
        if argv[:1] in (["-h"], ["--help"]):
            print_help()
            return
        from docclass.train.lightning_cli import training_cli

        training_cli(args=args, cli_class=doc_class_cli())
    except UserError as error:
        print(f"docclass: error: {error}", file=sys.stderr)
        sys.exit(2)
    except ArgumentError as error:
        message = " ".join(str(error).split())
        known = (*TRAINING_COMMANDS, *COMMANDS)
        command = f"docclass {argv[0]}" if argv[:1] and argv[0] in known else "docclass"
        print(f"docclass: error: {message} (see '{command} --help')", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        # Ctrl+C is the user's own stop, not a fault to show as a traceback; what a command
        # leaves behind it says itself (classify removes its partial file, a fit its last
        # checkpoint to resume from). 130: a shell's status for a run ended by SIGINT.
        print("docclass: interrupted (Ctrl+C); nothing more was written", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # another pipe (a worker's, a socket): a real failure, not to be hidden
        # The reader of standard output left (`docclass classify ... | head`): stop quietly, as
        # a pipeline expects, instead of a traceback. Output still buffered goes nowhere, and
        # Python's exit does not raise the same error again flushing it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


def _stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reading end has closed (poll reports an error
    on the writing end then)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll here, or stdout has no descriptor
        return False


if __name__ == "__main__":
    main()
