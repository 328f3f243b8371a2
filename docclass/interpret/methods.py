"""The word-score methods, behind one registry.

One forward pass per batch (:func:`scoring_pass`) gathers what every method reads; each entry
of :data:`BATCH_METHODS` turns that pass into one score per token ``[B,T]`` (names and help in
:data:`docclass.interpret.records.METHODS`). Token scores are summed over a word's pieces by
the record builder. Integrated gradients, which needs dozens of passes per document, lives in
:mod:`docclass.interpret.integrated_gradients`.

==================  ======  ==================================================================
name                signed  what it is
==================  ======  ==================================================================
attention           no      the global pool's weights, mean over its heads; sums to 1
attention_head<h>   no      one pool head's weights; sums to 1
contribution        yes     the token's exact additive share of the predicted class's logit
                            (the read-out after the pool is linear); sums to logit − bias
rollout             no      attention rollout (Abnar & Zuidema 2020): per block Â = ½A + ½I
                            with heads averaged, multiplied through the blocks, then weighted by
                            the pool's mean attention; sums to 1
grad_input          yes     gradient of the predicted class's lead over its rivals × the token
                            embedding (positions excluded), summed over the embedding width;
                            every LayerNorm's scale and GELU gate held constant (LRP-0; through
                            a LayerNorm the plain gradient · input is ~0), attention
                            differentiated
conservative        yes     conservative propagation (Ali et al. 2022): the predicted class's
                            lead over its rivals carried back through every block with
                            attention probabilities, LayerNorm scales and GELU gates held
                            constant, and LRP-γ (γ = 0.01) at the blocks' linear layers, to
                            what each token brings to the first block; with what no word
                            causes (the biases and norm offsets), sums to the lead exactly
==================  ======  ==================================================================

Both gradient methods explain the predicted class's lead over its rivals (:data:`EXPLAINED`):
its logit minus the rival classes' logits averaged with weights in proportion to their (raw,
uncalibrated) probabilities, the weights held constant. Its gradient is the log-probability's
divided by the rivals' total probability. Integrated gradients explains the logit.

With encoder windows (``window_tokens``) every method covers the whole document: the pool
reads every token, and rollout is carried back through each window row's attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from docclass.interpret.records import HEAD_PREFIX
from docclass.nn import relevance
from docclass.nn.attention import banded_flow
from docclass.nn.model import DocumentClassifier
from docclass.nn.windows import WindowLayout

# The relevance rules recorded as word-score methods, by method name. AttnLRP's rule
# (``"attnlrp"`` in :mod:`docclass.nn.relevance`) measured less faithful than conservative
# propagation on the BBC MiniLM model under both removals (docs/faithfulness.md); it stays a
# rule that ``word_relevance`` can apply, not a method the records carry.
RELEVANCE_METHODS = {"conservative": "cp-gamma"}

QUANTITIES = ("lead", "logit")
# What gradient × input and conservative propagation explain: the predicted class's lead over
# its rivals (:func:`explained_quantity`), so a word that also speaks for a rival class counts
# for less. Its gradient is the log-probability's divided by the rivals' total probability, so
# each document's words rank as the log-probability ranks them, while the scores stay in logit
# units however sure the model is (the log-probability's gradient shrinks with that total and,
# in float32, vanishes once the class's probability rounds to 1). Chosen on BBC's validation
# split over the logit (80 articles, masking, measured as the log-probability): conservative
# propagation removed 0.449 against 0.442 through the demo model and 0.468 against 0.466 (a
# tie) through the fully fine-tuned MiniLM; gradient × input 0.346 against 0.338 and 0.282
# against 0.278, beating random on 97.5 % of articles against 95 % on the latter
# (docs/faithfulness.md).
EXPLAINED = "lead"


def score_rules() -> str:
    """What the relevance methods' scores are (read when called, as the methods read them),
    written beside every report and faithfulness table: a report explained under other rules
    (these changed while the weights stayed the same) is not rendered again with this code's
    figures and method descriptions, nor its table mixed with theirs. Changing any rule's
    backward pass should change this string."""
    return (
        f"conservative: {RELEVANCE_METHODS['conservative']} (gamma {relevance.GAMMA}); "
        f"conservative and grad_input explain the predicted class's {EXPLAINED}; "
        "conservative read where each token enters the first block"
    )


@dataclass
class ScoringPass:
    """One batch's forward pass with everything the methods read (detached).

    Shapes: B batch, T tokens, H pool heads, C classes.
    """

    logits: torch.Tensor  # [B,C]
    predicted: torch.Tensor  # [B] long
    pool_weights: torch.Tensor  # [B,H,T]
    contributions: torch.Tensor  # [B,T,C]
    layer_weights: list[torch.Tensor]  # per block [B,H or 1,T,T] (banded if windowed; per row
    # [N,H,L,L] with encoder windows); H is 1, the heads' mean, unless per-head was asked
    head_weights: bool  # whether layer_weights hold every head
    windows: WindowLayout | None  # where tokens sat in the window rows (encoder windows)
    grad_input: torch.Tensor  # [B,T]
    relevance: dict[str, torch.Tensor]  # [B,T] per relevance method


def scoring_pass(
    model: DocumentClassifier,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    relevance_methods: tuple[str, ...] = tuple(RELEVANCE_METHODS),
    head_weights: bool = False,
) -> ScoringPass:
    """Run one padded batch with gradients on the word vectors and where the tokens enter the
    first block (eval mode).

    The first relevance rule's pass also gives the logits, the pool's and every block's
    attention and the token states (a rule changes gradients, never values). Conservative
    propagation and gradient × input differ only in their backward passes (whether the attention
    probabilities pass relevance on, and how the linear layers split it), so when the first rule
    is ``cp-gamma`` one forward pass serves both (an
    :class:`~docclass.nn.relevance.AttentionValve`, closed for the first backward pass and open
    for the second): explaining BBC's test split through MiniLM took 86 s instead of 92 (with
    LRP-0 at the linear layers; LRP-γ's backward pass made it 113 s, and 80 s once it took its
    sums from one product with ``|W|``, on other days: ``make report-speed``). Any
    further rule takes one more forward and backward pass.

    Every block's attention comes back averaged over its heads (all rollout reads), or per
    head with ``head_weights`` (the word-to-word maps of short documents)."""
    # Callers may sit inside Lightning's validation loop, which runs in inference mode (and
    # perhaps autocast); gradient × input needs ordinary tensors, autograd and full precision.
    no_autocast = torch.autocast(input_ids.device.type, enabled=False)
    rule = RELEVANCE_METHODS[relevance_methods[0]] if relevance_methods else "gradient"
    valve = relevance.AttentionValve() if rule == "cp-gamma" else None
    with torch.inference_mode(False), torch.enable_grad(), no_autocast:
        input_ids, mask = ordinary(input_ids), ordinary(mask)
        inputs = ReadPoints.of(model, input_ids, mask)
        out = model(
            input_ids,
            mask,
            need_layer_weights=True if head_weights else "mean",
            token_vectors=inputs.vectors,
            propagation=valve if valve is not None else rule,
            entry_scale=inputs.entry,
        )
        predicted = out.logits.argmax(dim=-1)
        # Documents do not interact in eval mode, so one backward pass serves the whole batch.
        target = explained_quantity(out.logits, predicted, EXPLAINED).sum()
        if valve is not None:
            valve.open = False  # this backward pass: conservative propagation
        first_scores = inputs.scores(target, rule, retain_graph=valve is not None)
        if valve is not None:
            valve.open = True  # the same graph, freed after this pass: gradient × input
            grad_input = inputs.scores(target, "gradient")
        elif relevance_methods:
            grad_input = word_relevance(model, input_ids, mask, predicted, "gradient")
        else:
            grad_input = first_scores
        scores = {}
        if relevance_methods:
            scores[relevance_methods[0]] = first_scores
            for name in relevance_methods[1:]:
                scores[name] = word_relevance(
                    model, input_ids, mask, predicted, RELEVANCE_METHODS[name]
                )
        with torch.no_grad():
            pool_weights = out.pool_weights.detach()
            return ScoringPass(
                logits=out.logits.detach(),
                predicted=predicted,
                pool_weights=pool_weights,
                contributions=model.token_contributions(out.token_states.detach(), pool_weights),
                layer_weights=[weights.detach() for weights in out.layer_weights or []],
                head_weights=head_weights,
                windows=out.windows,
                grad_input=grad_input,
                relevance=scores,
            )


def ordinary(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """``tensor`` as one autograd may save: a tensor made in inference mode (a caller's
    ``torch.inference_mode()``, Lightning's evaluation loops) cannot be, even once that mode
    is left, so it is copied (outside inference mode)."""
    return tensor.clone() if tensor is not None and tensor.is_inference() else tensor


def explained_quantity(logits: torch.Tensor, target: torch.Tensor, quantity: str) -> torch.Tensor:
    """``[B]``: what a gradient method explains for class ``target [B]``: its ``"logit"``, or
    its ``"lead"`` over its rivals, ``logit_c − Σ_{k≠c} q_k·logit_k`` with ``q`` the rivals'
    probabilities renormalised among themselves and held constant (so the lead is linear in
    the logits, and a rule that conserves each logit conserves it; with two classes it is the
    logit difference)."""
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity must be one of {QUANTITIES}, got {quantity!r}")
    own = logits.gather(1, target[:, None])[:, 0]
    if quantity == "logit" or logits.shape[1] == 1:
        return own
    # A softmax over the rivals alone: exact however far the class leads (1 − p computed as
    # 1 − softmax would round to 0 in float32).
    rivals = logits.detach().scatter(1, target[:, None], float("-inf")).softmax(dim=-1)
    # A rival logit of -inf gets weight 0 and adds nothing (rather than 0·-inf = NaN).
    return own - torch.where(rivals > 0, rivals * logits, 0.0).sum(dim=-1)


def word_relevance(
    model: DocumentClassifier,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    target: torch.Tensor,
    propagation: str,
    positions: torch.Tensor | None = None,
    against: torch.Tensor | None = None,
    quantity: str | None = None,
) -> torch.Tensor:
    """``[B,T]``: each token's relevance for class ``target [B]`` under a rule of
    :mod:`docclass.nn.relevance` (gradient × input read where the rule reads it:
    :class:`ReadPoints`),
    explaining what ``quantity`` names: by default the records' quantity, :data:`EXPLAINED`
    (read when called, as :func:`scoring_pass` reads it; its lead over its rivals), or its
    logit.

    With ``against [B]``, the relevance for ``target``'s logit minus ``against``'s (the same as
    their log-probabilities' difference), whatever ``quantity``: why one class rather than the
    other. Every rule holds its scales and gates constant, so its backward pass is linear in
    what it starts from, and this equals the relevance for ``target`` minus that for
    ``against``, in one pass."""
    quantity = EXPLAINED if quantity is None else quantity
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity must be one of {QUANTITIES}, got {quantity!r}")
    with torch.inference_mode(False), torch.enable_grad():
        input_ids, mask, positions = ordinary(input_ids), ordinary(mask), ordinary(positions)
        target, against = ordinary(target), ordinary(against)
        inputs = ReadPoints.of(model, input_ids, mask)
        logits = model(
            input_ids,
            mask,
            token_vectors=inputs.vectors,
            positions=positions,
            propagation=propagation,
            entry_scale=inputs.entry,
        ).logits
        if against is not None:
            explained = logits.gather(1, target[:, None]) - logits.gather(1, against[:, None])
        else:
            explained = explained_quantity(logits, target, quantity)
        return inputs.scores(explained.sum(), propagation)


@dataclass
class ReadPoints:
    """Where a rule's gradient × input is read, per token: the two inputs with gradients.

    - Conservative propagation (``cp``, ``cp-gamma``) reads it at what each token brings to
      the first block, ``entry`` (:class:`DocumentClassifier`'s ``entry_scale``): its word
      and position vectors after the embedding norm, both of which masking the token removes.
      Read at the word's vector alone, the position's share went to what no word causes. On
      BBC's whole validation split (masking) conservative propagation's comprehensiveness rose
      from 0.443 to 0.448 through the demo model and from 0.451 to 0.464 through the fully
      fine-tuned MiniLM, and its sufficiency fell (improved) from 0.204 to 0.124 and from
      0.108 to 0.045 (docs/faithfulness.md). On the fully fine-tuned model's test split it
      rose from 0.4465 to 0.4585 under masking and fell from 0.431 to 0.421 under deletion
      (which shifts the later tokens' positions; presumably the cause, not measured), on the
      demo model's from 0.444 to 0.454 (masking). On the planted-keyword MiniLM it lost
      (0.644 to 0.555 under masking, the keyword still first everywhere): chosen on BBC, not
      shown general.
    - Gradient × input reads it at the word's vector, ``vectors`` (the embedding norm's scale
      held): read at the entry it gained on the demo model but lost on the fully fine-tuned
      one (0.237 to 0.221, beating random on 85 % of articles instead of 91 %). Plain
      gradients and AttnLRP (whose figures were measured there) read it there too.
    """

    mask: torch.Tensor  # [B,T] bool, True = real token
    words: torch.Tensor  # [B,T,D] the word vectors (detached)
    vectors: torch.Tensor  # [B,T,D] the same, with gradients
    entry: torch.Tensor  # [B,T] ones with gradients

    @classmethod
    def of(cls, model: DocumentClassifier, input_ids: torch.Tensor, mask: torch.Tensor):
        words = model.token_vectors(input_ids).detach()
        entry = torch.ones(mask.shape, dtype=words.dtype, device=mask.device, requires_grad=True)
        return cls(mask, words, words.clone().requires_grad_(True), entry)

    def scores(
        self, target: torch.Tensor, propagation: str, retain_graph: bool = False
    ) -> torch.Tensor:
        """``[B,T]``: gradient × input of ``target`` (a scalar) under ``propagation``, read
        where that rule reads it; 0 on padding."""
        if propagation in relevance.CONSERVATIVE:
            (gradient,) = torch.autograd.grad(target, self.entry, retain_graph=retain_graph)
            per_token = gradient
        else:  # gradient × input, plain autograd and AttnLRP (measured there) read the word
            (gradient,) = torch.autograd.grad(target, self.vectors, retain_graph=retain_graph)
            per_token = (gradient * self.words).sum(dim=-1)
        return (per_token * self.mask).detach()


def attention_rollout(
    layer_weights: list[torch.Tensor],
    pool_mean: torch.Tensor,
    windows: WindowLayout | None = None,
) -> torch.Tensor:
    """``pool_mean [B,T]`` carried back through every block's ``Â = ½·mean_h(A) + ½·I``."""
    return rollout_by_depth(layer_weights, pool_mean, windows)[-1] if layer_weights else pool_mean


def rollout_by_depth(
    layer_weights: list[torch.Tensor],
    pool_mean: torch.Tensor,
    windows: WindowLayout | None = None,
) -> list[torch.Tensor]:
    """The rollout after each block from the top: entry ``k - 1`` is ``pool_mean [B,T]``
    carried back through the top ``k`` blocks, so a report can show how credit spreads with
    depth (the last entry is :func:`attention_rollout`). With encoder windows the flow runs
    through each window row (its owned tokens start it) and the copies of a token in two
    overlapping windows are summed."""
    if windows is not None:
        flow = windows.to_rows(pool_mean[..., None], owners_only=True)[..., 0]  # (N, L)
        depths = []
        for weights in reversed(layer_weights):
            flow = 0.5 * (flow.unsqueeze(1) @ weights.mean(dim=1)).squeeze(1) + 0.5 * flow
            depths.append(windows.to_tokens(flow[..., None], *pool_mean.shape, False)[..., 0])
        return depths
    depths = []
    flow = pool_mean  # (B, T)
    for weights in reversed(layer_weights):
        mixed = weights.mean(dim=1)  # (B, T, T) rows: queries; banded (B, nb, w, 3w) if windowed
        carried = (
            banded_flow(flow, mixed) if mixed.dim() == 4 else (flow.unsqueeze(1) @ mixed).squeeze(1)
        )
        # flow · (½A + ½I) without building the identity matrix.
        flow = 0.5 * carried + 0.5 * flow
        depths.append(flow)
    return depths


def predicted_class_contribution(
    contributions: torch.Tensor, predicted: torch.Tensor
) -> torch.Tensor:
    """``[B,T,C]`` contributions → ``[B,T]``: each token's share of its document's predicted
    class (``predicted [B]``)."""
    index = predicted[:, None, None].expand(-1, contributions.shape[1], 1)
    return contributions.gather(2, index).squeeze(2)


def _predicted_contribution(scoring: ScoringPass) -> torch.Tensor:
    return predicted_class_contribution(scoring.contributions, scoring.predicted)


BATCH_METHODS: dict[str, Callable[[ScoringPass], torch.Tensor]] = {
    "attention": lambda scoring: scoring.pool_weights.mean(dim=1),
    "contribution": _predicted_contribution,
    "rollout": lambda scoring: attention_rollout(
        scoring.layer_weights, scoring.pool_weights.mean(dim=1), scoring.windows
    ),
    "grad_input": lambda scoring: scoring.grad_input,
    **{name: (lambda scoring, name=name: scoring.relevance[name]) for name in RELEVANCE_METHODS},
}


def token_scores(scoring: ScoringPass) -> dict[str, torch.Tensor]:
    """Every registered method's ``[B,T]`` token scores, then one entry per pool head."""
    scores = {name: method(scoring) for name, method in BATCH_METHODS.items()}
    for head in range(scoring.pool_weights.shape[1]):
        scores[f"{HEAD_PREFIX}{head}"] = scoring.pool_weights[:, head]
    return scores
