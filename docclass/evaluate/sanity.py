"""Checks on the word-score methods beyond removal curves: agreement with leave-one-word-out,
and two sanity checks.

- Leave-one-word-out: each word's importance is the drop in p(predicted) when that word alone
  is dropped from the attention mask; Kendall's τ-b between it and each method's scores.
- Permuted pool (Jain & Wallace 2019): the pool's weights shuffled over the document's tokens,
  every head with the same permutation, the token vectors left as they are. The read-out after
  the pool is linear, so the permuted logits are exact sums of token contributions.
- Randomised weights (Adebayo et al. 2018): the trained weights replaced, from the read-out
  down to the embeddings, by a freshly initialised model's; a method whose scores barely
  change (Spearman ρ near 1) cannot be reading what the model learned.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from docclass.evaluate.erasure import keep_probabilities
from docclass.interpret.explain import explain_documents
from docclass.interpret.inputs import batched, document_inputs, encode_documents, float32_model
from docclass.interpret.integrated_gradients import add_integrated_gradients
from docclass.nn.model import DocumentClassifier


def leave_one_out(classifier, text: str, record: dict, device: str = "cpu") -> np.ndarray:
    """Drop in p(predicted) when each word read alone is dropped from the attention mask."""
    ids, token_words, predicted = document_inputs(classifier, text, record)
    n_words = record["words_read"]
    masks = [np.ones(n_words, dtype=bool)]
    for word in range(n_words):
        without = np.ones(n_words, dtype=bool)
        without[word] = False
        masks.append(without)
    probs = keep_probabilities(classifier.model, ids, token_words, masks, predicted, device=device)
    return probs[0] - probs[1:]


def _summary(values: Sequence[float]) -> dict[str, float | int]:
    """Mean and spread over documents, and how many documents (per method: they can differ,
    and the page says so)."""
    finite = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if not len(finite):
        return {"mean": float("nan"), "std": float("nan"), "documents": 0}
    return {
        "mean": round(float(finite.mean()), 4),
        "std": round(float(finite.std()), 4),
        "documents": len(finite),
    }


def _constant(values: Sequence[float]) -> bool:
    """Every score the same: no ranking, and no rank correlation with anything."""
    return bool(np.ptp(np.asarray(values, dtype=float)) == 0)


def loo_agreement(
    classifier, texts: Sequence[str], records: Sequence[dict], device: str = "cpu"
) -> dict[str, dict[str, float | int]]:
    """Per method: Kendall's τ-b with leave-one-word-out importance, mean and spread over
    documents. A document whose leave-one-out importance is constant is left out for every
    method; a method whose scores are constant there counts τ = 0 (it ranks no word above
    another), so every method averages over the same documents."""
    from scipy.stats import kendalltau

    taus: dict[str, list[float]] = {}
    for text, record in zip(texts, records, strict=True):
        if record.get("error") or record["words_read"] < 2:
            continue
        n_words = record["words_read"]
        importance = leave_one_out(classifier, text, record, device)
        if _constant(importance):
            continue
        for method, values in record["scores"].items():
            values = np.asarray(values[:n_words], dtype=float)
            tau = 0.0 if _constant(values) else kendalltau(values, importance).statistic
            taus.setdefault(method, []).append(float(tau))
    return {method: _summary(values) for method, values in taus.items()}


def _shuffle_keys(
    indices: Sequence[int], mask: torch.Tensor, permutations: int, seed: int
) -> torch.Tensor:
    """``[P,B,T]`` sort keys: argsort gives a random order of each document's real tokens,
    padding last. Each document draws from its own generator (seeded by its index), so its
    shuffles do not depend on which documents share its batch, nor on the batch size."""
    keys = torch.full((permutations, *mask.shape), 2.0)
    for row, index in enumerate(indices):
        real = int(mask[row].sum())
        generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
        keys[:, row, :real] = torch.rand(permutations, real, generator=generator)
    return keys


def median_over_permutations(values: Sequence[torch.Tensor]) -> list[float]:
    """Each document's median over its permutations (``values``: one ``[B]`` per
    permutation). np.median: torch's median of an even count is the lower middle value, not
    the mean of the two, which biased every document's figure low."""
    return np.median(torch.stack(list(values)).cpu().numpy(), axis=0).tolist()


def permuted_pool(
    classifier,
    texts: Sequence[str],
    permutations: int = 20,
    batch_size: int = 16,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    """How far the prediction moves when the pool's weights are shuffled over each document.

    Returns the median over documents of: the median total variation distance between the
    original and the permuted class distributions, the median drop in p(predicted), and the
    fraction of permutations that change the label; plus the fraction of documents whose label
    any permutation changes.
    """
    model = float32_model(classifier.model.to(device).eval())
    documents = encode_documents(classifier.tokenizer, texts, classifier.max_tokens)
    rows = [d.token_ids for d in documents if len(d.token_ids) > 1]
    distance, drop, flips = [], [], []
    bias = model.contribution_bias()
    for indices, input_ids, mask in batched(rows, batch_size, model.config.pad_id, device):
        with torch.inference_mode():
            out = model(input_ids, mask)
            probs = torch.softmax(out.logits.double(), dim=-1)
            predicted = probs.argmax(dim=-1)
            per_document = [[], [], []]
            keys = _shuffle_keys(indices, mask, permutations, seed).to(device)
            for permutation in range(permutations):
                order = keys[permutation].argsort(dim=-1)
                weights = out.pool_weights.gather(2, order[:, None, :].expand_as(out.pool_weights))
                logits = model.token_contributions(out.token_states, weights).sum(dim=1) + bias
                permuted = torch.softmax(logits.double(), dim=-1)
                per_document[0].append(0.5 * (permuted - probs).abs().sum(dim=-1))
                per_document[1].append((probs - permuted).gather(1, predicted[:, None]).squeeze(1))
                per_document[2].append((permuted.argmax(dim=-1) != predicted).double())
        distance += median_over_permutations(per_document[0])
        drop += median_over_permutations(per_document[1])
        flips += torch.stack(per_document[2]).mean(dim=0).tolist()
    return {
        "documents": len(rows),
        "permutations": permutations,
        "median_total_variation": round(float(np.median(distance)), 4),
        "median_probability_drop": round(float(np.median(drop)), 4),
        "median_label_change_rate": round(float(np.median(flips)), 4),
        "documents_any_label_change": round(float(np.mean(np.asarray(flips) > 0)), 4),
    }


def randomisation_stages(model) -> list[tuple[str, list[str]]]:
    """Cascading randomisation, top down: ``(stage name, module names randomised by then)``."""
    names = ["head"]
    stages = [("read-out", list(names))]
    names += ["pool", "final_norm"]
    stages.append(("pool", list(names)))
    for index in reversed(range(len(model.blocks))):
        names.append(f"blocks.{index}")
        stages.append((f"block {index}", list(names)))
    names += ["embed"] + (["position_table"] if model.position_table is not None else [])
    if model.config.embedding_norm:  # a pre-trained encoder's: trained weights, not an identity
        names.append("embedding_norm")
    stages.append(("embeddings", list(names)))
    return stages


def fresh_weights_seed(classifier, seed: int = 0) -> int:
    """The seed the randomised copies' fresh model is drawn from: ``seed`` offset by the
    trained weights' fingerprint (see ``randomised_copy``)."""
    return (int(classifier.fingerprint[:15], 16) + seed) % 2**63


def randomised_copy(classifier, module_names: Sequence[str], seed: int = 0):
    """The classifier with the named modules' weights taken from a freshly initialised model.

    The fresh model is drawn from a seed made of the trained weights' fingerprint, never from
    ``seed`` alone: a run trained under ``seed_everything(s)`` started from the very weights
    ``torch.manual_seed(s)`` draws, so "randomising" to those gave back weights training had
    barely moved, and every method looked as if it ignored the weights. Drawn under a forked
    generator, so the caller's random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(fresh_weights_seed(classifier, seed))
        fresh = DocumentClassifier(classifier.model.config)
    model = copy.deepcopy(classifier.model)
    for name in module_names:
        model.get_submodule(name).load_state_dict(fresh.get_submodule(name).state_dict())
    return dataclasses.replace(classifier, model=model.eval())


def randomised_weights(
    classifier,
    texts: Sequence[str],
    records: Sequence[dict],
    integrated_gradients_steps: int = 0,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    """Per cascading stage and method: Spearman ρ between the trained model's word scores and
    the randomised model's, mean and spread over documents, and how many documents. Scores
    that randomising made constant count ρ = 0 (nothing of the trained ranking is left), and
    ``constant`` counts them; a document where the trained scores were already constant is
    left out for that method (there was no ranking to keep)."""
    from scipy.stats import spearmanr

    results: dict[str, Any] = {}
    for stage, modules in randomisation_stages(classifier.model):
        randomised = randomised_copy(classifier, modules, seed)
        changed = explain_documents(randomised, list(texts), device=device)
        if integrated_gradients_steps:
            add_integrated_gradients(
                randomised, texts, changed, integrated_gradients_steps, device=device
            )
        rhos: dict[str, list[float]] = {}
        constant: dict[str, int] = {}
        for trained, after in zip(records, changed, strict=True):
            if trained.get("error") or trained["words_read"] < 2:
                continue
            n_words = trained["words_read"]
            for method, values in trained["scores"].items():
                if method not in after["scores"] or _constant(values[:n_words]):
                    continue
                randomised_values = after["scores"][method][:n_words]
                # spearmanr gives NaN for a constant input, which the mean would drop: the
                # scores that lost the most would vanish from the check and flatter its mean.
                if _constant(randomised_values):
                    rho = 0.0
                    constant[method] = constant.get(method, 0) + 1
                else:
                    rho = spearmanr(values[:n_words], randomised_values).statistic
                rhos.setdefault(method, []).append(float(rho))
        results[stage] = {
            method: {**_summary(values), "constant": constant.get(method, 0)}
            for method, values in rhos.items()
        }
    return results
