"""Training from the pre-trained MiniLM: its own learning rate, freezing, and a whole run (fit,
test, every word-score method, faithfulness, the report) on a tiny slice of BBC."""

import copy as copy_module
import json
import re

import pytest
import torch
from helpers import CONFIGS

from docclass.artifacts.encoders import is_encoder_parameter
from docclass.artifacts.load import load_classifier
from docclass.cli import main
from docclass.errors import ConfigError
from docclass.interpret.explain import explain_documents
from docclass.interpret.records import read_jsonl
from docclass.train.lit_module import DocClassifierModule, native_cpu_bf16

MINILM_VOCAB = 30522


def test_pretrained_part_and_new_head_get_their_own_learning_rates():
    module = DocClassifierModule(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", lr=1e-3, encoder_lr=5e-5
    )
    names = {id(p): n for n, p in module.model.named_parameters()}
    groups = module.parameter_groups()
    for group in groups:
        kinds = {is_encoder_parameter(names[id(p)]) for p in group["params"]}
        assert len(kinds) == 1, "a group mixes pre-trained and new parameters"
        assert group["lr"] == (5e-5 if kinds.pop() else 1e-3)
    assert sum(len(g["params"]) for g in groups) == len(names)
    # The encoder's weights are the checkpoint's, not a fresh start (sanity: LayerNorm gains
    # are 1 at initialisation; MiniLM's are not).
    assert not torch.allclose(module.model.final_norm.weight, torch.ones(384))


def test_frozen_encoder_is_left_out_of_the_optimiser():
    module = DocClassifierModule(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", freeze_encoder=True
    )
    trained = {n for n, p in module.model.named_parameters() if p.requires_grad}
    assert trained and all(n.split(".")[0] in {"pool", "head"} for n in trained)
    in_optimiser = sum(len(g["params"]) for g in module.parameter_groups())
    assert in_optimiser == len(trained)


def test_minilm_run_end_to_end_on_a_tiny_slice(tmp_path):
    """Fit from MiniLM on whole documents cut into windows, test, and write the report: every
    method scores every word read, the rollout runs through all six pre-trained blocks, and
    faithfulness is measured. Windows of 16 tokens and documents cut at 48 keep it quick while
    every document spans three windows."""
    main([
        "fit", "--config", str(CONFIGS / "minilm.yaml"),
        "--model.window_tokens", "16", "--data.max_tokens", "48",
        "--data.max_docs_per_class", "6", "--trainer.max_epochs", "1",
        "--trainer.min_epochs", "1", "--report_max_documents", "6",
        "--report_faithfulness_documents", "3", "--trainer.default_root_dir", str(tmp_path),
    ])  # fmt: skip
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["config"]["model"]["encoder"] == "minilm"
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    config = checkpoint["docclass"]["model_config"]
    assert (config["d_model"], config["n_layers"], config["norm"]) == (384, 6, "post")
    assert config["window_tokens"] == 16
    records = read_jsonl(tmp_path / "report" / "explanations.jsonl.gz")
    assert len(records) == 6 and all(r["tokens_read"] == 48 for r in records)
    methods = set(records[0]["scores"])
    assert {"attention", "contribution", "grad_input", "rollout", "conservative"} <= methods
    for record in records:
        assert set(record["scores"]) == methods
        assert all(len(s) == len(record["words"]) for s in record["scores"].values())
        # The pool and the relevance reach the last window, not only the first.
        last_words = range(record["words_read"] * 2 // 3, record["words_read"])
        assert any(record["scores"]["attention"][w] > 0 for w in last_words)
        assert any(record["scores"]["conservative"][w] != 0 for w in last_words)
    faithfulness = json.loads((tmp_path / "report" / "report.json").read_text())["faithfulness"]
    assert (
        faithfulness["documents"] == 3
        and "a sample of 3 of the 6 documents" in (faithfulness["sample"])
    )
    assert {"attention", "contribution", "rollout", "grad_input"} <= set(faithfulness["methods"])
    # Every page offers the rollout through the top 1…6 of MiniLM's blocks.
    records_with_depths = [r for r in records if len(r.get("rollout_depths", [])) == 5]
    assert len(records_with_depths) == len(records)
    pages = [p for p in (tmp_path / "report").rglob("*.html") if p.name != "index.html"]
    html = pages[0].read_text()
    assert '<select id="depth">' in html and "all 6 blocks" in html and "the top 5 blocks" in html
    # A short document's page carries every block's word-to-word attention (one window: six
    # blocks of twelve heads); a long one's is not drawn (its windows would be partial maps).
    # Loaded back from the checkpoint alone, which brings its windows.
    classifier = load_classifier(tmp_path / "checkpoints" / "last.ckpt")
    short, long = explain_documents(
        classifier, ["Shares rose after the bank's profits doubled.", records[0]["text"]]
    )
    assert [len(layer) for layer in short["layer_maps"]] == [12] * 6
    assert len(short["layer_maps"][0][0]) == len(short["words"])
    assert "layer_maps" not in long and long["tokens_read"] == 48
    # The same scores as the report's (batched with other documents there: float rounding;
    # its file keeps each value to 1e-4 of the document's largest).
    fresh = long["scores"]["conservative"]
    step = 1e-4 * max(abs(v) for v in fresh)
    assert fresh == pytest.approx(records[0]["scores"]["conservative"], rel=1e-3, abs=step)


@pytest.mark.fault(
    "model.d_model (or heads, blocks, vocabulary) set against the encoder's own",
    "refused with one line naming the setting and the encoder's value, never silently overruled",
)
def test_a_setting_the_encoder_fixes_is_refused_not_overruled():
    with pytest.raises(ConfigError, match="model.d_model is 256 but encoder 'minilm' has 384"):
        DocClassifierModule(vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", d_model=256)
    with pytest.raises(ConfigError, match="vocab_size 20000 differs"):
        DocClassifierModule(vocab_size=20000, num_classes=3, encoder="minilm")
    # Left at the default or set to the encoder's own value: accepted.
    DocClassifierModule(vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", n_heads=12)


def test_cached_encoder_states_are_computed_once_and_equal_the_full_forward():
    from docclass.data.batching import pad_token_ids
    from docclass.train.encoder_cache import EncoderStateCache

    module = DocClassifierModule(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", freeze_encoder=True,
        cache_encoder_states=True,
    ).eval()  # fmt: skip
    model = module.model
    rows = [[2023, 2003, 1037, 3231], [1996, 2924, 2001], [7592, 2088, 3899, 2000, 2017]]
    input_ids, mask = pad_token_ids(rows)
    batch = {"input_ids": input_ids, "attention_mask": mask, "index": torch.tensor([4, 0, 9])}
    calls = []
    model.register_forward_hook(lambda *args: calls.append(1))
    cache = EncoderStateCache()
    states = cache.token_states(model, "train", batch)
    with torch.no_grad():
        full = model(input_ids, mask)
        logits, _ = model.read_out(states, mask)
    torch.testing.assert_close(logits, full.logits)  # same computation, nothing rounded
    assert torch.all(states[~mask] == 0)
    cache.token_states(model, "train", batch)
    assert len(calls) == 2 and len(cache) == 3  # the second epoch ran no encoder (call 2: ours)
    cache.token_states(model, "val", batch)  # the same rows of another split are other documents
    assert len(cache) == 6
    for entry in cache.states.values():  # copies: no entry keeps a whole padded batch alive
        for tensor in entry:
            assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()


def test_cache_without_a_frozen_encoder_is_refused():
    with pytest.raises(ConfigError, match="cache_encoder_states needs model.encoder"):
        DocClassifierModule(
            vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", cache_encoder_states=True
        )


@pytest.mark.fault(
    "model.cache_encoder_states with a streamed training set (rows without a row number)",
    "refused with one line before training, never every document trained on one's states",
)
def test_cache_with_a_streamed_training_set_is_refused():
    from types import SimpleNamespace

    from docclass.data.batching import pad_token_ids
    from docclass.train.encoder_cache import EncoderStateCache

    module = DocClassifierModule(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", freeze_encoder=True,
        cache_encoder_states=True,
    )  # fmt: skip
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(stream="train-*.jsonl"))
    with pytest.raises(ConfigError, match="cache_encoder_states needs a training set read whole"):
        module.setup("fit")
    # And the cache itself: streamed rows all carry index -1, which once shared one slot.
    input_ids, mask = pad_token_ids([[2023, 2003], [1996, 2924, 2001]])
    batch = {"input_ids": input_ids, "attention_mask": mask, "index": torch.tensor([-1, -1])}
    with pytest.raises(ConfigError, match="rows without a row number"):
        EncoderStateCache().token_states(module.model, "train", batch)


def test_frozen_lower_blocks_are_left_out_of_the_optimiser():
    module = DocClassifierModule(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", freeze_blocks=5
    )
    trained = {
        ".".join(name.split(".")[:2]) if name.startswith("blocks.") else name.split(".")[0]
        for name, p in module.model.named_parameters()
        if p.requires_grad
    }
    # The top block and its output LayerNorm (final_norm, post-LN) train; the embeddings and
    # blocks 0-4 keep MiniLM's weights.
    assert trained == {"blocks.5", "final_norm", "pool", "head"}
    in_optimiser = sum(len(g["params"]) for g in module.parameter_groups())
    assert in_optimiser == sum(p.requires_grad for p in module.model.parameters())


def _batch(rows: list[list[int]], index: list[int]) -> dict[str, torch.Tensor]:
    from docclass.data.batching import pad_token_ids

    input_ids, mask = pad_token_ids(rows)
    labels = torch.arange(len(rows)) % 3
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "labels": labels,
        "index": torch.tensor(index),
    }


def test_cached_lower_block_states_train_the_top_block_as_the_whole_model_would():
    """With freeze_blocks and the cache, a step computes the lowest blocks once per document
    and then only the top one, with the same logits and the same gradients as a step through
    the whole model, in train mode with the demo's dropout (the held blocks are evaluated,
    not trained, on both paths). Windows of 16 tokens: a 40-token document spans three. The
    second step mixes cached and new documents in another order and width."""
    settings = dict(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", freeze_blocks=5,
        window_tokens=16, dropout=0.1, embed_dropout=0.1,
    )  # fmt: skip
    cached = DocClassifierModule(**settings, cache_encoder_states=True).train()
    whole = DocClassifierModule(**settings).train()
    whole.model.load_state_dict(cached.model.state_dict())
    long, short, middle = list(range(2000, 2040)), [3000, 3001], list(range(4000, 4023))
    first = _batch([long, short, middle], [3, 1, 7])
    second = _batch([list(range(5000, 5030)), middle, [6000] * 5, short], [9, 7, 2, 1])
    calls = {"lowest": 0, "top": 0}
    for name, block in (("lowest", cached.model.blocks[0]), ("top", cached.model.blocks[5])):
        block.register_forward_hook(lambda *a, name=name: calls.update({name: calls[name] + 1}))
    for step, batch in enumerate((first, second)):
        cached.zero_grad()
        whole.zero_grad()
        torch.manual_seed(step)
        loss, logits = cached._shared_step(batch)
        torch.manual_seed(step)
        whole_loss, whole_logits = whole._shared_step(batch)
        torch.testing.assert_close(logits, whole_logits, atol=1e-5, rtol=1e-5)
        loss.backward()
        whole_loss.backward()
        for (name, ours), theirs in zip(
            cached.model.named_parameters(), whole.model.parameters(), strict=True
        ):
            if ours.requires_grad:
                torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-5, rtol=1e-4, msg=name)
            else:
                assert ours.grad is None and theirs.grad is None, name
        assert cached.model.blocks[5].ffn[0].weight.grad.abs().sum() > 0
    assert len(cached.encoder_cache) == 5
    lowest, top = calls["lowest"], calls["top"]
    cached._shared_step(second)
    assert calls["lowest"] == lowest and calls["top"] > top  # a later epoch: the top only


@pytest.mark.parametrize(
    ("setting", "native", "trained_in"),
    [
        ("bf16", False, torch.bfloat16),
        ("auto", True, torch.bfloat16),
        ("auto", False, torch.float32),
        ("32", True, torch.float32),
    ],
)
def test_bf16_training_steps_on_a_cpu_leave_evaluation_in_float32(
    setting, native, trained_in, monkeypatch
):
    """model.cpu_train_precision: a training step (the training split's cached states
    included) runs in bf16 where asked, or where "auto" finds native bf16; validation always
    runs in float32, with the whole float32 model's logits, so its figures are those of the
    model classify runs."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    module = DocClassifierModule(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", freeze_blocks=5,
        window_tokens=16, cache_encoder_states=True, cpu_train_precision=setting,
    ).train()  # fmt: skip
    rows = [list(range(2000, 2040)), [3000, 3001], list(range(4000, 4023))]
    loss = module.training_step(_batch(rows, [0, 1, 2]), 0)
    loss.backward()
    bf16 = trained_in == torch.bfloat16
    assert module.training_steps_precision == ("bfloat16 autocast" if bf16 else "float32")
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    # The cached states stay float32 tensors (the residual sums promote); bf16 shows in
    # their rounding: a float32 pass of the held blocks gives them to 1e-5 only without it.
    batch = _batch(rows, [0, 1, 2])
    with torch.no_grad():
        exact = module.model.lower_block_states(batch["input_ids"], batch["attention_mask"], 5)
    for row, tokens in enumerate(rows):
        cached = module.encoder_cache.states[("train", row)][1]
        near = torch.allclose(cached, exact[row, : len(tokens)], atol=1e-5, rtol=1e-5)
        assert near == (trained_in == torch.float32), row
    top = module.model.blocks[5].ffn[0].weight
    assert top.dtype == torch.float32 and top.grad.abs().sum() > 0
    module.eval()
    evaluated = module._evaluate(batch, "val")
    torch.testing.assert_close(
        module.encoder_cache.states[("val", 0)][1], exact[0], atol=1e-5, rtol=1e-5
    )
    with torch.no_grad():
        whole = module.model(batch["input_ids"], batch["attention_mask"]).logits
    torch.testing.assert_close(evaluated["probs"], whole.softmax(-1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("precision", ["32", "bf16"])
def test_cached_logits_read_exact_states_only_and_equal_the_whole_model(precision):
    """The after-fit calibration's logits: documents whose held-block states validation
    computed in float32 run only the top block, with the whole model's logits; a batch with a
    document never cached, or cached by a training step (bf16 or not: only validation's and
    test's are read), or asked of another model, runs the whole model."""
    module = DocClassifierModule(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", freeze_blocks=5,
        window_tokens=16, cache_encoder_states=True, cpu_train_precision=precision,
    )  # fmt: skip
    module._hold_frozen_in_eval()
    validation = [list(range(2000, 2040)), [3000, 3001], list(range(4000, 4023))]
    trained = [list(range(5000, 5030))]
    module.training_step(_batch(trained, [0]), 0)
    module.eval()
    module._evaluate(_batch(validation, [0, 1, 2]), "val")
    assert (("train", 0) in module.encoder_cache.exact) == (precision == "32")
    model = module.model
    logits_of = module.encoder_cache.logits_function(model)
    lowest = []
    model.blocks[0].register_forward_hook(lambda *a: lowest.append(1))
    # Another batching than validation's: two of its documents, the other order.
    batch = _batch([validation[2], validation[0]], [0, 0])
    with torch.no_grad():
        cached = logits_of(model, batch["input_ids"], batch["attention_mask"])
        assert not lowest
        whole = model(batch["input_ids"], batch["attention_mask"]).logits
    torch.testing.assert_close(cached, whole, atol=1e-5, rtol=1e-5)
    copy = copy_module.deepcopy(model)
    copy.blocks[0].register_forward_hook(lambda *a: lowest.append(1))
    for rows, reader in (
        ([validation[1], [7000, 7001, 7002]], model),
        (trained, model),
        ([validation[1]], copy),
    ):
        lowest.clear()
        other = _batch(rows, [0] * len(rows))
        with torch.no_grad():
            got = logits_of(reader, other["input_ids"], other["attention_mask"])
            whole = reader(other["input_ids"], other["attention_mask"]).logits
        assert lowest  # the whole model ran
        torch.testing.assert_close(got, whole)
    assert (logits_of.from_cache, logits_of.whole) == (2, 4)


def test_the_default_leaves_lightnings_bf16_autocast_on():
    """With cpu_train_precision 32, a training step inside the autocast Lightning's bf16-mixed
    opens still runs in bf16; validation there is marked inexact, so calibration never reads
    its bf16 states as the float32 model's."""
    module = DocClassifierModule(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", freeze_blocks=5,
        window_tokens=16, cache_encoder_states=True,
    ).train()  # fmt: skip
    rows = [list(range(2000, 2040)), [3000, 3001]]
    batch = _batch(rows, [0, 1])
    with torch.no_grad():
        exact = module.model.lower_block_states(batch["input_ids"], batch["attention_mask"], 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        module.training_step(batch, 0)
        module._evaluate(_batch(rows, [0, 1]), "val")
    cached = module.encoder_cache.states[("train", 0)][1]
    assert not torch.allclose(cached, exact[0, : len(rows[0])], atol=1e-5, rtol=1e-5)
    assert not module.encoder_cache.exact
    assert module.training_steps_precision == "bfloat16 autocast"


@pytest.mark.parametrize("setting", [32, "32"])
def test_32_is_taken_as_yaml_writes_it(setting, tmp_path):
    module = DocClassifierModule(num_classes=3, cpu_train_precision=setting)
    assert module.cpu_train_precision_used == "32"
    # Through the CLI's parser: YAML's 32 is an integer, the flag's a string.
    from docclass.train.lightning_cli import training_cli

    config = tmp_path / "precision.yaml"
    config.write_text(f"model:\n  cpu_train_precision: {setting!r}\n")  # 32 or '32'
    tiny = str(CONFIGS / "tiny.yaml")
    for extra, given in (
        (["--config", str(config)], setting),
        (["--model.cpu_train_precision", "32"], "32"),
    ):
        cli = training_cli(["--config", tiny, *extra, "--trainer.logger", "false"], run=False)
        assert cli.model.hparams.cpu_train_precision == given
        assert cli.model.cpu_train_precision_used == "32"


def test_a_mistyped_cpu_train_precision_names_the_choices():
    from docclass.train.lightning_cli import training_cli

    with pytest.raises(Exception, match=r"Literal\['32', 'bf16', 'auto'\]"):
        training_cli(
            ["--config", str(CONFIGS / "tiny.yaml"), "--model.cpu_train_precision", "bf-16"],
            run=False,
        )


def test_an_unknown_cpu_train_precision_is_refused():
    with pytest.raises(ConfigError, match="cpu_train_precision must be 32, bf16 or auto"):
        DocClassifierModule(num_classes=3, cpu_train_precision="fp16")


def test_held_blocks_stay_in_eval_mode_while_the_rest_trains():
    module = DocClassifierModule(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", freeze_blocks=5
    ).train()
    assert not module.model.embed_dropout.training
    assert [block.training for block in module.model.blocks] == [False] * 5 + [True]
    assert module.model.pool.training and module.model.readout_dropout.training
    frozen = DocClassifierModule(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", freeze_encoder=True
    ).train()
    assert not any(block.training for block in frozen.model.blocks)
    assert frozen.model.readout_dropout.training


@pytest.mark.parametrize("cache", [False, True])
def test_held_blocks_run_without_dropout_in_a_real_fit(cache):
    """Through Lightning's own loop (sanity check, training steps, validation): the held
    blocks always run in eval mode, the top block trains in train mode."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    module = DocClassifierModule(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", freeze_blocks=5,
        window_tokens=16, cache_encoder_states=cache,
    )  # fmt: skip
    model = module.model
    # Each forward of a held and of the top block: (in a training step?, the block's mode).
    seen = {"held": [], "top": []}
    for name, block in (("held", model.blocks[0]), ("top", model.blocks[5])):
        block.register_forward_hook(
            lambda m, *a, name=name: seen[name].append((module.trainer.training, m.training))
        )

    # With the cache the held blocks never run in a training step (their states are cached,
    # computed in eval mode), so their mode is read where the step ends.
    class ModesAtEachStep(pl.Callback):
        modes = []

        def on_train_batch_end(self, *args):
            self.modes.append(
                (model.embed_dropout.training, [block.training for block in model.blocks])
            )

    train = [_batch([list(range(2000, 2040)), [3000, 3001]], [0, 1]), _batch([[4000] * 9], [2])]
    val = [_batch([[5000, 5001, 5002]], [0])]
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=2, num_sanity_val_steps=1, val_check_interval=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[ModesAtEachStep()],
    )  # fmt: skip
    trainer.fit(module, DataLoader(train, batch_size=None), DataLoader(val, batch_size=None))
    assert ModesAtEachStep.modes == [(False, [False] * 5 + [True])] * 2
    assert seen["held"] and all(not training for _, training in seen["held"])
    in_steps = [training for step, training in seen["top"] if step]
    assert len(in_steps) >= 2 and all(in_steps)  # a call per length group in each step
    assert not any(training for step, training in seen["top"] if not step)  # validation


@pytest.mark.fault(
    "a cached row that comes back holding another document (the same model on other data)",
    "refused with one line naming the split and row, never trained on the other document's states",
)
def test_a_cached_row_with_other_token_ids_is_refused():
    from docclass.train.encoder_cache import EncoderStateCache

    module = DocClassifierModule(
        vocab_size=MINILM_VOCAB, num_classes=3, encoder="minilm", freeze_blocks=5
    ).eval()
    cache = EncoderStateCache(5)
    cache.token_states(module.model, "train", _batch([[2000, 2001, 2002]], [4]))
    with pytest.raises(ConfigError, match="train row 4 is not the document"):
        cache.token_states(module.model, "train", _batch([[2000, 2001, 2003]], [4]))


@pytest.mark.fault(
    "model.freeze_blocks without an encoder, beside freeze_encoder, as many as the encoder's "
    "blocks, or cached with overlapping windows; word dropout with cached states",
    "refused with one line naming the setting and the fix before anything is trained",
)
@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(vocab_size=100, freeze_blocks=2), "freeze_blocks .* needs model.encoder"),
        (dict(encoder="minilm", freeze_blocks=6), "freeze_blocks must be 1 to 5 .*got 6"),
        (dict(encoder="minilm", freeze_blocks=-1), "freeze_blocks must be 1 to .*got -1"),
        (
            dict(encoder="minilm", freeze_blocks=5, cache_encoder_states=True, word_dropout=0.1),
            "set model.word_dropout: 0",
        ),
        (
            dict(vocab_size=100, freeze_blocks=2, cache_encoder_states=True),
            "freeze_blocks .* needs model.encoder",
        ),
        (dict(encoder="minilm", freeze_blocks=2, freeze_encoder=True), "set one"),
        (
            dict(
                encoder="minilm", freeze_blocks=2, cache_encoder_states=True,
                window_tokens=512, window_overlap=64,
            ),
            "set model.window_overlap: 0",
        ),
    ],
)  # fmt: skip
def test_impossible_frozen_blocks_are_refused(settings, message, monkeypatch):
    def weights_read(*args):
        raise AssertionError("the encoder's weights were read before the refusal")

    monkeypatch.setattr("docclass.train.lit_module.encoder_state_dict", weights_read)
    if "must be 1 to 5" not in message:  # the rest need no encoder's shape: refused before it
        # is located (which checks the weights file's hash and, for a hub name, downloads it)
        monkeypatch.setattr("docclass.train.lit_module.locate_encoder", weights_read)
    with pytest.raises(ConfigError, match=message):
        DocClassifierModule(**{"vocab_size": MINILM_VOCAB, "num_classes": 3, **settings})


def test_the_demo_config_fine_tunes_only_its_top_block_end_to_end(tmp_path, capsys):
    """make demo's config on a tiny slice (windows of 16 tokens, documents cut at 48): the run
    trains, tests, calibrates and reports, and its weights are MiniLM's own, bit for bit, in
    the embeddings and the lowest five blocks, and trained in the top block."""
    from docclass.artifacts.encoders import encoder_state_dict, locate_encoder

    main([
        "fit", "--config", str(CONFIGS / "demo.yaml"),
        "--model.window_tokens", "16", "--data.max_tokens", "48",
        "--data.max_docs_per_class", "6", "--trainer.max_epochs", "2",
        "--report_max_documents", "4", "--report_faithfulness_documents", "2",
        "--trainer.default_root_dir", str(tmp_path),
    ])  # fmt: skip
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    pretrained = encoder_state_dict(locate_encoder("minilm"), 6)
    top = ("blocks.5.", "final_norm.")
    for name, weights in pretrained.items():
        assert torch.equal(state["model." + name], weights) != name.startswith(top), name
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["config"]["model"]["freeze_blocks"] == 5 and metrics["test"]["n_documents"]
    assert "temperature" in metrics["calibration"]
    native = native_cpu_bf16()
    assert metrics["training_steps_precision"] == ("bfloat16 autocast" if native else "float32")
    # Calibration read both splits from the states validation and testing cached: the data's
    # token ids and the report's are the same.
    read = re.search(
        r"calibration: (\d+) of (\d+) documents read from the held", capsys.readouterr().out
    )
    assert read and read[1] == read[2] and int(read[1]) > metrics["test"]["n_documents"]
    records = read_jsonl(tmp_path / "report" / "explanations.jsonl.gz")
    assert len(records) == 4 and all(r["tokens_read"] == 48 for r in records)


@pytest.mark.fault(
    "model.encoder_lr 0 or negative, a negative model.weight_decay, or encoder_lr / "
    "freeze_encoder without model.encoder",
    "refused in one line naming the setting; never the encoder trained at lr (`0 or lr`), "
    "up the loss, or a setting with nothing to act on ignored",
)
@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(encoder="minilm", encoder_lr=0.0), "encoder_lr must be positive or null"),
        (dict(encoder="minilm", encoder_lr=-1e-5), "encoder_lr must be positive or null"),
        (dict(vocab_size=100, weight_decay=-1.0), "weight_decay must be 0 or more"),
        (dict(vocab_size=100, encoder_lr=1e-5), "encoder_lr applies to a pre-trained encoder"),
        (dict(vocab_size=100, freeze_encoder=True), "freeze_encoder applies to a pre-trained"),
    ],
)  # fmt: skip
def test_encoder_settings_that_would_train_otherwise_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        DocClassifierModule(num_classes=3, **settings)
