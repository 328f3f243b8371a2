"""``docclass serve``: a real server process, real HTTP requests over loopback."""

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmarks.server import post_json, request, running_server
from docclass.cli import command_parser, main
from docclass.inference.classifier import DocClassifier
from docclass.inference.serve import (
    DEFAULT_MAX_TOKENS,
    MAX_TEXTS_PER_REQUEST,
    ClassifierAPI,
    PredictRequest,
    token_cap,
)

TEXTS = [
    "Shares in the bank rose after it reported record quarterly profits and a higher dividend.",
    "The striker scored twice as the home side won the cup final in extra time.",
    "Ministers will publish the bill next week, the prime minister told parliament.",
    "The band's new album tops the charts, and the film of their tour opens on Friday.",
    "The phone maker unveiled a faster chip and software that blocks spam calls.",
    "Oil prices fell as markets waited for the central bank's interest rate decision.",
]
# Small enough that a test can exceed it cheaply; large enough for every ordinary request here.
MAX_BODY_MB = 0.25
# The server's cap on tokens per text, below the tiny model's own 64 so a test sees which one
# cut a text; every text in TEXTS is shorter (25 tokens at most).
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def ckpt(fitted):
    return fitted / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    # A batch wait long enough that concurrent requests really share model calls.
    args = ["--device", "cpu", "--max_body_mb", str(MAX_BODY_MB), "--batch_timeout", "0.05"]
    args += ["--max_tokens", str(MAX_TOKENS)]
    with running_server(ckpt, extra_args=args, log_path=log) as port:
        yield port


@pytest.fixture(scope="module")
def local(ckpt):
    """The same checkpoint in this process: what the server must agree with."""
    return DocClassifier.load(ckpt, device="cpu")


def assert_same_result(served: dict, expected: dict) -> None:
    assert served["label"] == expected["label"]
    assert served["truncated"] == expected["truncated"]
    assert served["probs"].keys() == expected["probs"].keys()
    for name, p in expected["probs"].items():
        # Batch composition differs (padding width), so allow float noise, nothing more.
        assert served["probs"][name] == pytest.approx(p, abs=1e-4)


def test_health_and_info(server, local):
    assert request(server, "GET", "/health") == (200, "ok")
    status, info = request(server, "GET", "/info")
    assert status == 200
    assert info["model"]["labels"] == local.labels
    assert info["model"]["max_texts_per_request"] == MAX_TEXTS_PER_REQUEST
    assert info["model"]["default_method"] == local.default_method
    assert info["model"]["default_method_reason"] == local.default_reason
    assert info["model"]["max_tokens"] == MAX_TOKENS  # the server's cap, not the model's 64
    assert info["model"]["temperature"] == local.temperature != 1  # fitted after `fit`


@pytest.mark.fault(
    "serve's model replaced between the server's read and a worker's (a run's last.ckpt saved "
    "again, a folder exported anew)",
    "the worker refuses in one line naming what differs (weights, labels, temperature) from "
    "/info; it served other weights than /info described",
)
def test_a_worker_serves_only_the_model_info_describes(ckpt, tmp_path, monkeypatch):
    import hashlib
    import shutil

    import torch

    from docclass.artifacts.hashing import write_checkpoint_hashes
    from docclass.inference import serve

    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    shutil.copytree(ckpt.parent, path.parent)
    shutil.copy(ckpt.parents[1] / "calibration.json", tmp_path / "run")
    local_path, facts = serve._read_model(str(path))
    assert facts["weights"] == DocClassifier.load(path).trained.fingerprint
    described = {key: facts[key] for key in ("weights", "labels", "temperature")}
    # setup's process-wide steps are a worker's own: kept out of this test process.
    for name in ("end_with_parent", "_freeze_loaded_objects"):
        monkeypatch.setattr(serve, name, lambda *args: None)
    monkeypatch.setattr(serve.signal, "signal", lambda *args: None)
    api = ClassifierAPI(local_path, described=described)
    api.setup("cpu")  # the same file: served
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["state_dict"]["model.head.weight"] += 0.5
    torch.save(checkpoint, path)
    write_checkpoint_hashes(path, [hashlib.sha256(path.read_bytes()).hexdigest()])
    with pytest.raises(RuntimeError, match=r"changed since the server read it \(temperature, "
                       r"weights differ from what /info says\)"):  # fmt: skip
        ClassifierAPI(local_path, described=described).setup("cpu")


def test_predict_round_trip_equals_python_api(server, local):
    texts = [*TEXTS, "   ", "Short."]
    status, body = post_json(server, {"texts": texts})
    assert status == 200
    results = body["results"]
    assert len(results) == len(texts)  # every text gets a result, in order
    expected = local.predict(texts, word_scores=True)
    for text, served, wanted in zip(texts, results, expected, strict=True):
        if "error" in wanted:
            assert served == wanted
            assert not text.strip()
            continue
        assert_same_result(served, wanted)
        # Word scores by default, from the model's most faithful method, named.
        assert served["method"] == local.default_method
        assert served["words"] == wanted["words"]
        assert served["spans"] == wanted["spans"]
        # The words are the text's own characters at their spans, with one score each.
        assert [text[s:e] for s, e in served["spans"]] == served["words"]
        assert len(served["scores"]) == len(served["words"])
        assert served["scores"] == pytest.approx(wanted["scores"], abs=1e-4)
    assert "empty document" in results[len(TEXTS)]["error"]


def test_options_are_honoured_per_request(server):
    body = {"texts": TEXTS[:2], "word_scores": False, "top_words": 2, "method": "attention"}
    status, body = post_json(server, body)
    assert status == 200
    for result in body["results"]:
        assert "words" not in result and "scores" not in result
        assert result["method"] == "attention"
        assert len(result["top_words"]) == 2
        first, second = result["top_words"]
        assert first["score"] >= second["score"]
    status, body = post_json(server, {"texts": TEXTS[:1], "word_scores": False})
    assert "method" not in body["results"][0] and "top_words" not in body["results"][0]


def test_concurrent_requests_each_get_their_own_answer(server, local):
    """Many clients at once: batched together by the server, answered separately."""
    methods = [None, "attention", "grad_input", "rollout"]
    expected = {method: local.predict(TEXTS, word_scores=True, method=method) for method in methods}

    def ask(i: int):
        # Each client asks about a different slice, with different options and methods, so an
        # answer delivered to the wrong request, or trimmed or scored for another's, shows.
        texts = TEXTS[i % len(TEXTS) :]
        options = {"word_scores": i % 2 == 0, "top_words": i % 3, "method": methods[i % 4]}
        return i, texts, options, post_json(server, {"texts": texts, **options})

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(32)))
    for i, texts, options, (status, body) in answers:
        assert status == 200, body
        results = body["results"]
        assert len(results) == len(texts)
        offset = TEXTS.index(texts[0])
        for j, result in enumerate(results):
            wanted = expected[options["method"]][offset + j]
            assert_same_result(result, wanted)
            assert ("words" in result) == options["word_scores"], i
            if options["word_scores"]:
                assert result["method"] == wanted["method"], i
                assert result["scores"] == pytest.approx(wanted["scores"], abs=1e-4), i
            assert len(result.get("top_words", [])) == options["top_words"], i


def test_a_batch_of_requests_is_answered_request_by_request(local):
    """What the worker does with requests LitServe gathered: one model call, split back."""
    api = ClassifierAPI("unused.ckpt")
    api.classifier = local  # what setup() loads, without its process-wide signal handling
    requests = [
        PredictRequest(texts=TEXTS[:2], word_scores=False, top_words=1),
        PredictRequest(texts=[" "], method="rollout"),
        PredictRequest(texts=TEXTS[2:], top_words=3, method="attention"),
    ]
    answers = api.unbatch(api.predict(api.batch(requests)))
    assert [len(answer) for answer in answers] == [2, 1, len(TEXTS) - 2]
    first, empty, last = answers
    assert all("words" not in r and len(r["top_words"]) == 1 for r in first)
    assert "error" in empty[0]
    assert all("words" in r and len(r["top_words"]) == 3 for r in last)
    assert {r["method"] for r in first} == {local.default_method}
    assert {r["method"] for r in last} == {"attention"}
    alone = [api.predict(request) for request in requests]  # unbatched: one request at a time
    for batched, single in zip(answers, alone, strict=True):
        for a, b in zip(batched, single, strict=True):
            assert a.keys() == b.keys()
            if "error" not in a:
                assert_same_result(a, b)
                top_a, top_b = a.get("top_words", []), b.get("top_words", [])
                assert [w["word"] for w in top_a] == [w["word"] for w in top_b]
                assert [w["score"] for w in top_a] == pytest.approx(
                    [w["score"] for w in top_b], abs=1e-4
                )
    assert api.encode_response(answers[0]) == {"results": answers[0]}


def test_calibrated_and_raw_requests_in_one_batch_each_get_theirs(local):
    api = ClassifierAPI("unused.ckpt")
    api.classifier = local
    cut = sorted(r["score"] for r in local.predict(TEXTS[:2]))[1]
    requests = [
        PredictRequest(texts=TEXTS[:2]),
        PredictRequest(texts=TEXTS[:2], calibrated=False),
        PredictRequest(texts=TEXTS[:2], min_probability=cut),
    ]
    calibrated, raw, marked = api.predict(requests)
    assert marked == local.predict(TEXTS[:2], min_probability=cut, word_scores=True)
    assert [r["uncertain"] for r in marked] == [r["score"] < cut for r in calibrated]
    assert "uncertain" not in calibrated[0]
    for answer, wanted in ((calibrated, local.predict(TEXTS[:2])),
                           (raw, local.predict(TEXTS[:2], calibrated=False))):  # fmt: skip
        for a, b in zip(answer, wanted, strict=True):
            assert_same_result(a, b)
    assert calibrated[0]["probs"] != pytest.approx(raw[0]["probs"], abs=1e-3)


def test_a_threshold_for_an_uncalibrated_model_fails_its_own_request_not_the_batch(local):
    api = ClassifierAPI("unused.ckpt")
    api.classifier = DocClassifier(local.trained, "cpu")  # no calibration given: raw
    assert not api.classifier.calibrated
    plain, thresholded = api.predict(
        [PredictRequest(texts=TEXTS[:2]), PredictRequest(texts=TEXTS[:1], min_probability=0.5)]
    )
    assert [r["label"] for r in plain] == [r["label"] for r in local.predict(TEXTS[:2])]
    assert thresholded[0]["label"] is None
    assert "these weights have no calibration" in thresholded[0]["error"]


@pytest.mark.fault(
    "server: a text longer than `--max_tokens` (8192 by default when the model sets no limit)",
    "read up to the cap and answered with `truncated: true`, as `classify` cuts a text",
)
def test_a_text_over_the_token_cap_is_cut_and_flagged(server, ckpt, local):
    text = " ".join(TEXTS)  # about 130 tokens: over the server's cap and the model's own 64
    capped = DocClassifier.load(ckpt, device="cpu")
    capped.trained.max_tokens = MAX_TOKENS
    status, body = post_json(server, {"texts": [text]})
    assert status == 200
    (served,) = body["results"]
    wanted = capped.predict(text, word_scores=True)[0]
    assert served["truncated"] is True
    assert_same_result(served, wanted)
    assert served["words"] == wanted["words"]
    # The server's cap cut it, not the model's own: it read fewer words than the model would.
    assert len(served["words"]) < len(local.predict(text, word_scores=True)[0]["words"])


def test_the_token_cap_applies_when_the_model_sets_none():
    assert command_parser("serve").parse_args(["--ckpt", "x"]).max_tokens == DEFAULT_MAX_TOKENS
    assert token_cap(None, DEFAULT_MAX_TOKENS) == DEFAULT_MAX_TOKENS  # saved with max_tokens: null
    assert token_cap(512, DEFAULT_MAX_TOKENS) == 512  # the model's own limit, when smaller
    assert token_cap(512, 100) == 100


BAD_BODIES = [
    (b'{"texts": ["unfinished', "not valid JSON"),
    (b'{"texts": "one string"}', "texts: Input should be a valid list"),
    (b'{"texts": [1, 2]}', "texts.0: Input should be a valid string"),
    (b'{"texts": [null]}', "texts.0"),
    (b'{"texts": []}', "texts: List should have at least 1 item"),
    (b'{"text": ["a typo in the field name"]}', "texts: Field required"),
    (b'{"texts": ["a"], "top_words": -1}', "top_words"),
    (b'{"texts": ["a"], "word_scores": "yes"}', "word_scores"),
    (b'{"texts": ["a"], "method": "lime"}', "method"),
    (b'{"texts": ["a"], "min_probability": 1.5}', "min_probability"),
    (
        b'{"texts": ["a"], "min_probability": 0.5, "calibrated": false}',
        "min_probability applies to the calibrated probabilities",
    ),
    # A lone surrogate is valid JSON but no text: refused for this request, never its batch.
    (b'{"texts": ["ok", "lone \\ud800 surrogate"]}', "texts[1] holds a lone surrogate"),
    (b"[]", "body: Input should be a valid dictionary"),
    (
        json.dumps({"texts": ["a"] * (MAX_TEXTS_PER_REQUEST + 1)}).encode(),
        f"texts: List should have at most {MAX_TEXTS_PER_REQUEST} items",
    ),
]


@pytest.mark.fault(
    "server: malformed JSON, wrong types, unknown field, no texts, more than 256 "
    "texts, negative `top_words`, a text holding a lone surrogate (`\\ud800`)",
    "422 with a one-line `error` naming the fix; the server keeps serving",
)
@pytest.mark.parametrize(("body", "message"), BAD_BODIES, ids=[m for _, m in BAD_BODIES])
def test_bad_bodies_get_422_with_a_one_line_message(server, body, message):
    status, answer = request(server, "POST", "/predict", body, {"content-type": "application/json"})
    assert status == 422
    assert message in answer["error"]
    assert "\n" not in answer["error"]
    assert '{"texts": ["document", ...]}' in answer["error"]  # the fix, not only the fault


@pytest.mark.fault(
    "server: JSON body without `content-type: application/json` (`curl -d`)",
    "read as JSON: 200, the same answer",
)
@pytest.mark.fault(
    "server: body that is not UTF-8",
    "400 saying to send UTF-8 encoded JSON",
)
def test_non_utf8_body_is_explained(server):
    body = b'{"texts": ["caf\xe9 \xff"]}'
    status, answer = request(server, "POST", "/predict", body, {"content-type": "application/json"})
    assert status == 400
    assert "UTF-8" in answer["error"] and '{"texts": ["document", ...]}' in answer["error"]
    assert post_json(server, {"texts": ["café"]})[0] == 200  # still serving


def test_json_body_without_json_content_type_is_read_as_json(server):
    body = json.dumps({"texts": TEXTS[:2]}).encode()
    wanted = post_json(server, {"texts": TEXTS[:2]})
    # Labels that merely contain "json" too: they were left as sent, and FastAPI answered 422.
    for content_type in (
        None,
        "application/x-www-form-urlencoded",
        "text/json",
        "text/plain; x=json",
    ):
        headers = {"content-type": content_type} if content_type else {}
        assert request(server, "POST", "/predict", body, headers) == wanted, headers


@pytest.mark.fault(
    "server: GET /docs, /redoc or /openapi.json",
    "404: the server serves no page (LitServe's Swagger page loaded unpinned third-party "
    "scripts into the server's own origin, which the web-page refusal lets through)",
)
def test_the_server_serves_no_pages(server):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert request(server, "GET", path)[0] == 404, path


@pytest.mark.fault(
    "server: body over `--max_body_mb`",
    "413; the next request gets 200",
)
def test_oversized_body_gets_413_and_the_server_keeps_serving(server):
    text = "word " * int(MAX_BODY_MB * 1024 * 1024 / 5 + 1000)
    status, answer = post_json(server, {"texts": [text]})
    assert status == 413
    assert "too large" in answer["error"]
    status, body = post_json(server, {"texts": TEXTS[:1]})
    assert status == 200 and body["results"][0]["label"]


@pytest.mark.fault(
    "server: a request a web page made (an `Origin` header: a page of another site posting "
    "text/plain, which needs no CORS preflight), or one naming the server by another host "
    "name (DNS rebinding)",
    "403 with a one-line reason, nothing classified; programs (no Origin, Host 127.0.0.1 or "
    "localhost) are served",
)
def test_requests_from_web_pages_and_rebound_names_are_refused(server):
    body = json.dumps({"texts": TEXTS[:1]}).encode()
    here = f"127.0.0.1:{server}"
    for headers, refused in [
        ({"content-type": "text/plain", "origin": "https://evil.example"}, "Origin"),
        ({"origin": "null"}, "Origin"),
        ({"host": f"rebound.evil.example:{server}"}, "loopback name"),
        ({"host": f"127.evil.example:{server}", "origin": f"http://127.evil.example:{server}"},
         "loopback name"),
        ({"host": f"rebound.evil.example:{server}", "origin": f"http://rebound.evil.example:{server}"},
         "loopback name"),
    ]:  # fmt: skip
        status, answer = request(server, "POST", "/predict", body, headers)
        assert status == 403 and refused in answer["error"] and "\n" not in answer["error"]
        assert request(server, "GET", "/info", None, headers)[0] == 403
    for host in (here, f"localhost:{server}", f"[::1]:{server}", f"127.0.0.2:{server}"):
        assert request(server, "POST", "/predict", body, {"host": host})[0] == 200, host
    # A browser's same-origin request names the server itself: served.
    assert request(server, "POST", "/predict", body, {"origin": f"http://{here}"})[0] == 200


def test_a_server_open_to_the_network_serves_any_host_name_but_no_web_page():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from docclass.inference.serve import RefuseWebPages

    async def answer(request):
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/predict", answer, methods=["POST"])])
    app.add_middleware(RefuseWebPages, loopback=False)
    client = TestClient(app)  # a client on another machine
    assert client.post("/predict", headers={"host": "models.example:8000"}).status_code == 200
    refused = client.post("/predict", headers={"host": "models.example", "origin": "https://x.org"})
    assert refused.status_code == 403
    # This machine's clients name it as they like: 0.0.0.0 as uvicorn prints it, its hostname.
    here = TestClient(app, client=("127.0.0.1", 50000))
    for host in ("0.0.0.0:8000", "myhost.lan:8000", "localhost:8000"):
        assert here.post("/predict", headers={"host": host}).status_code == 200, host


def _other_addresses() -> set[str]:
    """Addresses of this machine other than 127.0.0.1.

    127.0.0.2 is always one on Linux (all of 127/8 is local), and a server bound to 0.0.0.0
    would answer there; the primary interface's address is found without sending a packet.
    """
    addresses = {"127.0.0.2"}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.123", 9))
            addresses.add(probe.getsockname()[0])
        except OSError:
            pass
    return addresses - {"127.0.0.1"}


@pytest.mark.fault(
    "server: connection from another address of the machine",
    "refused: it listens on 127.0.0.1 only",
)
def test_server_listens_on_loopback_only(server):
    assert command_parser("serve").parse_args(["--ckpt", "x"]).host == "127.0.0.1"
    for address in _other_addresses():
        with socket.socket() as probe, pytest.raises(OSError):
            probe.settimeout(2)
            probe.connect((address, server))
    with socket.create_connection(("127.0.0.1", server), timeout=2):
        pass


@pytest.mark.fault(
    "serve: missing checkpoint",
    "one line before any process starts",
)
def test_missing_checkpoint_is_one_line_before_anything_starts(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--ckpt", str(tmp_path / "nope.ckpt"), "--port", "8123"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("docclass: error:") and "nope.ckpt" in error
    assert "\n" not in error


@pytest.mark.fault(
    "serve: port already in use",
    "one line naming host:port and `--port`",
)
def test_busy_port_is_one_line(ckpt, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", "--ckpt", str(ckpt), "--port", str(port)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert f"127.0.0.1:{port}" in error and "--port" in error
    assert "\n" not in error


@pytest.mark.parametrize(
    "args",
    [
        ["--port", "80"],
        ["--max_batch_size", "0"],
        ["--batch_timeout", "90", "--timeout", "60"],
        ["--device", "tpu"],
    ],
)
@pytest.mark.fault(
    "serve: port below 1024, zero batch size, batch wait longer than the timeout, unknown device",
    "one line, exit 2",
)
def test_bad_options_are_one_line(ckpt, capsys, args):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--ckpt", str(ckpt), *args])
    assert exit_info.value.code == 2
    assert "\n" not in capsys.readouterr().err.strip()
