"""How far to trust a word ranking: ERASER's comprehensiveness and sufficiency, and a corpus
whose right answer is known.

Removing a word means dropping its tokens from the attention mask (the model then never sees
it; the pool and every block skip it exactly), or, with ``removal="unk"``, replacing its
tokens with the unknown token. AOPC averages the probability drop over the fractions of words
removed (DeYoung et al. 2020, "ERASER").
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

FRACTIONS = (0.01, 0.05, 0.10, 0.20, 0.50)
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def top_k(n_words: int, fraction: float) -> int:
    """How many words a fraction of a document is: at least one, at most all."""
    return min(n_words, max(1, math.ceil(fraction * n_words)))


def removal_curves(
    probability: Callable[[list[np.ndarray]], np.ndarray],
    n_words: int,
    ranking: Sequence[int],
    fractions: Sequence[float] = FRACTIONS,
) -> dict[str, list[float]]:
    """Comprehensiveness and sufficiency of one ranking of one document, per fraction.

    Args:
        probability: word-keep masks (bool ``[n_words]`` each) → the predicted class's
            probability for each, in one batch. An all-True mask is the whole document.
        n_words: words the model read.
        ranking: word indices, most important first.
        fractions: fractions of the words to remove (or keep).

    Returns:
        ``{"comprehensiveness": [p(x) - p(x without top k)], "sufficiency": [p(x) - p(top k
        only)]}``, one value per fraction.
    """
    masks = [np.ones(n_words, dtype=bool), *_curve_masks(n_words, ranking, fractions)]
    probs = probability(masks)
    return _drops(float(probs[0]), probs[1:])


def _drops(full: float, perturbed: np.ndarray) -> dict[str, list[float]]:
    """Probability drops from ``_curve_masks``'s order: without top k, only top k, per k."""
    return {
        "comprehensiveness": [full - float(p) for p in perturbed[0::2]],
        "sufficiency": [full - float(p) for p in perturbed[1::2]],
    }


def aopc(values: Sequence[float]) -> float:
    """Area over the perturbation curve: the mean drop over the fractions tried."""
    return float(np.mean(values))


def planted_keyword_corpus(
    n_per_class: int = 200,
    keywords: Sequence[str] = ("zorblax", "quintessa", "vermilox"),
    words_per_document: tuple[int, int] = (20, 40),
    seed: int = 0,
) -> list[dict]:
    """Documents of random filler words in which exactly one planted keyword decides the label.

    Returns rows ``{"text", "label", "keyword_position"}`` (label = the keyword's class name),
    shuffled. Filler words are made of syllables that never form a keyword.
    """
    rng = random.Random(seed)
    filler = sorted({"".join(rng.choices(SYLLABLES, k=rng.randint(1, 3))) for _ in range(800)})
    filler = [word for word in filler if word not in keywords]
    rows = []
    for label, keyword in enumerate(keywords):
        for _ in range(n_per_class):
            words = rng.choices(filler, k=rng.randint(*words_per_document))
            position = rng.randrange(len(words) + 1)
            words.insert(position, keyword)
            rows.append(
                {"text": " ".join(words), "label": keywords[label], "keyword_position": position}
            )
    rng.shuffle(rows)
    return rows


def planted_keyword_hits(
    workdir: str,
    block_counts: Sequence[int] = (0, 1),
    n_per_class: int = 200,
    held_out_per_class: int = 30,
    epochs: int = 6,
) -> dict:
    """Train the tiny config on the planted-keyword corpus (seconds) with each number of
    self-attention blocks, and count how often each method ranks the keyword first on
    held-out documents."""
    import json
    from pathlib import Path

    from docclass.checkpoint import load_classifier
    from docclass.cli import main
    from docclass.explain import explain_documents

    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "planted.jsonl"
    with corpus.open("w", encoding="utf-8") as handle:
        for row in planted_keyword_corpus(n_per_class):
            handle.write(json.dumps({"text": row["text"], "label": row["label"]}) + "\n")
    held_out = planted_keyword_corpus(held_out_per_class, seed=1)
    results = {}
    configs = Path(__file__).resolve().parents[1] / "configs"
    for blocks in block_counts:
        run_dir = root / f"blocks-{blocks}"
        main([
            "fit", "--config", str(configs / "tiny.yaml"), "--data.source", str(corpus),
            "--data.max_docs_per_class", "null", "--trainer.max_epochs", str(epochs),
            # The tiny config's 64 tokens would cut some keywords off: read whole documents.
            "--data.max_tokens", "256",
            "--trainer.callbacks=[]", "--report_after_fit", "false",
            "--model.n_layers", str(blocks), "--trainer.default_root_dir", str(run_dir),
        ])  # fmt: skip
        accuracy = json.loads((run_dir / "metrics.json").read_text())["test"]["accuracy"]
        classifier = load_classifier(run_dir / "checkpoints" / "last.ckpt")
        records = explain_documents(classifier, [row["text"] for row in held_out])
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
        results[f"{blocks} blocks"] = {"test_accuracy": accuracy, "keyword_ranked_first": hits}
    return {"held_out_documents": len(held_out), "epochs": epochs, "runs": results}


def _curve_masks(n_words: int, ranking: Sequence[int], fractions: Sequence[float]) -> list:
    """Word-keep masks: per fraction, the document without its top words, then only them."""
    masks = []
    for fraction in fractions:
        top = np.asarray(ranking[: top_k(n_words, fraction)], dtype=np.int64)
        without = np.ones(n_words, dtype=bool)
        without[top] = False
        masks += [without, ~without]
    return masks


def document_curves(
    classifier,
    text: str,
    record: dict,
    rankings: dict[str, Sequence[int]],
    removal: str = "mask",
    fractions: Sequence[float] = FRACTIONS,
    batch_size: int = 64,
    device: str = "cpu",
) -> dict[str, dict[str, list[float]]]:
    """Removal curves of several rankings of one document, every perturbed copy batched.

    ``removal="mask"`` drops a removed word's tokens from the attention mask; ``"unk"``
    replaces them with the unknown token (the two can differ: the model has seen neither
    empty positions nor many [UNK]s in training).
    """
    import torch

    from docclass.tokenizer import UNK_ID, align_words, encode_batch

    if removal not in ("mask", "unk"):
        raise ValueError(f"removal must be 'mask' or 'unk', got {removal!r}")
    encoding = encode_batch(classifier.tokenizer, [text])[0]
    n_read = record["tokens_read"]
    ids = torch.tensor(encoding.ids[:n_read], dtype=torch.long)
    token_words = np.asarray(align_words(encoding).token_words[:n_read], dtype=np.int64)
    n_words = record["words_read"]
    predicted = classifier.label_names.index(record["predicted"])
    masks = [np.ones(n_words, dtype=bool)]
    for ranking in rankings.values():
        masks += _curve_masks(n_words, ranking, fractions)
    model = classifier.model.to(device).eval()
    probs = []
    with torch.inference_mode():
        for start in range(0, len(masks), batch_size):
            chunk = masks[start : start + batch_size]
            keep = torch.from_numpy(np.stack([mask[token_words] for mask in chunk]))
            input_ids = ids.expand(len(keep), -1).clone()
            attention = torch.ones_like(keep)
            if removal == "mask":
                attention = keep
            else:
                input_ids[~keep] = UNK_ID
            logits = model(input_ids.to(device), attention.to(device)).logits.float()
            probs.append(torch.softmax(logits, dim=-1)[:, predicted].cpu().numpy())
    flat = np.concatenate(probs)
    full, rest = float(flat[0]), flat[1:]
    curves, per = {}, 2 * len(fractions)
    for index, name in enumerate(rankings):
        curves[name] = _drops(full, rest[index * per : (index + 1) * per])
    return curves


def faithfulness_table(
    classifier,
    texts: Sequence[str],
    records: Sequence[dict],
    removal: str = "mask",
    random_seeds: int = 5,
    fractions: Sequence[float] = FRACTIONS,
    device: str = "cpu",
) -> dict[str, dict[str, Any]]:
    """Per method, over documents: mean AOPC comprehensiveness and sufficiency, and the mean
    comprehensiveness at each fraction (``curve``); a random ranking averaged over
    ``random_seeds`` seeds is the floor to beat."""
    totals: dict[str, dict[str, list]] = {}
    for text, record in zip(texts, records, strict=True):
        if record.get("error") or record["words_read"] < 2:
            continue
        n_words = record["words_read"]
        rankings = {
            method: np.argsort(-np.asarray(values[:n_words]), kind="stable").tolist()
            for method, values in record["scores"].items()
        }
        for seed in range(random_seeds):
            rankings[f"random {seed}"] = np.random.default_rng(seed).permutation(n_words).tolist()
        curves = document_curves(
            classifier, text, record, rankings, removal, fractions, device=device
        )
        for name, curve in curves.items():
            key = "random" if name.startswith("random ") else name
            entry = totals.setdefault(
                key, {"comprehensiveness": [], "sufficiency": [], "curve": []}
            )
            entry["comprehensiveness"].append(aopc(curve["comprehensiveness"]))
            entry["sufficiency"].append(aopc(curve["sufficiency"]))
            entry["curve"].append(curve["comprehensiveness"])
    return {
        name: {
            "comprehensiveness": float(np.mean(entry["comprehensiveness"])),
            "sufficiency": float(np.mean(entry["sufficiency"])),
            "curve": np.mean(entry["curve"], axis=0).round(5).tolist(),
        }
        for name, entry in totals.items()
    }


def curves_figure(tables: dict[str, dict], fractions: Sequence[float]):
    """Fraction of words removed vs. drop in the predicted class's probability, one curve per
    method (heads left out for legibility), one panel per removal mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(tables), figsize=(5.5 * len(tables), 4), squeeze=False)
    for axis, (removal, table) in zip(axes[0], tables.items(), strict=True):
        for name, row in table.items():
            if name.startswith("attention_head"):
                continue
            style = {"color": "grey", "linestyle": "--"} if name == "random" else {}
            axis.plot([100 * f for f in fractions], row["curve"], marker="o", label=name, **style)
        axis.set_title(f"words removed by {'masking' if removal == 'mask' else '[UNK]'}")
        axis.set_xlabel("% of the document's words removed, most important first")
        axis.set_ylabel("drop in p(predicted class)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


def faithfulness_command(
    ckpt: str,
    data: str,
    out: str,
    split: str = "test",
    limit: int | None = None,
    removals: Sequence[str] = ("mask", "unk"),
    device: str = "cpu",
) -> dict[str, Any]:
    """What ``docclass faithfulness`` runs: ``<out>/faithfulness.json`` and ``.png``."""
    import json
    import time
    from pathlib import Path

    from docclass.checkpoint import load_classifier
    from docclass.explain import explain_documents
    from docclass.report.figures import save_png
    from docclass.reporting import load_documents

    classifier = load_classifier(ckpt)
    documents = load_documents(data, ckpt, split)
    texts = list(documents.texts)[:limit]
    records = explain_documents(classifier, texts, device=device)
    figures: dict[str, Any] = {
        "checkpoint": str(ckpt),
        "data": documents.description,
        "documents": len(texts),
        "fractions": list(FRACTIONS),
        "random_seeds": 5,
        "removal": {},
    }
    tables = {}
    for removal in removals:
        started = time.perf_counter()
        tables[removal] = faithfulness_table(classifier, texts, records, removal, device=device)
        figures["removal"][removal] = {
            "seconds": round(time.perf_counter() - started, 1),
            "aopc": tables[removal],
        }
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "faithfulness.json").write_text(json.dumps(figures, indent=2) + "\n")
    save_png(curves_figure(tables, FRACTIONS), folder / "faithfulness.png")
    return figures
