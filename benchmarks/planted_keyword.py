"""Do the word scores find a planted deciding keyword? Train the tiny config on the
planted-keyword corpus (:mod:`docclass.data.synthetic`) with each number of self-attention
blocks and count how often each method ranks the keyword first on held-out documents."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from docclass.artifacts.load import load_classifier
from docclass.cli import main
from docclass.data.synthetic import planted_keyword_corpus
from docclass.evaluate.erasure import faithfulness_table
from docclass.evaluate.sanity import permuted_pool
from docclass.interpret.default_method import default_method
from docclass.interpret.explain import explain_documents


def planted_keyword_hits(
    workdir: str,
    block_counts: Sequence[int] = (0, 1),
    n_per_class: int = 200,
    held_out_per_class: int = 30,
    epochs: int = 6,
    seed: int = 0,
) -> dict:
    """Train the tiny config on the planted-keyword corpus (seconds) with each number of
    self-attention blocks, and count how often each method ranks the keyword first on
    held-out documents."""
    root = Path(workdir)
    corpus = _write_corpus(root / "planted.jsonl", planted_keyword_corpus(n_per_class))
    held_out = planted_keyword_corpus(held_out_per_class, seed=1)
    results = {}
    for blocks in block_counts:
        run_dir = root / f"blocks-{blocks}"
        main([
            "fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.source", str(corpus),
            "--data.max_docs_per_class", "null", "--trainer.max_epochs", str(epochs),
            # The tiny config's 64 tokens would cut some keywords off: read whole documents.
            "--data.max_tokens", "256",
            "--trainer.callbacks=[]", "--report_after_fit", "false",
            "--model.n_layers", str(blocks), "--trainer.default_root_dir", str(run_dir),
            "--seed_everything", str(seed),
        ])  # fmt: skip
        results[f"{blocks} blocks"] = _keyword_run(run_dir, held_out)
    return {"held_out_documents": len(held_out), "epochs": epochs, "seed": seed, "runs": results}


# 150 to 250 MiniLM tokens: the keyword has six blocks' worth of filler context to be mixed
# with (the tiny model's documents are 20 to 40 words).
ENCODER_DOCUMENT_WORDS = (60, 110)


def encoder_keyword_hits(
    workdir: str,
    config: str = "configs/minilm.yaml",
    n_per_class: int = 200,
    held_out_per_class: int = 30,
    epochs: int = 3,
    seed: int = 0,
) -> dict:
    """Fine-tune a pre-trained encoder's config (MiniLM, all six blocks) on a planted-keyword
    corpus of longer documents, and count how often each method ranks the keyword first on
    held-out documents."""
    root = Path(workdir)
    rows = planted_keyword_corpus(n_per_class, words_per_document=ENCODER_DOCUMENT_WORDS)
    corpus = _write_corpus(root / "planted-long.jsonl", rows)
    held_out = planted_keyword_corpus(
        held_out_per_class, words_per_document=ENCODER_DOCUMENT_WORDS, seed=1
    )
    run_dir = root / "encoder"
    main([
        "fit", "--config", str(config), "--data.source", str(corpus),
        "--trainer.max_epochs", str(epochs), "--trainer.min_epochs", "1", "--train_tokens", "null",
        "--report_after_fit", "false", "--trainer.default_root_dir", str(run_dir),
        "--trainer.enable_progress_bar", "false", "--seed_everything", str(seed),
    ])  # fmt: skip
    return {
        "config": str(config),
        "held_out_documents": len(held_out),
        "epochs": epochs,
        "seed": seed,
        "run": _keyword_run(run_dir, held_out),
    }


CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _write_corpus(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({"text": row["text"], "label": row["label"]}) + "\n")
    return path


def _keyword_run(run_dir: Path, held_out: list[dict]) -> dict:
    """A trained run's test accuracy, each method's share of held-out documents whose top word
    is the keyword, how much the pool's weights decide, and the method a report would show."""
    accuracy = json.loads((run_dir / "metrics.json").read_text())["test"]["accuracy"]
    classifier = load_classifier(run_dir / "checkpoints" / "last.ckpt")
    texts = [row["text"] for row in held_out]
    records = explain_documents(classifier, texts)
    hits = {
        method: float(
            np.mean(
                [
                    int(np.argmax(record["scores"][method])) == row["keyword_position"]
                    for record, row in zip(records, held_out, strict=True)
                ]
            )
        )
        for method in records[0]["scores"]
    }
    # How much the pool's weights decide: shuffled over each document, the prediction moves
    # far when only the pool singles out the keyword, little when a block has spread it.
    permuted = permuted_pool(classifier, texts, permutations=10)
    # The method a report of this model would show first, chosen by its own faithfulness
    # table on these documents (deletion as ERASER defines it, and masking).
    chosen = {}
    for removal in ("mask", "delete"):
        table = faithfulness_table(classifier, texts, records, removal)
        choice = default_method(table, len(texts))
        chosen[removal] = {
            "method": choice.method,
            "keyword_ranked_first": hits[choice.method],
            "reason": choice.reason,
            "table": {
                name: {k: round(row[k], 4) for k in ("comprehensiveness", "sufficiency")}
                for name, row in table.items()
            },
        }
    return {
        "test_accuracy": accuracy,
        "keyword_ranked_first": hits,
        "default_method": chosen,
        "permuted_pool": permuted,
    }
