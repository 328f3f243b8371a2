"""Training and using the Hugging Face ``tokenizers`` tokenizer, and mapping tokens to words.

The tokenizer is trained on the training split only, serialised as JSON into every
checkpoint, and rebuilt from that JSON at predict time, so training and prediction always
split text the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Encoding, Tokenizer, models, normalizers, pre_tokenizers, trainers

from docclass.errors import ConfigError

PAD_TOKEN, UNK_TOKEN = "[PAD]", "[UNK]"
PAD_ID, UNK_ID = 0, 1  # fixed by the order of SPECIAL_TOKENS
SPECIAL_TOKENS = [PAD_TOKEN, UNK_TOKEN]
MODEL_AND_TRAINER = {
    "bpe": (models.BPE, trainers.BpeTrainer),
    "wordpiece": (models.WordPiece, trainers.WordPieceTrainer),
    "wordlevel": (models.WordLevel, trainers.WordLevelTrainer),
}
TOKENIZER_KINDS = tuple(MODEL_AND_TRAINER)
NORMALIZATIONS = ("NFC", "NFD", "NFKC", "NFKD", "none")


@dataclass
class TokenizerSpec:
    """How to train the tokenizer."""

    # bpe (subword; the default because its training is deterministic) | wordpiece (subword;
    # tokenizers 0.23's trainer breaks ties in hash order, so two runs can differ) | wordlevel
    # (whole words, the rest [UNK])
    kind: str = "bpe"
    vocab_size: int = 20000  # upper bound; a small corpus may yield fewer
    min_frequency: int = 2  # a piece must occur this often in the training split
    lowercase: bool = True
    normalization: str = "NFKC"  # unicode normal form applied first, or "none"
    strip_accents: bool = False

    def __post_init__(self) -> None:
        if self.kind not in TOKENIZER_KINDS:
            raise ConfigError(f"tokenizer kind must be one of {TOKENIZER_KINDS}, got {self.kind!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ConfigError(
                f"tokenizer normalization must be one of {NORMALIZATIONS}, "
                f"got {self.normalization!r}"
            )
        if self.vocab_size < len(SPECIAL_TOKENS) + 1:
            raise ConfigError(f"tokenizer vocab_size is too small: {self.vocab_size}")


def _normalizer(spec: TokenizerSpec) -> normalizers.Normalizer | None:
    steps = []
    if spec.normalization != "none":
        steps.append(getattr(normalizers, spec.normalization)())
    if spec.strip_accents:
        # StripAccents removes combining marks, which exist only after canonical decomposition.
        steps += [normalizers.NFD(), normalizers.StripAccents()]
    if spec.lowercase:
        steps.append(normalizers.Lowercase())
    return normalizers.Sequence(steps) if steps else None


def train_tokenizer(texts: Sequence[str], spec: TokenizerSpec) -> Tokenizer:
    """Train a tokenizer on ``texts`` (the training split)."""
    model_class, trainer_class = MODEL_AND_TRAINER[spec.kind]
    tokenizer = Tokenizer(model_class(unk_token=UNK_TOKEN))
    trainer = trainer_class(
        vocab_size=spec.vocab_size,
        min_frequency=spec.min_frequency,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
    )
    normalizer = _normalizer(spec)
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    # Splits on whitespace and punctuation; offsets still point into the original text.
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if spec.kind != "bpe":
        tokenizer = _canonical_ids(tokenizer)
    if tokenizer.token_to_id(PAD_TOKEN) != PAD_ID or tokenizer.token_to_id(UNK_TOKEN) != UNK_ID:
        raise RuntimeError("special tokens did not receive their fixed ids")
    return tokenizer


def _canonical_ids(tokenizer: Tokenizer) -> Tokenizer:
    """Renumber a WordPiece or word-level vocabulary: specials first, then sorted tokens.

    The WordPiece trainer numbers its initial alphabet in hash-map order, which changes from
    run to run. Renumbering makes equal vocabularies get equal ids; it cannot stop that trainer
    from sometimes choosing different tokens, which is why BPE is the default.
    """
    state = json.loads(tokenizer.to_str())
    tokens = state["model"]["vocab"]
    ordered = SPECIAL_TOKENS + sorted(t for t in tokens if t not in SPECIAL_TOKENS)
    state["model"]["vocab"] = {token: i for i, token in enumerate(ordered)}
    return Tokenizer.from_str(json.dumps(state))


def unknown_id(tokenizer: Tokenizer) -> int:
    """The id of the tokenizer's unknown token: ``UNK_ID`` for a trained tokenizer, wherever a
    pre-trained encoder's vocabulary puts it otherwise (100 in BERT's)."""
    unk = getattr(tokenizer.model, "unk_token", None) or UNK_TOKEN
    found = tokenizer.token_to_id(unk)
    return UNK_ID if found is None else found


def load_tokenizer(serialised: str) -> Tokenizer:
    """Rebuild a tokenizer from the JSON string stored in a checkpoint."""
    return Tokenizer.from_str(serialised)


def encode_batch(tokenizer: Tokenizer, texts: Sequence[str]) -> list[Encoding]:
    """Tokenize many texts at once (the Rust side uses every core).

    A special token written in a text ("the [PAD] bank") is read as ordinary text: it must never
    become the padding or unknown id, or a word would vanish from training and an all-"[PAD]"
    text would become an empty row. The setting is not saved in a tokenizer's JSON nor kept
    when it is pickled into a DataLoader worker, so it is set here, where every path encodes.
    Truncation and padding saved in a tokenizer's JSON are turned off here too: docclass cuts at
    ``max_tokens`` itself and says so (``truncated``), and padding would be read as words.
    """
    tokenizer.encode_special_tokens = True
    if tokenizer.truncation is not None:
        tokenizer.no_truncation()
    if tokenizer.padding is not None:
        tokenizer.no_padding()
    return tokenizer.encode_batch(list(texts), add_special_tokens=False)


def token_ids(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """The token ids of each text (a picklable encoder for DataLoader workers, with
    ``functools.partial``)."""
    return [encoding.ids for encoding in encode_batch(tokenizer, texts)]


@dataclass
class WordAlignment:
    """Tokens grouped into words, with character spans into the original text.

    ``word_spans[w]`` is ``(start, end)`` of word ``w``; ``token_words[t]`` is the word index
    of token ``t``.
    """

    word_spans: list[tuple[int, int]]
    token_words: list[int]


def align_words(encoding: Encoding) -> WordAlignment:
    """Group an encoding's tokens into the pre-tokenizer's words.

    A word is what the pre-tokenizer produced (a run of letters/digits, or one punctuation
    mark); its span runs from its first piece's start to its last piece's end, and pieces of
    one original character are never split across words.
    """
    word_spans: list[tuple[int, int]] = []
    token_words: list[int] = []
    previous_word = None
    for word_id, (start, end) in zip(encoding.word_ids, encoding.offsets, strict=True):
        # Normalisation can turn one character into several words ("…" → "..."): their
        # spans overlap the previous word's, and they stay part of it.
        overlaps = bool(word_spans) and start < word_spans[-1][1]
        if (word_id is None or word_id != previous_word) and not overlaps:
            word_spans.append((start, end))
            previous_word = word_id
        else:
            word_spans[-1] = (word_spans[-1][0], max(end, word_spans[-1][1]))
        token_words.append(len(word_spans) - 1)
    return WordAlignment(word_spans, token_words)
