"""How far to trust a word ranking: ERASER's comprehensiveness and sufficiency.

Removing a word means dropping its tokens from the attention mask (the model then never sees
it; the pool and every block skip it exactly; every other token keeps its position), cutting
them out of the text (``removal="delete"``, ERASER's own definition: later tokens move up), or
replacing them with the unknown token (``"unk"``). AOPC averages the probability drop over the
fractions of words removed (DeYoung et al. 2020, "ERASER").
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from docclass.data.tokenizer import UNK_ID, unknown_id
from docclass.interpret.inputs import batched, document_inputs, float32_model
from docclass.nn.model import DocumentClassifier

FRACTIONS = (0.01, 0.05, 0.10, 0.20, 0.50)


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


def _curve_masks(n_words: int, ranking: Sequence[int], fractions: Sequence[float]) -> list:
    """Word-keep masks: per fraction, the document without its top words, then only them."""
    masks = []
    for fraction in fractions:
        top = np.asarray(ranking[: top_k(n_words, fraction)], dtype=np.int64)
        without = np.ones(n_words, dtype=bool)
        without[top] = False
        masks += [without, ~without]
    return masks


REMOVALS = ("mask", "unk", "delete")

# A document's perturbed copies already run, by (removal, word-keep mask bytes): their class
# distributions (see ``keep_distributions``).
Copies = dict[tuple[str, bytes], np.ndarray]


def keep_probabilities(
    model: DocumentClassifier,
    ids: torch.Tensor,
    token_words: np.ndarray,
    masks: Sequence[np.ndarray],
    target: int,
    removal: str = "mask",
    batch_size: int = 64,
    device: str = "cpu",
    unk_id: int = UNK_ID,
    copies: Copies | None = None,
) -> np.ndarray:
    """p(target) for each word-keep mask of one document (see :func:`keep_distributions`)."""
    return keep_distributions(
        model, ids, token_words, masks, removal, batch_size, device, unk_id, copies
    )[:, target]


def keep_distributions(
    model: DocumentClassifier,
    ids: torch.Tensor,
    token_words: np.ndarray,
    masks: Sequence[np.ndarray],
    removal: str = "mask",
    batch_size: int = 64,
    device: str = "cpu",
    unk_id: int = UNK_ID,
    copies: Copies | None = None,
) -> np.ndarray:
    """The class distribution ``[N,C]`` for each word-keep mask of one document, the copies run
    in batches.

    ``removal="mask"`` drops a removed word's tokens from the attention mask (every kept token
    keeps its position); ``"delete"`` cuts them out, so later tokens move up (ERASER's
    definition: the text without those words); ``"unk"`` replaces them with the unknown token
    ``unk_id`` (the tokenizer's: a pre-trained encoder's vocabulary puts it elsewhere). The
    three can differ: the model has seen neither empty positions nor many [UNK]s in training.

    A copy asked for twice (two methods agreeing on a document's top word, say) runs once.
    ``copies``, when given, holds this document's copies already run through this model (by
    removal and mask) and receives the new ones: the report's counterfactual search reads the
    faithfulness measure's copies from it instead of running them again.
    """
    if removal not in REMOVALS:
        raise ValueError(f"removal must be one of {REMOVALS}, got {removal!r}")
    keys = [(removal, np.asarray(mask, dtype=bool).tobytes()) for mask in masks]
    known = {} if copies is None else copies
    new: dict[tuple[str, bytes], np.ndarray] = {}
    for key, mask in zip(keys, masks, strict=True):
        if key not in known and key not in new:
            new[key] = np.asarray(mask, dtype=bool)
    if new:
        computed = _run_copies(
            model, ids, token_words, list(new.values()), removal, batch_size, device, unk_id
        )
        known.update(zip(new, computed, strict=True))
    return np.stack([known[key] for key in keys])


def _run_copies(
    model: DocumentClassifier,
    ids: torch.Tensor,
    token_words: np.ndarray,
    masks: Sequence[np.ndarray],
    removal: str,
    batch_size: int,
    device: str,
    unk_id: int,
) -> np.ndarray:
    """``keep_distributions`` of distinct masks: every copy runs."""
    model = float32_model(model.to(device).eval())
    keeps = [mask[token_words] for mask in masks]
    with torch.inference_mode():
        if removal == "delete" or (removal == "mask" and model.config.attention_window == 0):
            return _compacted_distributions(
                model, ids, keeps, batch_size, device, keep_positions=removal == "mask"
            )
        rows = []
        for start in range(0, len(masks), batch_size):
            keep = torch.from_numpy(np.stack(keeps[start : start + batch_size]))
            input_ids = ids.expand(len(keep), -1).clone()
            attention = torch.ones_like(keep)
            if removal == "mask":
                attention = keep
            else:
                input_ids[~keep] = unk_id
            logits = model(input_ids.to(device), attention.to(device)).logits.double()
            rows.append(torch.softmax(logits, dim=-1).cpu().numpy())
    return np.concatenate(rows)


def _compacted_distributions(
    model: DocumentClassifier,
    ids: torch.Tensor,
    keeps: Sequence[np.ndarray],
    batch_size: int,
    device: str,
    keep_positions: bool,
) -> np.ndarray:
    """Copies run with their removed tokens cut out.

    With ``keep_positions``, each kept token sits at its own position: with full attention a
    masked-out token changes nothing for any other token (it gets exactly zero weight
    everywhere), so this gives the same distribution as masking, from copies half as long on
    average (sufficiency keeps 1-50 % of the words). Encoder windows are cut by document
    position, so each kept token stays in its own window too, and a window left empty is not
    encoded at all. Banded attention (``attention_window``) cannot be cut this way (cutting
    would bring far tokens into one band); it runs masked copies whole. Without
    ``keep_positions`` the copy is the shorter text itself (deletion).
    """
    kept = [np.flatnonzero(keep) for keep in keeps]
    if any(not len(k) for k in kept):
        raise ValueError("a word-keep mask removes every token: nothing left to classify")
    rows = [ids[k].tolist() for k in kept]
    distributions = np.empty((len(keeps), model.config.num_classes), dtype=np.float64)
    for indices, input_ids, attention in batched(rows, batch_size, model.config.pad_id, device):
        positions = None
        if keep_positions:
            # Each kept token at its own place in the document (and, with encoder windows, in
            # its own window); padding columns repeat the last kept position.
            where = torch.zeros(input_ids.shape, dtype=torch.long)
            for row, i in enumerate(indices):
                where[row, : len(kept[i])] = torch.from_numpy(kept[i])
                where[row, len(kept[i]) :] = int(kept[i][-1])
            positions = where.to(device)
        logits = model(input_ids, attention, positions=positions).logits.double()
        distributions[indices] = torch.softmax(logits, dim=-1).cpu().numpy()
    return distributions


def document_curves(
    classifier,
    text: str,
    record: dict,
    rankings: dict[str, Sequence[int]],
    removal: str = "mask",
    fractions: Sequence[float] = FRACTIONS,
    batch_size: int = 64,
    device: str = "cpu",
    copies: Copies | None = None,
) -> dict[str, dict[str, list[float]]]:
    """Removal curves of several rankings of one document, every perturbed copy batched
    (removal and ``copies`` as in :func:`keep_distributions`)."""
    ids, token_words, predicted = document_inputs(classifier, text, record)
    n_words = record["words_read"]
    masks = [np.ones(n_words, dtype=bool)]
    for ranking in rankings.values():
        masks += _curve_masks(n_words, ranking, fractions)
    flat = keep_probabilities(
        classifier.model, ids, token_words, masks, predicted, removal, batch_size, device,
        unknown_id(classifier.tokenizer), copies,
    )  # fmt: skip
    full, rest = float(flat[0]), flat[1:]
    curves, per = {}, 2 * len(fractions)
    for index, name in enumerate(rankings):
        curves[name] = _drops(full, rest[index * per : (index + 1) * per])
    return curves


def rank_words(scores: Sequence[float], seed: int) -> list[int]:
    """Word indices by score, highest first; equal scores in a random order (``seed``), as
    ERASER breaks ties, rather than by position, which would favour a document's opening."""
    tie_break = np.random.default_rng(seed).random(len(scores))
    # np.lexsort sorts by the last key first.
    return np.lexsort((tie_break, -np.asarray(scores, dtype=np.float64))).tolist()


def document_faithfulness(
    classifier,
    text: str,
    record: dict,
    removal: str = "mask",
    random_seeds: int = 5,
    fractions: Sequence[float] = FRACTIONS,
    device: str = "cpu",
    copies: Copies | None = None,
) -> dict[str, dict[str, Any]] | None:
    """One document's AOPC comprehensiveness and sufficiency and comprehensiveness curve for
    every method of its record, and for a random ranking averaged over ``random_seeds`` seeds
    (``"random"``). None for a document too short to rank (fewer than two words read).
    ``copies`` as in :func:`keep_distributions`.

    AOPC here is ERASER's code's definition: the mean over the fractions removed (1, 5, 10, 20
    and 50 % of the words), without the k = 0 point of the AOPC paper's formula."""
    if record.get("error") or record["words_read"] < 2:
        return None
    n_words = record["words_read"]
    # Seeded by the text, so each document gets its own random rankings and tie-breaks (one
    # permutation shared by every document would correlate the floor across the corpus), and
    # the same document gets the same ones in every run.
    document_seed = zlib.crc32(text.encode("utf-8"))
    rankings = {
        method: rank_words(values[:n_words], document_seed)
        for method, values in record["scores"].items()
    }
    for seed in range(random_seeds):
        rng = np.random.default_rng([document_seed, seed])
        rankings[f"random {seed}"] = rng.permutation(n_words).tolist()
    curves = document_curves(
        classifier, text, record, rankings, removal, fractions, device=device, copies=copies
    )
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
    for name in figures:
        if name != "random":
            figures[name]["beats_random"] = beats_random(figures, name)
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
