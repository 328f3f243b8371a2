"""The LightningCLI set-up of docclass training, and training configs read by its own parser.

``docclass fit | validate | test | predict`` run :class:`TrainingCLI` (through
:mod:`docclass.cli`, which adds the figures and the report after testing). Every run writes
into its trainer's ``default_root_dir``: ``checkpoints/`` (atomic writes), CSV and TensorBoard
logs, and after testing ``metrics.json``, ``split.json`` and the predictions.
"""

from __future__ import annotations

import json
import logging
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import torch.distributed as dist
from jsonargparse import ArgumentError
from jsonargparse.typing import PositiveInt
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from docclass.artifacts.encoders import encoder_model_settings, locate_encoder
from docclass.artifacts.load import read_artifact, verify_checkpoint
from docclass.data.batching import padded_length
from docclass.errors import CheckpointError, ConfigError
from docclass.files import lock_folder
from docclass.train.callbacks import (
    EpochEndResume,
    PredictionWriter,
    RandomState,
    RunReport,
    StopOnNonFiniteLoss,
    TrainingTokenBudget,
)
from docclass.train.checkpoint import AtomicCheckpointIO, LastCheckpoint, link_with_record
from docclass.train.datamodule import DocDataModule
from docclass.train.lit_module import DocClassifierModule

log = logging.getLogger(__name__)

LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test", "predict")
# Where a run writes when no trainer.default_root_dir is given.
DEFAULT_RUN_DIR = "reports/run"

# Named checkpoints Lightning resolves itself; anything else given as ckpt_path is a file.
# ("registry" is left out on purpose: Lightning would download it, unpinned. "hpc" is resolved
# here: Lightning's look reads the hash record hpc_ckpt_1.ckpt.sha256 as checkpoint 1256.)
LIGHTNING_CKPT_ALIASES = {"last", "best"}
# The checkpoints Lightning writes on SLURM's requeue signal, in the run folder.
HPC_CHECKPOINT = re.compile(r"hpc_ckpt_(\d+)\.ckpt")


class TrainingCLI(LightningCLI):
    """LightningCLI with the data sizes wired into the model and the run's outputs added.

    After ``fit`` it tests the final weights (``--test_after_fit``) and calls
    :meth:`after_test`, which the command line overrides to draw figures and write the report.
    """

    def __init__(self, *args, **kwargs) -> None:
        # The run folder this process holds while a subcommand runs (docclass.files.lock_folder);
        # LightningCLI runs the subcommand inside __init__, so the hold ends with it.
        self._run_lock: IO[str] | None = None
        try:
            super().__init__(*args, **kwargs)
        finally:
            if self._run_lock is not None:
                self._run_lock.close()

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # The model's sizes come from the data (tokenizer vocabulary, label set): never typed twice.
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        # A pre-trained encoder brings its tokenizer: set once, as model.encoder.
        parser.link_arguments("model.encoder", "data.encoder", apply_on="parse")
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=True,
            help="after 'fit', evaluate the final weights on the test split and write the report",
        )
        parser.add_argument(
            "--calibrate_after_fit",
            type=bool,
            default=True,
            help="after testing, fit the tested weights' temperature on the validation split "
            "(<default_root_dir>/calibration.json; one pass over validation and test)",
        )
        parser.add_argument(
            "--report_after_fit",
            type=bool,
            default=True,
            help="after testing, write the HTML word-score report of the test split to "
            "<default_root_dir>/report/",
        )
        parser.add_argument(
            "--report_max_documents",
            type=PositiveInt | None,  # as report's: -3 was a traceback after training
            default=1000,
            help="the after-fit report explains at most this many test documents: every "
            "misclassified one first, then a sample stratified by class (headline figures stay "
            "those of the whole split); null explains all",
        )

        parser.add_argument(
            "--report_faithfulness_documents",
            type=PositiveInt | None,  # -2 chose the default method on one document
            default=None,
            help="the after-fit report measures each method's faithfulness on a sample of this "
            "many of its documents, misclassified ones in the split's share, each part in "
            "proportion to the classes (the report says so); null measures every one",
        )
        parser.add_argument(
            "--train_tokens",
            type=int | None,
            default=None,
            help="train for as many epochs as feed the model this many tokens (after "
            "truncation), at most trainer.max_epochs: the same training time whatever the "
            "corpus's size; null trains for trainer.max_epochs",
        )
        parser.add_argument(
            "--checkpoint_every_n_steps",
            type=int | None,
            default=None,
            help="also refresh checkpoints/last.ckpt every this many training steps, so a run "
            "killed inside a long epoch resumes there (the rest of the epoch, same batches)",
        )

    def _subcommand_section(self, namespace):
        """A subcommand's part of a namespace; the whole of it when run without a subcommand."""
        return namespace[self.subcommand] if self.subcommand else namespace

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads the checkpoint's hyperparameters here, before any hook of ours runs;
        # check the file first so a missing or damaged one gets a one-line error.
        subcommand = self.config.get("subcommand")
        section = self.config[subcommand] if subcommand else None
        if section is not None and section.trainer.get("default_root_dir"):
            # Lightning expands ~ in the run folder and so found its last.ckpt, where docclass's
            # own look found none: a resume without docclass's checks, settings or tokenizer.
            root = os.path.expanduser(str(section.trainer.default_root_dir))
            section.trainer.default_root_dir = root
        ckpt_path = section.get("ckpt_path") if section is not None else None
        if ckpt_path == "hpc" or (ckpt_path is None and subcommand == "fit" and on_slurm()):
            section.ckpt_path = ckpt_path = self._hpc_checkpoint(section, ckpt_path)
        if ckpt_path in ("last", "best"):
            # Lightning's CLI reads a named file's settings but not `last`'s, so the config's
            # built another network than the weights it resumed, silently. `last` (and `best`)
            # now name this run's file, for the settings and the weights alike (Lightning's own
            # choice, the newest last*.ckpt anywhere, could be another file than the one read).
            named = self._named_checkpoint(section, ckpt_path)
            if named is None and subcommand == "fit" and ckpt_path == "last":
                return  # nothing to resume: a new run (never a stray ./last's settings)
            if named is None:
                raise CheckpointError(
                    f"--ckpt_path {ckpt_path}: {self._run_dir(section)}/checkpoints holds no "
                    f"{ckpt_path}.ckpt; give the run's --trainer.default_root_dir or the "
                    "checkpoint file"
                )
            section.ckpt_path = ckpt_path = named
        elif ckpt_path and ckpt_path not in LIGHTNING_CKPT_ALIASES:
            # Lightning reads a checkpoint's settings only from a path that is a file as
            # written: with ~ unexpanded the network was built from the config's settings while
            # the weights (expanded elsewhere) loaded into it, and scored another model.
            section.ckpt_path = ckpt_path = self._checkpoint_file(ckpt_path)
        if not ckpt_path and subcommand in ("validate", "test", "predict"):
            # Lightning then scores the network as built: random weights, plausible labels.
            raise ConfigError(
                f"docclass {subcommand} needs --ckpt_path: a checkpoint a fit wrote, or last "
                "for the run's own (without one it would score an untrained network)"
            )
        if ckpt_path and ckpt_path not in LIGHTNING_CKPT_ALIASES:
            verify_checkpoint(ckpt_path)
        given = self._given_model_settings(subcommand)
        super()._parse_ckpt_path()
        kept = self.config[subcommand].get("model") if given else None
        self._say_settings_not_used(subcommand, ckpt_path, given, kept)

    @staticmethod
    def _say_settings_not_used(subcommand: str, ckpt_path: str, given: dict, kept: Any) -> None:
        kept = kept.as_dict() if kept is not None else {}
        # Lightning's CLI replaces the model's settings with the checkpoint's, the ones given
        # on the command line too, without a word: a resumed fit trains on as it was saved.
        replaced = [
            f"{name} {value!r} (the checkpoint's: {kept.get(name)!r})"
            for name, value in given.items()
            # 32 from YAML and "32" from the command line are one setting.
            if kept and value != kept.get(name) and str(value) != str(kept.get(name))
        ]
        # Every DDP rank parses the command line; one warning is enough.
        if replaced and rank_zero_only.rank == 0 and subcommand == "fit":
            log.warning(
                "%s: a resumed fit keeps its checkpoint's model settings; not used: %s. Start "
                "a new run (without --ckpt_path) to train with them",
                ckpt_path, ", ".join(replaced),
            )  # fmt: skip
        elif replaced and rank_zero_only.rank == 0:
            log.warning(
                "%s: %s scores the network the checkpoint saved, with its model settings; "
                "not used: %s", ckpt_path, subcommand, ", ".join(replaced),
            )  # fmt: skip

    def _given_model_settings(self, subcommand: str | None) -> dict:
        """The model settings a config or a flag gave a subcommand: those differing from the
        parser's defaults (a run resumed without --config would otherwise name every built-in
        default the checkpoint's run had changed)."""
        given = (
            self.config[subcommand].get("model") if subcommand in LIGHTNING_SUBCOMMANDS else None
        )
        given = given.as_dict() if given is not None else {}
        if not given:
            return {}
        defaults = self._subcommand_parsers[subcommand].get_defaults().get("model")
        defaults = defaults.as_dict() if defaults is not None else {}
        return {name: value for name, value in given.items()
                if str(value) != str(defaults.get(name))}  # fmt: skip

    @staticmethod
    def _run_dir(section) -> Path:
        return Path(section.trainer.get("default_root_dir") or DEFAULT_RUN_DIR).expanduser()

    @classmethod
    def _named_checkpoint(cls, section, alias: str) -> str | None:
        """The file Lightning's ``last``/``best`` names in this run's folder, if it is there."""
        named = cls._run_dir(section) / "checkpoints" / f"{alias}.ckpt"
        return str(named) if named.is_file() else None

    @classmethod
    def _hpc_checkpoint(cls, section, ckpt_path: str | None) -> str | None:
        """A requeued SLURM job resumes from its newest hpc checkpoint, as Lightning's own
        choice would, but through docclass's checks, settings and tokenizer."""
        newest = cls._newest_hpc_checkpoint(section)
        if newest is None and ckpt_path == "hpc":
            raise CheckpointError(
                f"--ckpt_path hpc: {cls._run_dir(section)} holds no hpc_ckpt_N.ckpt (a SLURM "
                "job writes one when it is requeued); give last or a checkpoint file"
            )
        return newest if newest is not None else ckpt_path

    @classmethod
    def _newest_hpc_checkpoint(cls, section) -> str | None:
        run_dir = cls._run_dir(section)
        files = list(run_dir.iterdir()) if run_dir.is_dir() else []
        for record in files:
            # A record whose checkpoint is gone: Lightning's own look, when given no
            # checkpoint, would read it as checkpoint 1256 and fail to open that.
            if HPC_CHECKPOINT.fullmatch(record.name.removesuffix(".sha256")):
                if record.name.endswith(".sha256") and not record.with_suffix("").exists():
                    record.unlink(missing_ok=True)
        found = [
            (int(match[1]), path)
            for path in files
            if (match := HPC_CHECKPOINT.fullmatch(path.name)) and path.is_file()
        ]
        return str(max(found)[1]) if found else None

    @staticmethod
    def _checkpoint_file(ckpt_path: str) -> str:
        """``--ckpt_path`` as the file Lightning will read (~ expanded); a model folder or a
        hub id, which the other commands take, is refused in one line (Lightning builds the
        network from the config for anything not a file, then fails to read it)."""
        path = Path(ckpt_path).expanduser()
        if path.is_dir() or (not path.exists() and ckpt_path.startswith("hub:")):
            raise CheckpointError(
                f"{ckpt_path}: --ckpt_path takes a checkpoint file (.ckpt) a fit wrote; a model "
                "folder or hub id is for classify, report, faithfulness, serve and export"
            )
        return str(path)

    def before_instantiate_classes(self) -> None:
        config = self._subcommand_section(self.config)
        ckpt_path = config.get("ckpt_path")
        if ckpt_path in ("last", "best"):
            # Lightning finds these itself, later; the tokenizer must come from the same file.
            ckpt_path = self._named_checkpoint(config, ckpt_path)
        if ckpt_path and ckpt_path not in LIGHTNING_CKPT_ALIASES:
            self._refuse_other_inputs(config, ckpt_path)
        if ckpt_path and ckpt_path not in LIGHTNING_CKPT_ALIASES and not config.data.tokenizer_from:
            # A checkpoint's weights only make sense with its own tokenizer and label order (a
            # WordPiece tokenizer trained again can differ: tokenizers 0.23 breaks ties in hash
            # order).
            config.data.tokenizer_from = ckpt_path
        max_tokens, max_positions = config.data.max_tokens, config.model.max_positions
        positions, window = config.model.positions, config.model.window_tokens
        if config.model.encoder:
            settings = encoder_model_settings(locate_encoder(config.model.encoder))
            positions, max_positions = settings["positions"], settings["max_positions"]
        # With encoder windows the positions restart in every window: only the window must fit.
        span = window or max_tokens
        multiple = config.data.pad_to_multiple
        if positions == "learned" and span == max_tokens and span is not None and multiple >= 1:
            if span <= max_positions < padded_length(span, multiple):
                # Every column gets a position, padding too: the first full batch failed.
                raise ConfigError(
                    f"learned positions cover {max_positions} tokens but data.pad_to_multiple "
                    f"{multiple} pads batches of data.max_tokens {max_tokens} to "
                    f"{padded_length(span, multiple)}; choose a data.pad_to_multiple that "
                    f"divides {max_positions}"
                )
        if positions == "learned" and (span is None or span > max_positions):
            # Caught here rather than at the first long batch, minutes into training.
            raise ConfigError(
                f"learned positions cover {max_positions} tokens but data.max_tokens is "
                f"{max_tokens}; set model.window_tokens <= {max_positions} to read longer "
                "documents in windows, or data.max_tokens <= model.max_positions"
            )

    def _refuse_other_inputs(self, config, ckpt_path: str) -> None:
        """Refuse a ``data.tokenizer_from`` whose tokenizer or labels are not the checkpoint's
        (its weights scored, or a resumed fit trained on, another tokenizer's ids while the
        checkpoints went on naming their own), and an evaluation at another ``max_tokens``
        than the checkpoint reads at (its figures, which export puts on the model card, were
        then those of documents cut elsewhere than classify and serve cut them)."""
        artifact = read_artifact(ckpt_path)
        given = config.data.tokenizer_from
        if given and Path(given).expanduser().resolve() != Path(ckpt_path).resolve():
            other = read_artifact(Path(given).expanduser())
            # Parsed: a model folder keeps the same tokenizer pretty-printed.
            theirs = (json.loads(other["tokenizer"]), other["label_names"])
            if theirs != (json.loads(artifact["tokenizer"]), artifact["label_names"]):
                raise ConfigError(
                    f"--data.tokenizer_from {given}: its tokenizer or labels are not those of "
                    f"--ckpt_path {ckpt_path}; drop it (the checkpoint's own are read)"
                )
        # A checkpoint of no limit (None) is held to it too; one from before the key, not.
        limit = artifact.get("max_tokens")
        if (
            self.subcommand != "fit"
            and "max_tokens" in artifact
            and config.data.max_tokens != limit
        ):
            reach = "whole documents" if limit is None else f"documents up to {limit} tokens"
            raise ConfigError(
                f"data.max_tokens {config.data.max_tokens}: {ckpt_path} reads {reach}, as "
                f"classify and serve do; {self.subcommand} with "
                f"--data.max_tokens {'null' if limit is None else limit}"
            )

    def instantiate_trainer(self, **kwargs):
        trainer_config = self._subcommand_section(self.config_init)["trainer"]
        run_dir = Path(trainer_config.get("default_root_dir") or DEFAULT_RUN_DIR).expanduser()
        if not trainer_config.get("default_root_dir"):
            # Lightning's own default is the working folder: checkpoints and logs went to
            # reports/run while metrics, split, calibration and figures landed beside the user.
            kwargs.setdefault("default_root_dir", str(run_dir))
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
                LastCheckpoint(run_dir / "checkpoints"),
                *_step_checkpoints(run_dir, run_config.get("checkpoint_every_n_steps")),
                *_token_budget(run_config.get("train_tokens")),
                RunReport(run_config),
                PredictionWriter(),
                RandomState(),
                EpochEndResume(),
                StopOnNonFiniteLoss(),
            ],
        )
        # The batch sampler deals each epoch's batches to the ranks itself (data.seed orders
        # them); Lightning's distributed sampler would replace that order with its own and
        # shard every rank's share twice. Not a setting: docclass's loaders need it off.
        kwargs["use_distributed_sampler"] = False
        kwargs.setdefault("plugins", _with_checkpoint_saving(trainer_config.get("plugins")))
        if trainer_config.get("logger") in (None, True):
            kwargs["logger"] = [
                CSVLogger(run_dir, name="logs"),
                TensorBoardLogger(run_dir, name="tensorboard"),
            ]
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except MisconfigurationException as error:
            # Lightning's refusal of the trainer settings (an accelerator this machine lacks,
            # say) is the user's to fix: one line. Raised later, in training, it stays a
            # traceback: there it is a fault, not a setting.
            raise ConfigError(f"trainer settings: {' '.join(str(error).split())}") from None
        self._guard_run_files(trainer, run_dir)
        return trainer

    def _guard_run_files(self, trainer, run_dir: Path) -> None:
        """Checkpoint links that keep their hash records, and the run folder held."""
        for callback in trainer.checkpoint_callbacks:
            # Lightning calls it on the instance; only save_last="link" reaches it. A subclass
            # that links its own way keeps its way.
            if type(callback)._link_checkpoint is ModelCheckpoint._link_checkpoint:
                callback._link_checkpoint = link_with_record
        if self.subcommand in LIGHTNING_SUBCOMMANDS and trainer.global_rank == 0:
            # Once the trainer knows the ranks (whichever launcher or cluster started them) and
            # before the run writes into the folder; released when the run ends (__init__).
            self._run_lock = lock_folder(run_dir, "--trainer.default_root_dir")

    def after_fit(self) -> None:
        if self.trainer.interrupted:
            return
        if not self.config.fit.get("test_after_fit"):
            self._remove_hpc_checkpoints()
            return
        # The weights in memory are the last epoch's: validation is too small to pick epochs.
        evaluated = {"datamodule": self.datamodule, "verbose": False}
        held = None
        if on_slurm():
            # There Lightning loads the newest hpc checkpoint into the model for every stage
            # given none, and tested a requeued run's older weights. The weights in memory are
            # given a file of their own (last.ckpt may be another run's, or unwritten).
            held = Path(self.trainer.default_root_dir) / "checkpoints" / ".after-fit.ckpt"
            self.trainer.save_checkpoint(held, weights_only=True)
            evaluated["ckpt_path"] = str(held)
        report = next((c for c in self.trainer.callbacks if isinstance(c, RunReport)), None)
        try:
            if report is not None and report.validated_at_step != self.trainer.global_step:
                # The last validation pass saw older weights (check_val_every_n_epoch 2,
                # max_steps inside an epoch) or none ran (a finished run fitted again from
                # last.ckpt): metrics.json's figures of validation are of the weights tested.
                self.trainer.validate(self.model, **evaluated)
            self.trainer.test(self.model, **evaluated)
        finally:
            if held is not None:
                self.trainer.strategy.remove_checkpoint(held)
        self.after_test()
        # Once metrics.json is written: a test killed before (a deferred SIGTERM) leaves the
        # requeued job its resume point.
        self._remove_hpc_checkpoints()

    def _remove_hpc_checkpoints(self) -> None:
        """Resume points of a requeued job, older than the finished fit's weights: left, the
        next fit started into this folder on SLURM would continue from one of them."""
        for stale in sorted(Path(self.trainer.default_root_dir).glob("hpc_ckpt_*.ckpt")):
            if HPC_CHECKPOINT.fullmatch(stale.name):
                self.trainer.strategy.remove_checkpoint(stale)
                log.info("%s: removed, the fit it resumed has finished", stale)

    def after_test(self) -> None:
        """What to do once ``metrics.json`` is written; the command line draws the figures."""


def on_slurm() -> bool:
    """Whether Lightning runs this process as a SLURM task (and so resumes and evaluates from
    hpc checkpoints when given no checkpoint)."""
    return SLURMEnvironment.detect()


def _with_checkpoint_saving(plugins: Any) -> list:
    """The user's trainer plugins with docclass's checkpoint saving beside them, unless they
    bring their own CheckpointIO: any plugin at all (an environment, a precision) used to
    switch back to Lightning's own saving, with no hash record written and the old one left to
    refuse the run's newest checkpoint."""
    plugins = plugins or []
    plugins = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
    if any(isinstance(plugin, CheckpointIO) for plugin in plugins):
        return plugins
    return [*plugins, AtomicCheckpointIO()]


def _token_budget(tokens: int | None) -> list[TrainingTokenBudget]:
    return [TrainingTokenBudget(tokens)] if tokens is not None else []


def _step_checkpoints(run_dir: Path, every_n_steps: int | None) -> list[ModelCheckpoint]:
    if every_n_steps is None:
        return []
    if every_n_steps < 1:  # 0 wrote no step checkpoints, in silence
        raise ConfigError(f"checkpoint_every_n_steps is {every_n_steps}; give a positive number")
    # Lightning allows one trigger per ModelCheckpoint: a second one writes the same file.
    return [
        ModelCheckpoint(
            dirpath=run_dir / "checkpoints",
            filename="last",
            save_top_k=1,
            every_n_train_steps=every_n_steps,
            enable_version_counter=False,
        )
    ]


def training_cli(args: Sequence[str] | None = None, run: bool = True, cli_class=TrainingCLI):
    """Run (or, with ``run=False``, only build) ``cli_class`` the way ``docclass`` does."""
    parser_kwargs = {"exit_on_error": False}
    if run:
        # Parse errors come back as exceptions, so they can be said in one line instead of the
        # full usage text followed by a two-line message.
        parser_kwargs.update({name: {"exit_on_error": False} for name in LIGHTNING_SUBCOMMANDS})
    # A process group that was there before belongs to the caller; one the run made ends with it.
    ends_process_group = run and not _process_group_initialized()
    try:
        with warnings.catch_warnings():
            # Commands that read a config (docclass report --data config.yaml) pass their own
            # args while sys.argv holds theirs: intended here, so LightningCLI's caution is noise.
            warnings.filterwarnings("ignore", "LightningCLI's args parameter", UserWarning)
            return cli_class(
                DocClassifierModule,
                DocDataModule,
                seed_everything_default=0,
                save_config_kwargs={"overwrite": True},
                parser_kwargs=parser_kwargs,
                args=None if args is None else list(args),
                run=run,
            )
    finally:
        if ends_process_group and _process_group_initialized():
            _end_process_group()


def _process_group_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def _end_process_group() -> None:
    """Destroy the process group a DDP run made, while the interpreter is still whole.

    Lightning destroys it at exit for NCCL only. A gloo group left to interpreter shutdown is
    freed during finalization, and one of its worker threads may still hold the last reference
    to a finished collective, with tensors Python allocated (``all_gather_object``'s). Dropping
    them takes the GIL; a finalizing interpreter answers by ending the thread, and that unwind
    through a noexcept destructor calls std::terminate: "terminate called without an active
    exception", SIGABRT, at random and mostly under load. Destroying the group here joins its
    worker threads and the TCPStore's first, so nothing of it is left for finalization.
    """
    dist.destroy_process_group()


def report_settings(config: str | Path) -> dict[str, int | None]:
    """The after-fit report's settings a training config gives (``report_max_documents``,
    ``report_faithfulness_documents``), read by LightningCLI's own parser (which builds the
    config's data and model to resolve it; nothing runs)."""
    path = Path(config)
    if not path.is_file():
        raise ConfigError(f"{config}: config not found; pass a file from configs/")
    try:
        cli = training_cli(["--config", str(path), "--trainer.logger", "false"], run=False)
    except ArgumentError as error:
        raise ConfigError(f"{config}: {' '.join(str(error).split())}") from error
    return {
        name: cli.config.get(name)
        for name in ("report_max_documents", "report_faithfulness_documents")
    }


def datamodule_from_config(config: str | Path, overrides: Sequence[str] = ()) -> DocDataModule:
    """The DataModule a training config describes, built by LightningCLI's own parser.

    ``overrides`` are command-line arguments applied on top (``["--data.tokenizer_from",
    ckpt]`` reuses a checkpoint's tokenizer and label order). The trainer and model the config
    names are built too (that is how LightningCLI resolves a config) but never run.
    """
    path = Path(config)
    if not path.is_file():
        raise ConfigError(f"{config}: config not found; pass a file from configs/")
    # On the CPU: the trainer is never run, and a GPU config (the hub configs) read on a
    # machine without one was refused for a trainer report and calibrate never use.
    unused_trainer = ["--trainer.logger", "false", "--trainer.accelerator", "cpu"]
    unused_trainer += ["--trainer.devices", "1", "--trainer.precision", "32"]
    try:
        cli = training_cli(["--config", str(path), *unused_trainer, *overrides], run=False)
    except ArgumentError as error:
        raise ConfigError(f"{config}: {' '.join(str(error).split())}") from error
    return cli.datamodule
