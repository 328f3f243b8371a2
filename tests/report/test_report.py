"""HTML reports: what the pages contain, how they are escaped, and how a browser shows them."""

import json
import math
import os
import re
import shutil

import datasets
import numpy as np
import pytest
from helpers import (
    CONFIGS,
    CORPUS,
    DOCUMENTS,
    LABELS,
    assert_only_the_reports_own_scripts,
    parsed_page,
    tiny_classifier,
)

from docclass.cli import main
from docclass.errors import DataError
from docclass.evaluate.agreement import add_agreement
from docclass.evaluate.counterfactual import add_counterfactuals
from docclass.evaluate.erasure import beats_random
from docclass.inference.classifier import DocClassifier
from docclass.inference.reporting import (
    Documents,
    faithfulness_positions,
    faithfulness_sample,
    load_documents,
    make_report,
    measure_faithfulness,
    select_for_report,
)
from docclass.interpret.default_method import default_method
from docclass.interpret.explain import explain_documents
from docclass.interpret.records import RECORD_METHODS, method_label, read_jsonl
from docclass.report.classes import MATRIX_CLASSES, class_rows, matrix_view, pair_rows
from docclass.report.html import (
    LONG_DOCUMENT_WORDS,
    PACK_DIGITS,
    REPORT_META,
    document_filename,
    packed,
    write_report,
)
from docclass.report.lexicon import (
    class_lexicon,
    confusion_cells,
    contrastive_lexicon,
    evidence_threshold,
)
from docclass.report.summaries import document_order, sentences

HOSTILE = [
    'Breaking: <script>window.pwned = 1; alert(1)</script> markets & "rates" fell.\n\nNew line.',
    '<img src=x onerror="window.pwned = 2; alert(2)"> striker </p></div><b>bold</b> scored',
]
LONG = " ".join(f"Sentence {i} says the central bank held rates." for i in range(40))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report of hostile, long, truncated and short documents from a small model."""
    texts = [*HOSTILE, LONG, "Markets rallied.", " ".join(["striker scored"] * 200)]
    classifier = tiny_classifier(n_layers=1, max_tokens=300)
    records = explain_documents(
        classifier,
        texts,
        doc_ids=["<i>hostile</i>.txt", "two", "long", "short", "truncated"],
        labels=["markets", "sport", "tech", "markets", "sport"],
        classes="all",
    )
    summary = measure_faithfulness(classifier, texts, records)
    shown_first = default_method(summary["methods"], summary["documents"])
    checks = {
        "counterfactual": add_counterfactuals(classifier, texts, records, shown_first.method),
        "agreement": add_agreement(records, flagged=2),
    }
    out = tmp_path_factory.mktemp("report")
    write_report(records, out, LABELS, title="test <report>", faithfulness=summary, checks=checks)
    return out, records


def test_every_word_of_every_document_is_on_its_page_and_escaped(report):
    out, records = report
    assert len(list((out / "docs").glob("doc-*.html"))) == len(records)
    for position, record in enumerate(records):
        page = parsed_page(out / "docs" / document_filename(position))
        # The words read are elements, shaded and given tooltips by the page's script (the
        # browser tests check it); the unread rest is one grey block of text after the cut.
        read = record["words_read"]
        assert [page.words[i]["text"] for i in sorted(page.words)] == record["words"][:read]
        assert all("style" not in word for word in page.words.values())
        shown = "".join(page.text_parts)
        if record["truncated"]:
            assert "not seen" in shown
            shown = shown.replace(shown[shown.index("✂") : shown.index("not seen.") + 9], "")
        assert shown == record["text"]  # line breaks and spacing kept, nothing lost or added


@pytest.mark.fault(
    "hostile document text and ids (`<script>`, `onerror`, `</p>`)",
    "escaped in every page; the JSON blocks too",
)
def test_document_text_never_becomes_markup(report):
    out, _ = report
    for path in [out / "index.html", *sorted((out / "docs").glob("*.html"))]:
        html = path.read_text(encoding="utf-8")
        assert "<script>window" not in html and "<img src=x" not in html
        assert "<i>hostile" not in html and "<b>bold" not in html
        assert_only_the_reports_own_scripts(html)
    first = (out / "docs" / document_filename(0)).read_text(encoding="utf-8")
    assert ">&lt;</b>" in first  # each "<" of the text is a word, shown as a character
    assert "<h1>&lt;i&gt;hostile&lt;/i&gt;.txt</h1>" in first
    assert "\\u003c" in first and '"<"' not in first  # the JSON block (map labels) too
    assert "&lt;i&gt;hostile&lt;/i&gt;.txt" in (out / "index.html").read_text(encoding="utf-8")


def test_index_lists_every_document_errors_first(report):
    out, records = report
    html = (out / "index.html").read_text(encoding="utf-8")
    for position in range(len(records)):
        assert f'href="docs/{document_filename(position)}"' in html
    order = document_order(records)
    wrong = [i for i in order if records[i]["label"] != records[i]["predicted"]]
    assert order[: len(wrong)] == wrong
    assert "Content-Security-Policy" in html and "http://" not in html and "https://" not in html


def test_index_faithfulness_table_is_the_mean_over_documents(report):
    """The table (report.json's, and the page's cells) recomputed by hand from the records' own
    per-document figures."""
    out, records = report
    measured = [r["faithfulness"]["methods"] for r in records]
    table = json.loads((out / REPORT_META).read_text(encoding="utf-8"))["faithfulness"]
    html = (out / "index.html").read_text(encoding="utf-8")
    section = html[html.index('id="faithfulness-table"') :]
    section = section[: section.index("</table>")]
    rows = {
        cells[0]: cells[1:]
        for cells in (
            re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in section.split("<tr>")[2:]
        )
    }
    assert "dropping their tokens from the attention mask" in html
    assert table["documents"] == len(measured) == len(records)
    assert len(rows) == len(table["methods"]) == len(measured[0]) > 1

    def mean(name, key):
        return sum(document[name][key] for document in measured) / len(measured)

    for name in measured[0]:
        row = table["methods"][name]
        for key in ("comprehensiveness", "sufficiency"):
            assert row[key] == pytest.approx(mean(name, key), rel=1e-9, abs=1e-12), (name, key)
        fractions = len(measured[0][name]["curve"])
        curve = [
            sum(d[name]["curve"][k] for d in measured) / len(measured) for k in range(fractions)
        ]
        assert row["curve"] == pytest.approx(curve, abs=1e-5)  # stored rounded to 5 places
        comprehensiveness, ratio, sufficiency, beats = rows[method_label(name)]
        assert comprehensiveness == f"{row['comprehensiveness']:.3f}"
        assert sufficiency == f"{row['sufficiency']:.3f}"
        if name == "random":
            assert (ratio, beats) == ("", "—")
            continue
        # Beats random on a document: clears the floor by twice the seeds' spread (at least 0.01).
        wins = sum(
            d[name]["comprehensiveness"]
            > d["random"]["comprehensiveness"]
            + max(2 * d["random"].get("comprehensiveness_std", 0.0), 0.01)
            for d in measured
        )
        assert row["beats_random"] == pytest.approx(wins / len(measured))
        assert beats == f"{100 * wins / len(measured):.0f} %"
    assert 'alt="probability drop as the top words are removed, per method"' in html


def test_long_documents_get_sentence_view_and_minimap_short_ones_get_maps(report):
    out, records = report
    long_page = (out / "docs" / document_filename(2)).read_text(encoding="utf-8")
    assert len(records[2]["words"]) > LONG_DOCUMENT_WORDS
    assert 'id="minimap"' in long_page and 'id="sentences"' in long_page
    short_page = (out / "docs" / document_filename(3)).read_text(encoding="utf-8")
    assert 'id="minimap"' not in short_page and 'id="layer-maps"' in short_page


def test_sentences_cover_every_word_once_in_order():
    (record,) = explain_documents(tiny_classifier(), ['He said "no." Then left!\nNew line. Done'])
    ranges = sentences(record)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(record["words"])
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(ranges, ranges[1:], strict=False))
    texts = [" ".join(record["words"][a:b]) for a, b in ranges]
    assert texts == ['He said " no . "', "Then left !", "New line .", "Done"]


def lexicon_record(number, words, label, predicted, contributions):
    columns = zip(*contributions.values(), strict=True)
    mean = [sum(values) / len(contributions) for values in columns]
    return {
        "id": f"d{number}", "words": words, "words_read": len(words), "label": label,
        "predicted": predicted, "probs": {predicted: 0.9},
        "scores": {"contribution": contributions[predicted]}, "contributions": contributions,
        "contribution_mean": mean,
    }  # fmt: skip


def test_lexicon_ranks_words_by_their_share_toward_the_class_with_their_documents():
    words = ["the", "rates", "fell", "again"]
    records = [
        # "rates" pushes toward business rather than tech; "the" the other way.
        lexicon_record(0, words, "business", "business",
                       {"business": [-0.2, 1.0, 0.5, 0.1], "tech": [0.1, -1.0, 0.0, 0.0]}),
        lexicon_record(1, words, "business", "business",
                       {"business": [-0.1, 2.0, 0.0, 0.1], "tech": [0.2, 0.5, 0.0, 0.0]}),
        # Wrong: labelled tech, read as business; "again" is what pushed it there.
        lexicon_record(2, words, "tech", "business",
                       {"business": [0.0, 0.1, 0.0, 0.9], "tech": [0.0, 0.3, 0.0, 0.1]}),
    ]  # fmt: skip
    hrefs = ["docs/a.html", "docs/b.html", "docs/c.html"]
    (entry,) = class_lexicon(records, ["business", "tech"], hrefs).values()
    rows = entry["rows"]
    assert (entry["documents"], entry["min_documents"], entry["reason"]) == (3, 2, None)
    # Toward business = contribution to business minus the mean over both classes. "the"
    # pushed away from business in total: not a word that decided for it.
    assert [row["word"] for row in rows] == ["rates", "again", "fell"]
    # rates: (1.0 + 1.0)/2 + (2.0 - 0.5)/2 + (0.1 - 0.3)/2 = 1.65 over 3 occurrences.
    assert rows[0]["total"] == pytest.approx(1.65) and rows[0]["mean"] == pytest.approx(0.55)
    assert rows[0]["documents"] == 3
    assert [d["href"] for d in rows[0]["top_documents"]] == ["docs/a.html", "docs/b.html",
                                                             "docs/c.html"]  # fmt: skip
    # A class of one document has no list, and says why.
    (alone,) = class_lexicon(records[:1], ["business", "tech"], hrefs).values()
    assert alone["rows"] == [] and alone["reason"].startswith("only 1 document")
    (pair,) = contrastive_lexicon(records, ["business", "tech"], hrefs)
    assert (pair["a"], pair["b"], pair["errors"]) == ("business", "tech", 1)
    # rates: (1.0+1.0) + (2.0-0.5) + (0.1-0.3) = 3.3 toward business rather than tech.
    assert pair["toward_a"][0]["word"] == "rates"
    assert pair["toward_a"][0]["total"] == pytest.approx(3.3)
    assert [row["word"] for row in pair["toward_b"]] == ["the"]
    (cell,) = confusion_cells(records, ["business", "tech"], hrefs)
    assert (cell["true"], cell["predicted"]) == ("tech", "business")
    assert [w["word"] for w in cell["documents"][0]["words"]] == ["again"]
    # A word that comes back ("Again", "again") is listed once, at its strongest.
    (record,) = [r for r in records if r["label"] != r["predicted"]]
    again = {**record, "words": [*record["words"], "Again"], "words_read": record["words_read"] + 1}
    again["contributions"] = {
        name: [*scores, scores[record["words"].index("again")] / 2]
        for name, scores in record["contributions"].items()
    }
    (cell,) = confusion_cells([again], ["business", "tech"], hrefs[:1])
    assert [w["word"] for w in cell["documents"][0]["words"]] == ["again"]


def test_page_scores_are_packed_to_a_2047th_of_their_largest():
    values = [0.0, 1.5, -3.0, 1e-9, 2.9999, -1e-4]
    text, scale = packed(values)
    assert len(text) == 2 * len(values) and scale == pytest.approx(3.0 / 2047)
    codes = [
        PACK_DIGITS.index(a) * 64 + PACK_DIGITS.index(b)
        for a, b in zip(text[::2], text[1::2], strict=True)
    ]
    assert [(code - 2048) * scale for code in codes] == pytest.approx(values, abs=scale / 2)
    assert packed([0.0, 0.0]) == ("gAgA", 0.0)  # 2048 = 32 · 64: every word at zero


def test_a_class_share_is_net_of_the_mean_over_every_class_not_only_those_kept():
    # The record keeps business's contributions only; the mean it subtracts is over all classes.
    record = lexicon_record(0, ["rates", "the"], "business", "business", {"business": [1.0, 0.5]})
    record["contribution_mean"] = [0.25, 0.5]
    records = [dict(record, id=f"d{i}") for i in range(2)]
    (entry,) = class_lexicon(records, ["business", "tech", "sport"], ["a", "b"]).values()
    assert [(row["word"], row["mean"]) for row in entry["rows"]] == [("rates", 0.75)]
    assert [evidence_threshold(n) for n in (2, 9, 10, 500)] == [2, 2, 3, 3]


def test_report_command_from_a_config_and_from_an_unlabelled_file(fitted, tmp_path):
    ckpt = str(fitted / "checkpoints" / "last.ckpt")
    main(["report", "--ckpt", ckpt, "--data", str(CONFIGS / "tiny.yaml"), "--out",
          str(tmp_path / "test"), "--limit", "20"])  # fmt: skip
    records = read_jsonl(tmp_path / "test" / "explanations.jsonl.gz")
    split = json.loads((fitted / "split.json").read_text())
    assert [r["id"] for r in records] == split["test"][:20]  # the very split training held out
    index = (tmp_path / "test" / "index.html").read_text(encoding="utf-8")
    assert "Training curves" in index and "test accuracy" in index  # the run's own figures
    assert f"<h1>docclass report · {fitted.name}</h1>" in index  # not "last.ckpt"
    # The cards count the 20 shown, and the subtitle says they are not the whole split.
    assert f"test split ({len(split['test'])} documents) · its first 20 documents only" in index
    assert all(r["faithfulness"]["methods"]["random"] for r in records)
    assert 'id="faithfulness-table"' in index

    data = tmp_path / "new.jsonl"
    data.write_text("".join(json.dumps({"body": t}) + "\n" for t in HOSTILE))
    main(["report", "--ckpt", ckpt, "--data", str(data), "--text_column", "body",
          "--label_column", "null", "--out", str(tmp_path / "new"),
          "--faithfulness", "false"])  # fmt: skip
    records = read_jsonl(tmp_path / "new" / "explanations.jsonl.gz")
    assert [r["text"] for r in records] == HOSTILE and records[0]["label"] is None
    assert not any("faithfulness" in r for r in records)
    assert "faithfulness-table" not in (tmp_path / "new" / "index.html").read_text()


def test_fit_ends_with_the_test_report_and_attention_snapshots(fitted):
    records = read_jsonl(fitted / "report" / "explanations.jsonl.gz")
    assert len(records) == 213
    assert len(list((fitted / "report" / "docs").glob("doc-*.html"))) == 213
    for epoch in ("epoch_000", "epoch_001"):
        snapshot = read_jsonl(fitted / "attention" / epoch / "explanations.jsonl.gz")
        assert len(snapshot) == 2
    first = read_jsonl(fitted / "attention" / "epoch_000" / "explanations.jsonl.gz")
    # The same documents each epoch, with the attention they got at that point.
    assert [r["id"] for r in first] == [r["id"] for r in snapshot]
    assert first[0]["scores"]["attention"] != snapshot[0]["scores"]["attention"]


# -- in a real browser -----------------------------------------------------------------------

CHROMIUM_ARGS = [
    "--no-sandbox",  # tests run as root in CI containers
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    executable = os.environ.get("DOCCLASS_CHROMIUM") or shutil.which("chromium")
    if not executable:
        if os.environ.get("DOCCLASS_REQUIRE_BROWSER") == "1":
            pytest.fail("Chromium not found: 'make test' installs it (apt-get install chromium)")
        pytest.skip("Chromium not installed; 'make test' installs it")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


def open_page(browser, path):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    problems, dialogs = [], []
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else 0)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    # Only the report's own pages and inline data: nothing from any network.
    page.on(
        "request",
        lambda r: (
            problems.append(f"request {r.url}") if not r.url.startswith(("file:", "data:")) else 0
        ),
    )
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, problems, dialogs


@pytest.mark.fault(
    "the hostile page opened in Chromium",
    "no script of the document runs, no network request, no console error",
)
def test_hostile_document_page_in_chromium(browser, report, tmp_path):
    out, records = report
    page, problems, dialogs = open_page(browser, out / "docs" / document_filename(0))
    assert page.evaluate("window.pwned") is None and dialogs == []
    assert page.locator("#text").text_content() == records[0]["text"]
    words = page.locator("#text b")
    assert words.all_text_contents() == records[0]["words"]
    shades = page.eval_on_selector_all(
        "#text b", "els => els.map(e => e.style.getPropertyValue('--s'))"
    )
    assert all(shade != "" for shade in shades) and any(float(s) > 0.99 for s in shades)
    # Every tooltip gives the shown method's score as the record has it, to the packing step
    # (1/2,047 of the largest) and no further digit.
    titles = page.eval_on_selector_all("#text b", "e => e.map(w => w.title)")
    assert "rank 1 of" in " ".join(titles)
    scores = records[0]["scores"][page.locator("#method").input_value()]
    step = max(abs(v) for v in scores) / 2047
    printed = [re.search(r" (-?[\d.]+) · rank", title).group(1) for title in titles]
    shown = [float(number) for number in printed]
    assert shown == pytest.approx(scores[: len(shown)], abs=step)
    decimals = max(0, math.ceil(-math.log10(step)))
    assert {len(number.partition(".")[2]) for number in printed} == {decimals}
    assert len(shown) == records[0]["words_read"]
    page.select_option("#method", "contribution")
    assert page.locator("#text.signed").count() == 1
    assert page.locator("#legend-signed").is_visible()
    badge = page.locator("#faithfulness-badge")
    figures = records[0]["faithfulness"]["methods"]
    assert badge.text_content().startswith(f"{figures['contribution']['comprehensiveness']:.3f}")
    verdict = "better" if beats_random(figures, "contribution") else "no better"
    assert f"· {verdict} than random" in badge.text_content()
    page.select_option("#method", "attention")
    page.select_option("#head", "1")
    assert "head 1" in page.locator("#w0").get_attribute("title")
    # A single head is a view of pool attention: the report does not measure it.
    assert "attention_head1" not in figures
    assert badge.text_content() == "not measured for this view"
    page.screenshot(path=str(tmp_path / "hostile.png"))
    assert problems == []


def test_page_opens_on_the_default_method_and_contrasts_any_two_classes(browser, report):
    out, records = report
    page, problems, _ = open_page(browser, out / "docs" / document_filename(0))
    meta = json.loads((out / REPORT_META).read_text())
    chosen = default_method(meta["faithfulness"]["methods"], meta["faithfulness"]["documents"])
    assert page.locator("#method").input_value() == chosen.method
    assert page.locator("#shown-first").text_content() == chosen.reason
    record = records[0]
    first, second = LABELS[0], LABELS[2]
    page.select_option("#method", "contrast")
    page.select_option("#class-a", first)
    page.select_option("#class-b", second)
    assert page.locator("#contrast-controls").is_visible()
    numbers = [
        float(x) for x in re.findall(r"-?\d+\.\d+", page.locator("#contrast-sum").text_content())
    ]
    gap, words, bias = numbers
    assert gap == pytest.approx(record["logits"][first] - record["logits"][second], abs=1e-3)
    # The words' part is what the record's full-precision contributions add up to.
    read = record["words_read"]
    pairs = zip(record["contributions"][first], record["contributions"][second], strict=True)
    difference = [a - b for a, b in pairs][:read]
    assert words == pytest.approx(sum(difference), abs=2e-3)
    assert gap == pytest.approx(words + bias, abs=2e-3)
    # The word the contrast puts first is the one whose two contributions differ most.
    top = max(range(read), key=lambda i: difference[i])
    assert "rank 1 of" in page.locator(f"#w{top}").get_attribute("title")
    counterfactual = record["counterfactual"]
    text = page.locator("#counterfactual").text_content()
    if counterfactual["k"]:
        assert counterfactual["label"] in text and counterfactual["words"][0] in text
    else:
        assert "does not rest on a few words" in text
    assert problems == []


def test_index_long_and_short_pages_in_chromium(browser, report):
    out, records = report
    page, problems, dialogs = open_page(browser, out / "index.html")
    table = page.locator("#faithfulness-table tr")
    assert table.count() == 1 + len(records[0]["faithfulness"]["methods"])  # header + methods
    assert page.locator("#documents tbody tr").count() == len(records)
    methods = len([name for name in RECORD_METHODS if name in records[0]["scores"]])
    pairs = methods * (methods - 1) // 2
    assert methods >= 4
    assert page.locator("#agreement-table tr").count() == 1 + pairs  # header + every pair
    page.select_option("#show", "disagree")
    # The least-agreeing tenth, at least one: of so few documents, one.
    assert page.locator("#shown").text_content() == f"1 of {len(records)} shown"
    page.select_option("#show", "all")
    assert page.locator("#shown").text_content() == f"{len(records)} of {len(records)} shown"
    page.select_option("#show", "truncated")
    truncated = sum(r["truncated"] for r in records)
    assert page.locator("#shown").text_content() == f"{truncated} of {len(records)} shown"
    page.fill("#search", "truncated")
    assert page.locator("#shown").text_content() == f"1 of {len(records)} shown"
    page.locator("#documents tbody tr:not(.hidden) a").click()
    page.wait_for_load_state("load")
    assert page.locator(".cut").is_visible()
    assert page.locator("#minimap div.cutbin").count() == 1

    long_page, long_problems, _ = open_page(browser, out / "docs" / document_filename(2))
    assert long_page.locator("#minimap div").count() > 10
    assert long_page.locator("#sentences li").count() == 8
    short_page, short_problems, _ = open_page(browser, out / "docs" / document_filename(3))
    assert short_page.locator("#layer-maps canvas").count() == 2  # 1 block × 2 heads
    assert problems + long_problems + short_problems == [] and dialogs == []


MANY = [f"intent_{i:02d}_with_a_long_descriptive_name" for i in range(29)] + [
    '<img src=x onerror="window.pwned = 3">'
]


def test_a_report_of_thirty_classes_stays_readable_in_chromium(browser, tmp_path):
    """Past 20 classes: the matrix shows the 20 with the most errors and says so, every class
    is in the per-class table, one word list is in the page and any other is built when
    picked, and a class name that looks like markup stays text."""
    classifier = tiny_classifier(n_layers=1, labels=MANY)
    texts = [f"{CORPUS[i % len(CORPUS)]} request {i % 7}" for i in range(90)]
    labels = [MANY[(i * 7) % len(MANY)] for i in range(90)]
    records = explain_documents(classifier, texts, labels=labels, classes="contrast")
    assert all(len(r["contributions"]) <= 6 and len(r["logits"]) == len(r["contributions"])
               for r in records)  # fmt: skip
    assert all(len(r["probs"]) == len(MANY) for r in records)
    # A page of the default records: its class menus hold the kept classes, the runner-up
    # first against the prediction, and a class name that looks like markup stays text.
    hostile = next(i for i, r in enumerate(records) if MANY[-1] in r["contributions"])
    write_report(records, tmp_path / "contrast", MANY, title="contrast")
    page, problems, dialogs = open_page(
        browser, tmp_path / "contrast" / "docs" / document_filename(hostile)
    )
    kept = list(records[hostile]["contributions"])
    assert page.locator("#class-a option").all_text_contents() == kept
    runner_up = max(kept[1:] if kept[0] == records[hostile]["predicted"] else kept,
                    key=lambda name: records[hostile]["probs"][name])  # fmt: skip
    assert (
        page.locator("#class-b").input_value()
        == runner_up
        != page.locator("#class-a").input_value()
    )
    assert page.evaluate("window.pwned") is None and dialogs == [] and problems == []
    # An untrained model predicts a few classes; the report layer reads records only, so half
    # the documents are "read" as their true class, the rest as the next class.
    records = explain_documents(classifier, texts, labels=labels, classes="all")
    for i, record in enumerate(records):
        record["predicted"] = labels[i] if i % 2 else MANY[(i + 1) % len(MANY)]
    write_report(records, tmp_path, MANY, title="thirty")
    html = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "<img src=x" not in html
    page, problems, dialogs = open_page(browser, tmp_path / "index.html")
    present = {r["label"] for r in records} | {r["predicted"] for r in records}
    assert page.locator("#class-table tbody tr").count() == len(present)
    assert page.locator("#confusion-matrix th.col").count() == MATRIX_CLASSES
    assert (
        f"{MATRIX_CLASSES} of {len(present)} classes"
        in page.locator("#confusion + p").text_content()
    )
    assert MANY[-1] in page.locator("#class-table").text_content()  # as text, not markup
    assert page.locator("#lexicon-many .lexicon-class").count() == 1
    predicted = sorted({r["predicted"] for r in records})
    assert len(predicted) >= 2
    for name in predicted[:2]:
        page.fill("#lexicon-search", name)
        assert page.locator("#lexicon-many h3").text_content().startswith(name)
        rows = page.locator("#lexicon-many table.lexicon tr").count()
        assert rows > 1 or page.locator("#lexicon-many .no-list").count() == 1
    # The document filters still work beside the class picker (its function once took the
    # name of the Show menu, and every filter then hid every row).
    listed = page.locator("#documents tbody tr").count()
    errors = sum(r["predicted"] != r["label"] for r in records)
    page.select_option("#show", "error")
    assert page.locator("#shown").text_content() == f"{errors} of {listed} shown"
    page.select_option("#show", "all")
    page.fill("#search", "")
    assert page.locator("#shown").text_content() == f"{listed} of {listed} shown"
    assert page.evaluate("window.pwned") is None and dialogs == [] and problems == []


def test_a_capped_report_shows_every_error_then_a_stratified_sample():
    labels = ["a"] * 60 + ["b"] * 30 + ["c"] * 10
    predicted = list(labels)
    for i in (3, 61, 95):
        predicted[i] = "b" if labels[i] != "b" else "a"
    chosen = select_for_report(labels, predicted, 23, seed=1)
    assert len(chosen) == 23 and chosen == sorted(set(chosen))
    assert {3, 61, 95} <= set(chosen)
    rest = [labels[i] for i in chosen if i not in (3, 61, 95)]
    # 20 places for 97 correct documents: 59, 29 and 9 of them, in proportion (±1).
    assert [rest.count(c) for c in "abc"] == [12, 6, 2]
    assert select_for_report(labels, predicted, 23, seed=1) == chosen  # reproducible
    # More errors than half the cap: a sample of them takes half, correct documents the rest,
    # so the faithfulness table can still keep the split's share of errors.
    few = select_for_report(labels, predicted, 4)
    assert len(few) == 4 and len(set(few) & {3, 61, 95}) == 2
    assert select_for_report(labels, predicted, 500) == list(range(100))


def numbered(labels: list[str | None]) -> Documents:
    """One short document per label, numbered: ids "0", "1", …"""
    texts = [f"{DOCUMENTS[i % 3]} {i}" for i in range(len(labels))]
    return Documents(texts, [str(i) for i in range(len(labels))], labels, "numbered documents")


@pytest.mark.fault(
    "documents to explain whose labels the model has no class for (`SPORT` for `sport`, a "
    "class it never learned)",
    "read as unlabelled, counted and named on the page and in a warning; never badged wrong "
    "while the accuracy skipped them",
)
def test_labels_the_model_has_no_class_for_are_read_as_unlabelled(tmp_path):
    classifier = tiny_classifier(n_layers=1)
    labels = [LABELS[0], LABELS[1], LABELS[0].upper(), LABELS[0].upper(), "politics", None]
    make_report(classifier, numbered(labels), tmp_path, faithfulness=False, counterfactuals=False)
    records = read_jsonl(tmp_path / "explanations.jsonl.gz")
    assert [r["label"] for r in records] == labels[:2] + [None] * 4
    html = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "3 label(s) the model has no class for, read as unlabelled: " in html
    predicted = [r["predicted"] for r in records]
    errors = sum(p != t for p, t in zip(predicted[:2], labels[:2], strict=True))
    assert html.count('<span class="badge error">wrong</span>') == errors
    # The accuracy is over the two labelled documents of six, and the page says so.
    assert '<span id="scored">of the 2 labelled, classified</span>' in html


def test_a_report_of_a_model_whose_output_is_not_finite_is_one_line(tmp_path):
    # It was a TypeError traceback at the first page, every "prediction" the first class.
    import torch

    from docclass.errors import CheckpointError

    classifier = tiny_classifier(n_layers=1)
    with torch.no_grad():
        for parameter in classifier.model.parameters():
            parameter.fill_(float("nan"))
    with pytest.raises(CheckpointError, match="numbered documents: the model's output is not"):
        make_report(classifier, numbered(LABELS[:3]), tmp_path, faithfulness=False)


@pytest.mark.fault(
    "a test split far larger than a report should hold (a hub split of 70,000 documents)",
    "the report explains at most --max_documents (1,000): every error, then a stratified "
    "sample; its headline figures stay those of every document, and the page says so",
)
def test_capped_report_keeps_the_headline_of_every_document(tmp_path):
    classifier = tiny_classifier(n_layers=1)
    labels = [LABELS[i % 3] for i in range(30)]
    documents = numbered(labels)
    texts = documents.texts
    make_report(classifier, documents, tmp_path, max_documents=8, faithfulness=False)
    records = read_jsonl(tmp_path / "explanations.jsonl.gz")
    results = DocClassifier(classifier, "cpu").predict(texts)
    predicted = [r["label"] for r in results]
    errors = {str(i) for i in range(30) if predicted[i] != labels[i]}
    shown = {r["id"] for r in records}
    room = max(8 - (30 - len(errors)), 4)  # at most half the cap once errors would fill it
    assert len(records) == 8 and len(shown & errors) == min(len(errors), room)
    html = (tmp_path / "index.html").read_text(encoding="utf-8")
    accuracy = sum(p == t for p, t in zip(predicted, labels, strict=True)) / 30
    assert f"<b>{accuracy:.3f}</b>accuracy" in html and "<b>30</b>documents" in html
    assert "8 of 30 documents shown" in html and "over all 30 documents" in html
    # The other headline counts are the split's too, not the sample's.
    uncertain = sum(r["score"] < 0.6 for r in results)
    assert uncertain > 8  # the sample's count could not reach it
    assert f"<b>{uncertain}</b>below 60 % confidence" in html


def test_a_capped_reports_accuracy_says_how_many_documents_it_is_over(tmp_path):
    """Unlabelled documents count among the split's documents, not in its accuracy."""
    classifier = tiny_classifier(n_layers=1)
    labels = [LABELS[i % 3] if i % 2 else None for i in range(30)]
    make_report(classifier, numbered(labels), tmp_path, max_documents=8, faithfulness=False)
    html = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "over all 30 documents (the 15 labelled and classified)" in html
    assert '<span id="scored">of the 15 labelled, classified</span>' in html


def test_a_report_made_again_with_fewer_documents_leaves_no_page_of_the_first(report, tmp_path):
    _, records = report
    out = tmp_path / "again"
    write_report(records, out, LABELS, title="five")
    (out / "docs" / "notes.html").write_text("not a page of a report")
    write_report(records[:2], out, LABELS, title="two")
    pages = sorted(page.name for page in (out / "docs").iterdir())
    assert pages == ["doc-00000.html", "doc-00001.html", "notes.html"]


def test_the_training_runs_scores_are_shown_only_for_the_weights_they_measured(report, tmp_path):
    """A report of best.ckpt beside a run that tested last.ckpt: the run's test accuracy is
    not this model's."""
    _, records = report
    run = tmp_path / "run"
    run.mkdir()
    tested = {"accuracy": 0.4321, "macro_f1": 0.4, "weights": "tested-weights"}
    (run / "metrics.json").write_text(json.dumps({"test": tested, "val": {"acc": 0.5}}))
    for weights, shown in (("tested-weights", True), ("other-weights", False)):
        write_report(records, tmp_path / weights, LABELS, run_dir=run, weights=weights)
        html = (tmp_path / weights / "index.html").read_text(encoding="utf-8")
        assert ("0.432" in html) == shown
        assert ("its scores are of other weights of this run" in html) != shown
    tested.pop("weights")  # written before docclass named the weights it tested
    (run / "metrics.json").write_text(json.dumps({"test": tested}))
    write_report(records, tmp_path / "older", LABELS, run_dir=run, weights="any-weights")
    html = (tmp_path / "older" / "index.html").read_text(encoding="utf-8")
    assert "0.432" not in html and "written before docclass named the weights" in html


def test_a_report_that_measured_nothing_says_so_beside_later_tables(report, tmp_path):
    """Made with --faithfulness false, then measured by docclass faithfulness: the index
    neither claims the model unmeasured nor hides which documents the tables measured."""
    from docclass.interpret.methods import score_rules
    from docclass.report.html import FAITHFULNESS_FILE

    _, records = report
    row = {"comprehensiveness": 0.6, "sufficiency": 0.05, "curve": [0.6] * 5}
    table = {name: row for name in ("grad_input", "contribution", "conservative", "random")}
    measured = {"weights": "W", "scores": score_rules(), "documents": 200,
                "documents_given": 200, "data": "other.jsonl · all rows (200 documents)",
                "removal": {"mask": {"aopc": table}}}  # fmt: skip
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / FAITHFULNESS_FILE).write_text(json.dumps(measured))
    write_report(records, tmp_path, LABELS, weights="W", scores=score_rules())
    html = (tmp_path / "index.html").read_text(encoding="utf-8")
    shown = re.search(r'<p id="shown-first">(.*?)</p>', html, re.S).group(1)
    assert "not measured" not in shown and "measured no faithfulness of its own" in shown
    assert "(200 documents of other.jsonl · all rows (200 documents)" in html


def test_the_faithfulness_sample_keeps_the_splits_share_of_errors_and_its_classes():
    # A capped report: 40 errors listed first, then 60 correct documents (of a split of 1,000
    # with 5 % errors). The sample must not inherit the report's 40 % of errors.
    records = [{"label": "a", "predicted": "b"}] * 40 + [
        {"label": "abc"[i % 3], "predicted": "abc"[i % 3]} for i in range(60)
    ]
    chosen = faithfulness_sample(records, 20, error_share=0.05)
    assert len(chosen) == 20 and chosen == sorted(set(chosen))
    assert sum(i < 40 for i in chosen) == 1
    assert [sum(records[i]["label"] == c for i in chosen if i >= 40) for c in "abc"] == [7, 6, 6]
    assert faithfulness_sample(records, 20, error_share=0.05) == chosen  # reproducible
    # Uncapped, the records are the split: their own share (40 % → 8 of 20).
    assert sum(i < 40 for i in faithfulness_sample(records, 20)) == 8
    # More errors wanted than correct documents can fill: the rest are errors.
    assert sum(i < 40 for i in faithfulness_sample(records[:45], 20, error_share=0.0)) == 15
    assert faithfulness_sample(records, 100) == list(range(100))


def test_a_capped_report_measured_whole_still_keeps_the_splits_share_of_errors():
    # The same capped report with no faithfulness sample asked for: measuring all 100 records
    # would make 40 % of the table errors. The most records that keep 5 %: 60 correct, 3 errors.
    records = [{"label": "a", "predicted": "b"}] * 40 + [
        {"label": "abc"[i % 3], "predicted": "abc"[i % 3]} for i in range(60)
    ]
    chosen = faithfulness_positions(records, None, error_share=0.05)
    assert len(chosen) == 63 and sum(i < 40 for i in chosen) == 3
    assert faithfulness_positions(records, None, None) == list(range(100))  # uncapped: all
    assert faithfulness_positions(records, 20, 0.05) == faithfulness_sample(records, 20, 0.05)
    # A split of mostly errors (82 %) capped to half of them: 50 errors and 50 correct records
    # shown; the most that keep 82 % are 60 (int(50 / 0.82)), 49 of them errors, not all 100.
    mostly_wrong = [records[0]] * 50 + records[40:90]
    chosen = faithfulness_positions(mostly_wrong, None, error_share=0.82)
    assert len(chosen) == 60 and sum(i < 50 for i in chosen) == 49


def test_faithfulness_on_a_class_stratified_sample_says_so(tmp_path):
    classifier = tiny_classifier(n_layers=1)
    # Grouped by class, as splits often are: the first six would be two classes only.
    texts = [f"{DOCUMENTS[i // 4]} {i}" for i in range(12)]
    labels = [LABELS[i // 4] for i in range(12)]
    documents = Documents(texts, [str(i) for i in range(12)], labels, "twelve documents")
    make_report(classifier, documents, tmp_path, faithfulness_documents=6)
    records = read_jsonl(tmp_path / "explanations.jsonl.gz")
    measured = [r for r in records if r.get("faithfulness")]
    assert len(records) == 12 and len(measured) == 6
    # Counterfactuals are searched on the same documents.
    assert [bool(r.get("counterfactual")) for r in records] == [
        bool(r.get("faithfulness")) for r in records
    ]
    # Misclassified documents in their share of the split: the table describes documents as
    # they come, not the errors a report lists first.
    errors = sum(r["label"] != r["predicted"] for r in records)
    assert sum(r["label"] != r["predicted"] for r in measured) == round(6 * errors / 12)
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "a sample of 6 of the 12 documents (" in index
    assert f"misclassified; the split has {100 * errors / 12:.1f} % errors), drawn" in index
    meta = json.loads((tmp_path / REPORT_META).read_text())
    assert meta["faithfulness"]["documents"] == 6
    left_out = records.index(next(r for r in records if not r.get("faithfulness")))
    page = (tmp_path / "docs" / document_filename(left_out)).read_text(encoding="utf-8")
    assert "this document is not among them" in page and 'id="faithfulness-badge"' not in page
    assert "Counterfactuals are searched on the documents whose faithfulness was measured" in page
    assert "searched on the faithfulness sample" in index


def test_the_index_shows_no_checks_measured_on_other_weights(tmp_path):
    """faithfulness.json names the weights it measured; a report of other weights ignores it."""
    from docclass.report.html import _trust_section

    (tmp_path / "faithfulness.json").write_text(json.dumps({"weights": "b" * 64}))
    assert _trust_section(None, tmp_path, weights="a" * 64) is None


def test_the_index_and_the_api_show_no_checks_measured_under_other_score_rules(tmp_path):
    """The same weights, scores made by other rules: faithfulness.json's tables are neither
    the report's checks nor the model's figures beside its own table."""
    from docclass.inference.model_facts import REPORT_TABLE, faithfulness_tables
    from docclass.interpret.methods import score_rules
    from docclass.report.html import _trust_section

    weights, current = "a" * 64, score_rules()
    table = {"aopc": {"random": {"comprehensiveness": 0.1, "sufficiency": 0.3}}}
    measured = {"weights": weights, "scores": current, "removal": {"mask": table}}
    (tmp_path / "faithfulness.json").write_text(json.dumps(measured))
    own = {"documents": 3, "methods": {}}
    for scores in ("old rules", current):
        meta = {"weights": weights, "scores": scores, "faithfulness": own}
        (tmp_path / "report.json").write_text(json.dumps(meta))
        same = scores == current
        assert (_trust_section(None, tmp_path, weights, scores) is not None) == same
        tables = faithfulness_tables(tmp_path, weights)
        assert ("mask" in tables) == same and (REPORT_TABLE in tables) == same


def test_the_class_views_of_a_confusion_matrix():
    names = [f"c{i}" for i in range(25)]
    perfect = np.diag(np.arange(1, 26))
    view = matrix_view(perfect, names)
    # No errors: the 20 largest classes, in the model's order, and the five others counted.
    assert view["names"] == names[5:] and view["hidden"] == 5 and view["present"] == 25
    confused = perfect.copy()
    confused[0, 1] = 4  # c0 read as c1 four times
    view = matrix_view(confused, names)
    assert view["names"][:2] == ["c0", "c1"] and len(view["names"]) == 20
    row = view["rows"][0]
    assert row["cells"][1]["count"] == 4 and "4 of 5 (80 %)" in row["cells"][1]["title"]
    rows = class_rows(confused, names)
    assert rows[0]["name"] == "c0"  # worst F1 first
    assert rows[0]["recall"] == pytest.approx(1 / 5) and rows[0]["support"] == 5
    assert rows[1]["name"] == "c1" and rows[1]["precision"] == pytest.approx(2 / 6)
    cells = [{"true": "c0", "predicted": "c1", "documents": [{}] * 4}]
    (pair,) = pair_rows(cells, confused, names)
    assert (pair["count"], pair["share"], pair["anchor"]) == (4, pytest.approx(0.8), "cell-1")


@pytest.mark.fault(
    "the label audit's page of hostile documents opened in Chromium",
    "every id and word escaped, each entry's link opens its page; no script runs, no console "
    "error, no network request",
)
def test_audit_page_in_chromium(browser, report, tmp_path):
    from docclass.interpret.default_method import default_method
    from docclass.report.audit import write_audit_report

    records = [dict(record) for record in report[1][:2]]  # the module's records left as they are
    flagged = []
    for rank, record in enumerate(records, start=1):
        suggested = next(name for name in LABELS if name != record["label"])
        flagged.append(
            {"rank": rank, "id": record["id"], "split": "train", "given": record["label"],
             "suggested": suggested, "score": record["probs"][record["label"]],
             "p_given": record["probs"][record["label"]],
             "p_suggested": record["probs"][suggested], "fold": 0}
        )  # fmt: skip
        # The audit's contrast, here the record's own conservative scores.
        record["audit_contrast"] = {"method": "conservative", "toward": suggested,
                                    "against": record["label"],
                                    "scores": record["scores"]["conservative"]}  # fmt: skip
    summary = {"config": "<b>x</b>.yaml", "documents": 40, "folds": 2, "flagged": 2,
               "filter_by": "prune_by_noise_rate", "out_of_sample_accuracy": 0.9,
               "by_class": [{"label": n, "documents": 10, "flagged": 1} for n in LABELS],
               "retrain": None, "with_audits": []}  # fmt: skip
    index = write_audit_report(flagged, records, summary, tmp_path / "audit", default_method(None))
    page, problems, dialogs = open_page(browser, index)
    assert page.evaluate("window.pwned") is None and dialogs == []
    links = page.locator("#audit-table a")
    assert links.all_text_contents() == [str(record["id"]) for record in records]
    assert page.locator("#flagged-count").text_content() == "2"
    # The words for each label are the record's own, as text, never markup.
    cells = page.locator("#audit-table tr:nth-child(2) td").all_text_contents()
    assert flagged[0]["given"] in cells[2] and flagged[0]["suggested"] in cells[4]
    words = [w for cell in (cells[3], cells[5]) for w in cell.split(", ") if w != "none"]
    assert words and all(w in records[0]["words"] for w in words)
    page.screenshot(path=str(tmp_path / "audit.png"), full_page=True)
    links.first.click()
    page.wait_for_load_state("load")
    assert page.locator("#text").text_content() == records[0]["text"]
    assert page.evaluate("window.pwned") is None and dialogs == [] and problems == []


def test_a_blank_label_in_a_source_to_explain_is_no_label(tmp_path):
    """A partly labelled file: its blank rows are unlabelled, not a class named "" that every
    prediction would miss."""
    (tmp_path / "docs.csv").write_text("text,label\nfirst text,sport\nsecond text,\n")
    documents = load_documents(str(tmp_path / "docs.csv"), ckpt="not read for a data file")
    assert documents.labels == ["sport", None]


def test_a_hub_split_marked_unlabelled_is_explained_without_labels(tmp_path):
    """A hub-style test split whose ClassLabel is -1 (no label) is explained, its rows
    unlabelled; training would refuse it, a report must not."""
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["a", "b"])}
    )
    (tmp_path / "data").mkdir()
    for split, labels in (("train", [0, 1]), ("test", [-1, -1])):
        datasets.Dataset.from_dict(
            {"text": ["first text", "second text"], "label": labels}, features=features
        ).to_parquet(str(tmp_path / "data" / f"{split}-0.parquet"))
    documents = load_documents(str(tmp_path), ckpt="not read for a data file", split="test")
    assert documents.labels == [None, None] and documents.texts == ["first text", "second text"]


@pytest.mark.fault(
    "`docclass report --data <dataset folder> --split validation` (or a split the folder lacks)",
    "that split's documents explained, under its name; a split other than train or test that "
    "is absent refused in one line naming the splits (it explained the training split)",
)
def test_a_report_of_a_sources_validation_split_explains_that_split(tmp_path):
    for name, count in (("train", 5), ("validation", 3), ("test", 4)):
        rows = "".join(f"{name} doc {i},a\n" for i in range(count))
        (tmp_path / f"{name}.csv").write_text("text,label\n" + rows)
    documents = load_documents(str(tmp_path), ckpt="not read", split="validation")
    assert documents.texts == [f"validation doc {i}" for i in range(3)]
    assert "· validation (3 documents)" in documents.description
    assert len(load_documents(str(tmp_path), ckpt="not read", split="test").texts) == 4
    with pytest.raises(DataError, match=r"has no split 'dev' \(it has \['train', 'validation'"):
        load_documents(str(tmp_path), ckpt="not read", split="dev")
    # One file has no splits: explained whole, whatever --split says.
    whole = load_documents(str(tmp_path / "train.csv"), ckpt="not read", split="validation")
    assert len(whole.texts) == 5 and "all rows" in whole.description


@pytest.mark.fault(
    "report or faithfulness with `--out` naming a file, or a path through one",
    "one line before anything is loaded or measured; never a FileExistsError traceback after "
    "the measuring",
)
@pytest.mark.parametrize("command", ["report", "faithfulness"])
def test_an_out_that_is_a_file_is_refused_before_anything_runs(tmp_path, monkeypatch, command):
    from docclass.errors import UserError
    from docclass.inference import reporting

    def loaded(*_args, **_kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(reporting, "load_classifier", loaded)
    monkeypatch.setattr(reporting, "load_documents", loaded)
    run = getattr(reporting, f"{command}_command")
    taken = tmp_path / "notes.txt"
    taken.write_text("not a folder")
    for out in (taken, taken / "report"):
        with pytest.raises(UserError, match=f"--out {out}: {taken} is a file, not a folder"):
            run(ckpt="model.ckpt", data="bbc", out=str(out))


@pytest.mark.fault(
    "report of a model with `--data` the very source it trained on, which has no test split "
    "(`--data bbc` for a BBC-trained run), or a single file it trained on",
    "one line pointing to the run's config; never its training documents explained and "
    "scored as new ones",
)
def test_a_report_of_the_source_a_model_trained_on_without_its_split_is_refused(fitted):
    from docclass.inference.reporting import load_documents

    ckpt = str(fitted / "checkpoints" / "last.ckpt")
    with pytest.raises(DataError, match="bbc: the model trained on it, and it has no 'test' s"):
        load_documents("bbc", ckpt)
    # Asked for as training documents, they are what the user asked for.
    assert len(load_documents("bbc", ckpt, split="train").texts) > 0
