"""Cleaning and splitting: empty and duplicate documents out, labels numbered, stratified splits.

De-duplication runs before splitting (a copy of a test document in train inflates accuracy);
held-out splits win, so a training copy of a test text is the one removed.
"""

from __future__ import annotations

import hashlib
import logging
import unicodedata

import datasets

from docclass.errors import DataError

log = logging.getLogger(__name__)


def whitespace_key(text: str) -> str:
    """Texts that differ only in whitespace are the same document."""
    return " ".join(text.split())


# split.json's key for each named document's text hash (absent from older and hand-made files).
TEXT_HASHES = "text_sha256"


def text_hash(text: str) -> str:
    """The first 16 hex digits of the SHA-256 of the text's words: enough to tell an edited
    document, while a re-save that only changed line endings or spacing (the same document to
    de-duplication) is no edit."""
    return hashlib.sha256(whitespace_key(text).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def drop_empty(dataset: datasets.Dataset) -> tuple[datasets.Dataset, int]:
    """Remove documents that are missing or whitespace only."""
    keep = [i for i, text in enumerate(dataset["text"]) if text is not None and text.strip()]
    return dataset.select(keep), len(dataset) - len(keep)


def deduplicate(
    dataset: datasets.Dataset, also_remove: set[str] = frozenset()
) -> tuple[datasets.Dataset, int]:
    """Keep the first copy of each text (up to whitespace); drop texts listed in ``also_remove``.

    A text that occurs with two different labels is dropped altogether: no label can be right.
    """
    first_label: dict[str, int] = {}
    conflicting: set[str] = set()
    keys = [whitespace_key(text) for text in dataset["text"]]
    for key, label in zip(keys, dataset["label"], strict=True):
        if first_label.setdefault(key, label) != label:
            conflicting.add(key)
    seen: set[str] = set()
    keep = []
    for i, key in enumerate(keys):
        if key in seen or key in conflicting or key in also_remove:
            continue
        seen.add(key)
        keep.append(i)
    if conflicting:
        log.warning("%d texts carry conflicting labels and were dropped", len(conflicting))
    return dataset.select(keep), len(dataset) - len(keep)


def label_sort_key(name: str) -> tuple[int, int | str]:
    """Integer label names sort as numbers ("2" before "10"), the rest as text, after them;
    "007" and "7" by their spelling, so the order never depends on a set's."""
    try:
        return (0, int(name), name)
    except ValueError:
        return (1, 0, name)


def encode_labels(
    splits: dict[str, datasets.Dataset],
    source_names: list[str] | None,
    wanted_names: list[str] | None,
    source: str,
) -> tuple[dict[str, datasets.Dataset], list[str]]:
    """Turn labels into ids ``0..C-1`` over one list of label names.

    Args:
        splits: datasets with a ``label`` column.
        source_names: the source's own class order (ClassLabel, class folders), if any; the
            labels themselves are names by now (``load_source`` decodes each split's integers).
        wanted_names: the label order to use (a checkpoint's); default: the source's names, or
            the sorted distinct training labels.
        source: the source's name, for error messages.
    """

    def as_names(values: list) -> list[str]:
        return [str(v) for v in values]

    for split, dataset in splits.items():
        # A missing label must not become a class named "None" (or ""), trained and scored.
        blank = [i for i, v in enumerate(dataset["label"]) if v is None or not str(v).strip()]
        if blank:
            raise DataError(
                f"{source} ({split}): {len(blank)} document(s) have no label (first: id "
                f"{dataset['id'][blank[0]]!r}); fill the label or drop those rows"
            )

    trained = set(as_names(splits["train"]["label"]))
    if not wanted_names and not source_names:
        refuse_spellings_of_one_label(trained, source)
    label_names = wanted_names or source_names or sorted(trained, key=label_sort_key)
    index = {name: i for i, name in enumerate(label_names)}
    if not wanted_names:
        # A source's class list (ClassLabel) can name a class no training document has: its
        # held-out documents would all be scored wrong, as a plain label's are refused below.
        index = {name: i for name, i in index.items() if name in trained}
    encoded = {}
    for split, dataset in splits.items():
        names = as_names(dataset["label"])
        unseen = sorted(set(names) - index.keys())
        if unseen:
            known = "the checkpoint's labels" if wanted_names else "the training split's labels"
            raise DataError(
                f"{source} ({split}): label(s) {unseen[:5]} are not among {known} "
                f"{[name for name in label_names if name in index][:10]}; fix label_column or "
                "the data"
            )
        ids = [index[name] for name in names]
        encoded[split] = dataset.remove_columns("label").add_column("label", ids)
    return encoded, label_names


def refuse_classes_without_training(
    splits: dict[str, datasets.Dataset], label_names: list[str], source: str
) -> None:
    """Refuse held-out documents of a class no training document has once the splits are
    final: :func:`encode_labels` checks the labels as read, but cleaning can remove a class's
    every training document (empty texts, copies of held-out ones). Its held-out documents
    could never be labelled right, and the model would be scored on a class it never saw."""
    trained = set(splits["train"]["label"])
    for split, dataset in splits.items():
        missing = sorted(set(dataset["label"]) - trained)
        if split != "train" and missing:
            names = [label_names[i] for i in missing]
            raise DataError(
                f"{source} ({split}): class(es) {names[:5]} have no training document left "
                "after empty and duplicate documents were dropped (or after splitting); add "
                "training documents of them, or drop their held-out ones"
            )


def refuse_spellings_of_one_label(
    names: set[str], source: str, fix: str = "spell each class one way in the data"
) -> None:
    """Labels that differ only in case, surrounding spaces, Unicode form or invisible
    characters (``"sport"``, ``" sport"``, ``"Sport"``, NFC and NFD ``"café"``) are one class
    spelt twice; trained apart, each would get half its documents."""
    spellings: dict[str, list[str]] = {}
    for name in sorted(names):
        spellings.setdefault(_label_key(name), []).append(name)
    twice = [found for found in spellings.values() if len(found) > 1]
    if twice:
        raise DataError(
            f"{source}: label(s) {ascii(twice[0])} differ only in case, spaces or Unicode form"
            f"{f' (and {len(twice) - 1} more such group(s))' if len(twice) > 1 else ''}; {fix}"
        )


# Characters that show nothing: zero-width space, word joiner, byte-order mark, soft hyphen,
# and the direction marks, embeddings and isolates.
INVISIBLE = dict.fromkeys(
    map(
        ord,
        "\u200b\u2060\ufeff\u00ad\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
        "\u2066\u2067\u2068\u2069",
    )
)


def _label_key(name: str) -> str:
    """A label as a reader sees it: composed and decomposed forms alike (NFC; not NFKC, which
    would take CO₂ for CO2), invisible characters dropped, case and surrounding spaces
    ignored."""
    return unicodedata.normalize("NFC", name).translate(INVISIBLE).strip().casefold()


def stratified_split(
    dataset: datasets.Dataset, fraction: float, seed: int, label_names: list[str], what: str
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Split off ``fraction`` of ``dataset`` with every class in proportion."""
    typed = dataset.cast_column("label", datasets.ClassLabel(names=label_names))
    try:
        parts = typed.train_test_split(test_size=fraction, stratify_by_column="label", seed=seed)
    except ValueError as error:
        raise DataError(
            f"cannot split off a stratified {what} set of {fraction:.0%} from {len(dataset)} "
            f"documents ({error}); give more documents per class or change the fraction"
        ) from error
    return parts["train"], parts["test"]
