"""Which word-score method a page shows first: the one its own faithfulness table trusts most.

The rule: among the methods whose sufficiency is below the random ranking's (their top words,
kept alone, hold the prediction better than random words do), the highest comprehensiveness;
methods within :data:`TIE` of each other count as tied, and the cheaper one wins. A chosen
method no more comprehensive than random (within :data:`TIE`) is still shown first, and its
reason says so. Without a measured table, the method docclass's benchmarks found most faithful
on every model is shown (:data:`UNMEASURED_DEFAULT`), and the reason says it was not measured
here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from docclass.interpret.records import method_label

# Cheapest first: pool attention is read off the forward pass; contribution multiplies the
# token states by the read-out; rollout multiplies every block's attention; gradient × input
# needs a backward pass, each relevance rule a forward and a backward pass of its own;
# integrated gradients dozens of them.
COST_ORDER = (
    "attention",
    "contribution",
    "rollout",
    "grad_input",
    "conservative",
    "integrated_gradients",
)
# Comprehensiveness values closer than this are the same figure for choosing: AOPC means over a
# report's documents move by about this much between seeds of the random floor.
TIE = 0.005
# Conservative propagation was the most faithful method (or tied for it) on every model
# measured before its read point moved to the first block's entry: the from-scratch BBC model
# (comprehensiveness 0.531 against class contribution's 0.497), the whole-document MiniLM (0.445
# against 0.210), and the planted keyword through one block and through six (first in 100 % of
# documents; class contribution 40 % through one block, tied with it without a block). Those
# figures are LRP-0's at the linear layers; LRP-γ, the rule now, removed 0.008 to 0.009 more on
# BBC's validation split through both MiniLM models (fully fine-tuned and make demo's);
# explaining the class's lead over its rivals rather than its logit (the rule now) removed as
# much or more on validation and 0.4465 against 0.4461 on the fully fine-tuned model's test
# split. Read at the first block's entry (the rule now) it removed 0.4585 there and is still
# first on every BBC model under masking; the exception is the planted-keyword MiniLM under
# masking, where it is third (0.555 against gradient × input's 0.644; first under deletion).
# docs/faithfulness.md. Class contribution is exact only at the pool, which says little of the
# words once blocks have mixed them.
UNMEASURED_DEFAULT = "conservative"
# The name a model's report's own faithfulness table goes by among its tables: the one table
# the default is chosen from, by the report's pages and the API alike.
REPORT_TABLE = "report sample"


@dataclass(frozen=True)
class DefaultMethod:
    """The chosen method's key and one line saying why."""

    method: str
    reason: str


def default_method(table: dict[str, dict[str, Any]] | None, documents: int = 0) -> DefaultMethod:
    """Choose the default method from a faithfulness table (``{method: {comprehensiveness,
    sufficiency, ...}, "random": {...}}`` as :func:`docclass.evaluate.erasure.
    aggregate_faithfulness` returns it). Per-head views are not candidates: one head is a part
    of the pool's attention, not a method."""
    candidates = {name: row for name, row in (table or {}).items() if name in COST_ORDER}
    if not candidates or "random" not in (table or {}):
        return DefaultMethod(
            UNMEASURED_DEFAULT,
            f"{method_label(UNMEASURED_DEFAULT)} is shown first: faithfulness was not measured "
            "for this model, and it was the most faithful method (or tied for it) on every "
            "model docclass's benchmarks measured.",
        )
    random = table["random"]  # type: ignore[index]
    sufficient = {
        name: row for name, row in candidates.items() if row["sufficiency"] < random["sufficiency"]
    }
    pool = sufficient or candidates
    best = max(row["comprehensiveness"] for row in pool.values())
    tied = [name for name, row in pool.items() if best - row["comprehensiveness"] <= TIE]
    chosen = min(tied, key=COST_ORDER.index)
    row = candidates[chosen]
    where = f" on {documents} documents" if documents else ""
    ratio = (
        f", {row['comprehensiveness'] / random['comprehensiveness']:.1f}× random's"
        if random["comprehensiveness"] > 1e-3
        else ""
    )
    if sufficient:
        why = (
            f"the highest comprehensiveness ({row['comprehensiveness']:.3f}{ratio}) among the "
            f"methods whose sufficiency is below random's ({row['sufficiency']:.3f} < "
            f"{random['sufficiency']:.3f})"
        )
    else:
        why = (
            f"the highest comprehensiveness ({row['comprehensiveness']:.3f}{ratio}); no method's "
            f"sufficiency was below random's ({random['sufficiency']:.3f}), so trust it less"
        )
    if len(tied) > 1:
        others = ", ".join(method_label(name) for name in tied if name != chosen)
        why += f"; tied with {others}, and cheaper"
    warning = ""
    if row["comprehensiveness"] - random["comprehensiveness"] <= TIE:
        # Said plainly rather than replaced by the unmeasured default: this table is the only
        # measurement of this model, and a method it did not choose would be shown on trust
        # the figures do not give; the reader must know the words shown first mean little.
        warning = (
            f"; but its comprehensiveness is not above random's ({random['comprehensiveness']:.3f})"
            f" by more than {TIE}: removing its top words moves the prediction no more than "
            "removing random words, so do not read its scores as the reasons for a prediction"
        )
    return DefaultMethod(chosen, f"{method_label(chosen)} is shown first: {why}{where}{warning}.")
