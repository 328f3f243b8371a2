import pickle
import unicodedata

import pytest
from helpers import CORPUS, HARD_TEXTS

from docclass.data.tokenizer import (
    PAD_ID,
    UNK_ID,
    TokenizerSpec,
    align_words,
    encode_batch,
    load_tokenizer,
    train_tokenizer,
)
from docclass.errors import ConfigError


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "wordlevel"])
def test_special_ids_and_round_trip(kind):
    tokenizer = train_tokenizer(CORPUS, TokenizerSpec(kind=kind, vocab_size=300, min_frequency=1))
    assert tokenizer.token_to_id("[PAD]") == PAD_ID and tokenizer.token_to_id("[UNK]") == UNK_ID
    reloaded = load_tokenizer(tokenizer.to_str())
    text = "The striker rallied; chips ship!"
    assert reloaded.encode(text).ids == tokenizer.encode(text).ids
    assert PAD_ID not in tokenizer.encode(text).ids


def test_offsets_point_into_the_original_text():
    tokenizer = train_tokenizer(CORPUS, TokenizerSpec(vocab_size=200, min_frequency=1))
    text = "The  QUICK\tfox — jumps…  Café naïve"
    encoding = encode_batch(tokenizer, [text])[0]
    for token, (start, end) in zip(encoding.tokens, encoding.offsets, strict=True):
        assert 0 <= start < end <= len(text)
        piece = token.removeprefix("##")
        if token != "[UNK]":
            # The span is the original text the piece came from, before NFKC and lowercasing.
            assert piece in unicodedata.normalize("NFKC", text[start:end]).lower()


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
@pytest.mark.parametrize("text, words", HARD_TEXTS)
def test_tokens_group_into_words_with_exact_spans(text, words, kind):
    # A small vocabulary forces rare words into many pieces.
    tokenizer = train_tokenizer(CORPUS, TokenizerSpec(kind=kind, vocab_size=80, min_frequency=1))
    encoding = encode_batch(tokenizer, [text])[0]
    alignment = align_words(encoding)
    assert [text[s:e] for s, e in alignment.word_spans] == words
    assert len(alignment.token_words) == len(encoding.ids)
    assert alignment.token_words == sorted(alignment.token_words)


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_word_split_into_many_pieces_maps_to_one_word(kind):
    tokenizer = train_tokenizer(CORPUS, TokenizerSpec(kind=kind, vocab_size=100, min_frequency=1))
    encoding = encode_batch(tokenizer, ["strikerscored"])[0]
    assert UNK_ID not in encoding.ids
    assert len(encoding.ids) > 4
    assert set(align_words(encoding).token_words) == {0}


def test_lowercase_setting():
    upper = train_tokenizer(
        CORPUS, TokenizerSpec(kind="wordlevel", lowercase=False, min_frequency=1)
    )
    lower = train_tokenizer(
        CORPUS, TokenizerSpec(kind="wordlevel", lowercase=True, min_frequency=1)
    )
    assert upper.encode("THE").ids == [UNK_ID]
    assert lower.encode("THE").ids != [UNK_ID]


def test_strip_accents_setting():
    plain = train_tokenizer(
        ["cafe cafe"], TokenizerSpec(kind="wordlevel", strip_accents=True, min_frequency=1)
    )
    assert plain.encode("café").ids == plain.encode("cafe").ids


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(kind="unigram"), "tokenizer kind"),
        (dict(normalization="NFX"), "normalization"),
        (dict(vocab_size=2), "vocab_size"),
    ],
)
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        TokenizerSpec(**settings)


@pytest.mark.parametrize("kind", ["bpe", "wordlevel"])
def test_training_is_deterministic(kind):
    texts = [f"{line} number{i} {i * 7}th" for i, line in enumerate(CORPUS * 3)]
    spec = TokenizerSpec(kind=kind, vocab_size=400, min_frequency=1)
    assert train_tokenizer(texts, spec).to_str() == train_tokenizer(texts, spec).to_str()


@pytest.mark.fault(
    'a document that writes a special token ("the [PAD] bank", or only "[PAD]")',
    "read as ordinary text: never the padding or unknown id, never an empty row",
)
def test_special_tokens_written_in_a_text_are_read_as_text():
    tokenizer = train_tokenizer(CORPUS, TokenizerSpec(vocab_size=120, min_frequency=1))
    with_pad, only_pad, only_unk = encode_batch(tokenizer, ["the [PAD] bank", "[PAD]", "[UNK]"])
    assert PAD_ID not in with_pad.ids and PAD_ID not in only_pad.ids and only_pad.ids
    # Its letters are read; the brackets, unseen in training, may be unknown characters.
    assert "[PAD]" not in only_pad.tokens and len(only_unk.ids) > 1
    # A tokenizer rebuilt from a checkpoint's JSON, or unpickled in a DataLoader worker, loses
    # the setting: encoding must set it again.
    for copy in (load_tokenizer(tokenizer.to_str()), pickle.loads(pickle.dumps(tokenizer))):
        assert encode_batch(copy, ["[PAD]"])[0].ids == only_pad.ids
