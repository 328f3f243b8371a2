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
    from docclass.trust import permuted_pool

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
        # How much the pool's weights decide: shuffled over each document, the prediction moves
        # far when only the pool singles out the keyword, little when a block has spread it.
        permuted = permuted_pool(classifier, [row["text"] for row in held_out], permutations=10)
        results[f"{blocks} blocks"] = {
            "test_accuracy": accuracy,
            "keyword_ranked_first": hits,
            "permuted_pool": permuted,
        }
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


def document_inputs(classifier, text: str, record: dict):
    """The tokens the model read of one explained document: ``(ids [T] long, token_words [T],
    predicted class index)``."""
    import torch

    from docclass.tokenizer import align_words, encode_batch

    encoding = encode_batch(classifier.tokenizer, [text])[0]
    n_read = record["tokens_read"]
    ids = torch.tensor(encoding.ids[:n_read], dtype=torch.long)
    token_words = np.asarray(align_words(encoding).token_words[:n_read], dtype=np.int64)
    return ids, token_words, classifier.label_names.index(record["predicted"])


def keep_probabilities(
    model,
    ids,
    token_words: np.ndarray,
    masks: Sequence[np.ndarray],
    target: int,
    removal: str = "mask",
    batch_size: int = 64,
    device: str = "cpu",
) -> np.ndarray:
    """p(target) for each word-keep mask of one document, the copies run in batches.

    ``removal="mask"`` drops a removed word's tokens from the attention mask; ``"unk"``
    replaces them with the unknown token (the two can differ: the model has seen neither
    empty positions nor many [UNK]s in training).

    With full attention, a masked-out token changes nothing for any other token (it gets
    exactly zero weight everywhere), so masked copies are run with their removed tokens cut
    out and every kept token at its own position: the same probabilities, from copies half
    as long on average (sufficiency keeps 1-50 % of the words). Windowed attention cannot be
    cut this way (cutting would bring far tokens into one window); it runs masked copies whole.
    """
    import torch

    from docclass.model import length_batches, pad_token_ids
    from docclass.tokenizer import UNK_ID

    if removal not in ("mask", "unk"):
        raise ValueError(f"removal must be 'mask' or 'unk', got {removal!r}")
    model = model.to(device).eval()
    keeps = [mask[token_words] for mask in masks]
    probs = np.empty(len(masks), dtype=np.float64)
    with torch.inference_mode():
        if removal == "mask" and model.config.attention_window == 0:
            positions = model.position_vectors(len(ids), torch.device(device))
            kept = [np.flatnonzero(keep) for keep in keeps]
            for group in length_batches([len(k) for k in kept], batch_size):
                rows = [ids[kept[i]].tolist() for i in group]
                input_ids, attention = pad_token_ids(rows, model.config.pad_id)
                input_ids, attention = input_ids.to(device), attention.to(device)
                embeds = model.embed(input_ids) * model.embed_scale
                if positions is not None:
                    where = torch.zeros(input_ids.shape, dtype=torch.long)
                    for row, i in enumerate(group):
                        where[row, : len(kept[i])] = torch.from_numpy(kept[i])
                    embeds = embeds + positions[where.to(device)]
                logits = model(input_ids, attention, inputs_embeds=embeds).logits.double()
                probs[group] = torch.softmax(logits, dim=-1)[:, target].cpu().numpy()
            return probs
        for start in range(0, len(masks), batch_size):
            keep = torch.from_numpy(np.stack(keeps[start : start + batch_size]))
            input_ids = ids.expand(len(keep), -1).clone()
            attention = torch.ones_like(keep)
            if removal == "mask":
                attention = keep
            else:
                input_ids[~keep] = UNK_ID
            logits = model(input_ids.to(device), attention.to(device)).logits.double()
            probs[start : start + len(keep)] = torch.softmax(logits, dim=-1)[:, target].cpu()
    return probs


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
    """Removal curves of several rankings of one document, every perturbed copy batched
    (removal as in :func:`keep_probabilities`)."""
    ids, token_words, predicted = document_inputs(classifier, text, record)
    n_words = record["words_read"]
    masks = [np.ones(n_words, dtype=bool)]
    for ranking in rankings.values():
        masks += _curve_masks(n_words, ranking, fractions)
    flat = keep_probabilities(
        classifier.model, ids, token_words, masks, predicted, removal, batch_size, device
    )
    full, rest = float(flat[0]), flat[1:]
    curves, per = {}, 2 * len(fractions)
    for index, name in enumerate(rankings):
        curves[name] = _drops(full, rest[index * per : (index + 1) * per])
    return curves


def document_faithfulness(
    classifier,
    text: str,
    record: dict,
    removal: str = "mask",
    random_seeds: int = 5,
    fractions: Sequence[float] = FRACTIONS,
    device: str = "cpu",
) -> dict[str, dict[str, Any]] | None:
    """One document's AOPC comprehensiveness and sufficiency and comprehensiveness curve for
    every method of its record, and for a random ranking averaged over ``random_seeds`` seeds
    (``"random"``). None for a document too short to rank (fewer than two words read)."""
    if record.get("error") or record["words_read"] < 2:
        return None
    n_words = record["words_read"]
    rankings = {
        method: np.argsort(-np.asarray(values[:n_words]), kind="stable").tolist()
        for method, values in record["scores"].items()
    }
    for seed in range(random_seeds):
        rankings[f"random {seed}"] = np.random.default_rng(seed).permutation(n_words).tolist()
    curves = document_curves(classifier, text, record, rankings, removal, fractions, device=device)
    grouped: dict[str, list[dict[str, list[float]]]] = {}
    for name, curve in curves.items():
        grouped.setdefault("random" if name.startswith("random ") else name, []).append(curve)
    figures = {
        name: {
            "comprehensiveness": round(
                float(np.mean([aopc(c["comprehensiveness"]) for c in group])), 5
            ),
            "sufficiency": round(float(np.mean([aopc(c["sufficiency"]) for c in group])), 5),
            "curve": np.mean([c["comprehensiveness"] for c in group], axis=0).round(5).tolist(),
        }
        for name, group in grouped.items()
    }
    if random_seeds > 1:
        # How far one random ranking strays from another: "better than random" must clear it.
        spread = np.std([aopc(c["comprehensiveness"]) for c in grouped["random"]], ddof=1)
        figures["random"]["comprehensiveness_std"] = round(float(spread), 5)
    return figures


def beats_random(figures: dict[str, dict[str, Any]], method: str) -> bool:
    """A method's comprehensiveness on one document exceeds random's mean by more than twice
    the spread between random rankings (and by at least 0.01, for near-constant floors)."""
    floor = figures["random"]
    margin = max(2 * floor.get("comprehensiveness_std", 0.0), 0.01)
    return figures[method]["comprehensiveness"] > floor["comprehensiveness"] + margin


def aggregate_faithfulness(per_document: Sequence[dict | None]) -> dict[str, dict[str, Any]]:
    """Means over documents of :func:`document_faithfulness`'s figures, per method, and the
    fraction of documents on which each method :func:`beats_random`."""
    rows = [row for row in per_document if row]
    if not rows:
        return {}
    return {
        name: {
            "comprehensiveness": float(np.mean([row[name]["comprehensiveness"] for row in rows])),
            "sufficiency": float(np.mean([row[name]["sufficiency"] for row in rows])),
            "curve": np.mean([row[name]["curve"] for row in rows], axis=0).round(5).tolist(),
            **(
                {}
                if name == "random"
                else {"beats_random": float(np.mean([beats_random(row, name) for row in rows]))}
            ),
        }
        for name in rows[0]
    }


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
    return aggregate_faithfulness(
        [
            document_faithfulness(
                classifier, text, record, removal, random_seeds, fractions, device
            )
            for text, record in zip(texts, records, strict=True)
        ]
    )


def sample_indices(n_documents: int, size: int, seed: int = 0) -> list[int]:
    """A fixed random sample of document positions, in order (splits are often grouped by
    class, so the first N would be one class)."""
    if size >= n_documents:
        return list(range(n_documents))
    return sorted(np.random.default_rng(seed).choice(n_documents, size, replace=False).tolist())


def sample_checks(
    classifier, texts: Sequence[str], ig_steps: int = 32, device: str = "cpu"
) -> dict[str, Any]:
    """The checks too slow for a whole split, on a sample: integrated gradients beside every
    method's AOPC, Kendall τ with leave-one-word-out, and cascading weight randomisation."""
    import time

    from docclass import trust
    from docclass.explain import explain_documents

    records = explain_documents(classifier, list(texts), device=device)
    started = time.perf_counter()
    deltas = (
        trust.add_integrated_gradients(classifier, texts, records, ig_steps, device=device)
        if ig_steps
        else []
    )
    ig_seconds = time.perf_counter() - started
    started = time.perf_counter()
    aopc_mask = faithfulness_table(classifier, texts, records, "mask", device=device)
    tau = trust.loo_agreement(classifier, texts, records, device=device)
    tau_seconds = time.perf_counter() - started
    started = time.perf_counter()
    randomised = trust.randomised_weights(classifier, texts, records, ig_steps, device=device)
    return {
        "documents": len(texts),
        "integrated_gradients_steps": ig_steps,
        "integrated_gradients_relative_delta": {
            "max": float(max(deltas, default=0.0)),
            "mean": float(np.mean(deltas)) if deltas else 0.0,
        },
        "aopc_mask": aopc_mask,
        "kendall_tau_vs_leave_one_out": tau,
        "randomised_weights": randomised,
        "seconds": {
            "integrated_gradients": round(ig_seconds, 1),
            "aopc_and_leave_one_out": round(tau_seconds, 1),
            "randomised_weights": round(time.perf_counter() - started, 1),
        },
    }


def faithfulness_command(
    ckpt: str,
    data: str,
    out: str,
    split: str = "test",
    limit: int | None = None,
    removals: Sequence[str] = ("mask", "unk"),
    device: str = "cpu",
    sample: int = 20,
    ig_steps: int = 32,
    permutations: int = 20,
) -> dict[str, Any]:
    """What ``docclass faithfulness`` runs: ``<out>/faithfulness.json`` and ``.png``; a report
    already in ``out`` is rendered again with the figures."""
    import json
    import time
    from pathlib import Path

    from docclass import trust
    from docclass.checkpoint import load_classifier
    from docclass.explain import explain_documents
    from docclass.report.figures import removal_curves_figure, save_png
    from docclass.report.html import FAITHFULNESS_FILE, REPORT_META, rewrite_report
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
    started = time.perf_counter()
    figures["permuted_pool"] = trust.permuted_pool(
        classifier, texts, permutations=permutations, device=device
    )
    figures["permuted_pool"]["seconds"] = round(time.perf_counter() - started, 1)
    if sample:
        chosen = sample_indices(len(texts), sample)
        figures["sample"] = sample_checks(classifier, [texts[i] for i in chosen], ig_steps, device)
        figures["sample"]["indices"] = chosen
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FAITHFULNESS_FILE).write_text(json.dumps(figures, indent=2) + "\n")
    save_png(removal_curves_figure(tables, FRACTIONS), folder / "faithfulness.png")
    if (folder / REPORT_META).is_file() and (folder / "explanations.jsonl").is_file():
        figures["report"] = str(rewrite_report(folder))
    return figures
