"""``docclass serve``: classify documents over HTTP on this machine, with LitServe.

    docclass serve --ckpt reports/bbc/checkpoints/last.ckpt          # http://127.0.0.1:8000
    curl -s localhost:8000/predict -H 'content-type: application/json' \\
         -d '{"texts": ["Shares rose after the results..."]}'

``POST /predict`` takes ``{"texts": [...], "word_scores": true, "method": null, "top_words": 0}``
and answers ``{"results": [...]}``: one result per text, in order, as ``DocClassifier.predict``
gives it (``label, score, probs, truncated`` and, unless ``word_scores`` is false, the words
read with their scores and the ``method`` that gave them: the model's most faithful one unless
the request names another), or ``{label: null, score: null, error}`` for a text with nothing to
classify. ``GET /health`` answers ``ok`` once the model is loaded; ``GET /info`` names the labels
and the default method with the reason it was chosen. A body sent without a JSON content type
(``curl -d``) is read as JSON all the same.

LitServe runs the model in its own worker process and gathers concurrent requests into one
model call (``--max_batch_size``, ``--batch_timeout``); the texts of a call are then grouped by
length (``docclass.interpret.inputs``), so a short document never waits on padding to a long one.

The body is validated before it reaches the model: malformed JSON and wrong types get 422,
bodies over ``--max_body_mb`` get 413, and more than ``MAX_TEXTS_PER_REQUEST`` texts get 422 —
each with a one-line ``error`` naming the fix. A text is read up to ``--max_tokens`` tokens
(``DEFAULT_MAX_TOKENS`` for a model saved without a limit, the model's own when smaller); the
rest is cut and its result says ``truncated: true``, as ``classify`` does.

SIGTERM or SIGINT to the server process stops it cleanly: it stops accepting connections,
answers the requests in flight, then ends every process it started. On Linux the kernel also
ends them if the server process is killed outright (SIGKILL).
"""

# No ``from __future__ import annotations`` here: LitServe reads ``decode_request``'s annotation
# at run time to build the endpoint, and a string would make FastAPI expect a query parameter.
import functools
import gc
import ipaddress
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from typing import Any, Literal
from urllib.parse import urlsplit

import litserve
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from docclass.errors import ConfigError
from docclass.inference.classifier import WordScoreMethod
from docclass.processes import end_with_parent

# A request is classified as a unit: this bounds the work one client can put in one batch.
MAX_TEXTS_PER_REQUEST = 256
MAX_TOP_WORDS = 100
# What LitServe accepts: this machine only, or every IPv4 / IPv6 interface.
Host = Literal["127.0.0.1", "0.0.0.0", "::"]
# Tokens read per text when the model sets no limit. A model saved with ``max_tokens: null``
# reads whole documents, and a method that builds every block's T×T attention (rollout,
# grad_input, conservative: the default of a model with no measured table) on one 8 MB text
# runs a worker out of memory.
DEFAULT_MAX_TOKENS = 8192
# Seconds a process LitServe left behind gets between SIGTERM and SIGKILL.
CHILD_GRACE_S = 10.0
# What stops the server: `kill`, `docker stop`, systemd (SIGTERM) and Ctrl+C (SIGINT).
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}

logger = logging.getLogger(__name__)


def _freeze_loaded_objects() -> None:
    """Keep the garbage collector off what is loaded once (torch, the model, the app).

    Without this, a full collection walks every object torch created, stalling all requests at
    once: 8 clients saw ~24 of 800 requests take 250–370 ms instead of ~60 ms (p99 330 ms →
    87 ms with the freeze, ``make serve-load``). ``DOCCLASS_SERVE_GC_FREEZE=0`` turns it off
    for that comparison.
    """
    if os.environ.get("DOCCLASS_SERVE_GC_FREEZE", "1") != "0":
        gc.collect()
        gc.freeze()


class PredictRequest(BaseModel):
    """The body of ``POST /predict``. Unknown fields are refused so a typo is not ignored."""

    model_config = ConfigDict(extra="forbid")

    texts: list[StrictStr] = Field(min_length=1, max_length=MAX_TEXTS_PER_REQUEST)
    word_scores: StrictBool = True
    method: WordScoreMethod | None = None  # None: the model's default (most faithful) method
    top_words: int = Field(default=0, ge=0, le=MAX_TOP_WORDS, strict=True)
    # False: the raw softmax instead of the probabilities calibrated on the validation split.
    calibrated: StrictBool = True
    # Below this top probability a result is uncertain: no label, the model's in ``predicted``.
    min_probability: float | None = Field(default=None, gt=0, le=1, strict=True)

    @model_validator(mode="after")
    def _texts_are_unicode(self) -> "PredictRequest":
        # JSON may spell a lone surrogate ("\ud800"), which the tokenizer refuses: refused
        # here, for this request alone, not in the worker for its whole batch.
        for i, text in enumerate(self.texts):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:
                raise ValueError(
                    f"texts[{i}] holds a lone surrogate at character {error.start}; send "
                    "valid Unicode"
                ) from None
        return self

    @model_validator(mode="after")
    def _threshold_on_calibrated(self) -> "PredictRequest":
        # Refused here, as a 422 for this request alone: a refusal in the worker would fail
        # every request batched with it.
        if self.min_probability is not None and not self.calibrated:
            raise ValueError(
                'min_probability applies to the calibrated probabilities; drop "calibrated": false'
            )
        return self


class ClassifierAPI(litserve.LitAPI):
    """Loads the checkpoint in each worker process and answers ``/predict``.

    LitServe starts workers with ``spawn``, so this class lives at module level (it is pickled
    by reference) and carries only the checkpoint path, never the model. ``max_tokens`` is the
    most tokens read per text (None: the model's own limit).
    """

    def __init__(
        self,
        ckpt: str,
        batch_size: int = 64,
        max_batch_size: int = 16,
        batch_timeout: float = 0.0,
        max_tokens: int | None = None,
        described: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.ckpt = ckpt
        # What /info says of the model (weights, labels, temperature): a worker that loads
        # another (the path replaced since, a run's last.ckpt saved again) refuses to serve.
        self.described = described
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.server_pid = os.getpid()  # built in the server process, read in the worker

    def setup(self, device: str) -> None:
        from docclass.inference.classifier import DocClassifier

        end_with_parent(self.server_pid)
        # Ctrl+C reaches the whole process group; the server stops its workers itself, and a
        # worker interrupted mid-wait would only print a traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.classifier = DocClassifier.load(self.ckpt, device=device)
        if self.described is not None:
            loaded = _served_model(self.classifier)
            if loaded != self.described:
                differ = sorted(key for key in loaded if loaded[key] != self.described.get(key))
                raise RuntimeError(
                    f"{self.ckpt}: changed since the server read it ({', '.join(differ)} "
                    "differ from what /info says); restart the server"
                )
        if self.max_tokens is not None:
            # The limit every text is cut to where it is tokenized (``encode_documents``), so
            # a capped text is cut and flagged ``truncated`` exactly as the model's own limit.
            self.classifier.trained.max_tokens = self.max_tokens
        _freeze_loaded_objects()

    # LitServe takes the body type from this argument's annotation (the argument must be called
    # ``request``): FastAPI then validates every body before any model work is queued, so one
    # bad request never fails the batch it would have joined.
    def decode_request(self, request: PredictRequest) -> PredictRequest:
        return request

    def batch(self, inputs: list[PredictRequest]) -> list[PredictRequest]:
        return inputs

    def predict(self, requests: PredictRequest | list[PredictRequest]) -> Any:
        # Without batching LitServe hands over one request; with it, a list of them.
        single = isinstance(requests, PredictRequest)
        batch = [requests] if single else requests
        answers: list[Any] = [None] * len(batch)
        default = self.classifier.default_method
        by_call: dict[tuple[str, bool, float | None], list[int]] = {}
        for position, request in enumerate(batch):
            key = (request.method or default, request.calibrated, request.min_probability)
            by_call.setdefault(key, []).append(position)
        # One model call per method and calibration asked for; other options differ per
        # request, so compute the most any request asked for and trim per request below.
        for (method, calibrated, min_probability), positions in by_call.items():
            group = [batch[p] for p in positions]
            try:
                self.classifier.check_threshold(min_probability, calibrated)
            except ConfigError as error:
                # This model has no calibration: these requests' texts get the reason, the
                # other requests of the batch their answers.
                for position, request in zip(positions, group, strict=True):
                    answers[position] = [
                        {"label": None, "score": None, "error": str(error)} for _ in request.texts
                    ]
                continue
            results = self.classifier.predict(
                [text for request in group for text in request.texts],
                batch_size=self.batch_size,
                top_words=max(request.top_words for request in group),
                word_scores=any(request.word_scores for request in group),
                method=method,
                calibrated=calibrated,
                min_probability=min_probability,
            )
            start = 0
            for position, request in zip(positions, group, strict=True):
                own = results[start : start + len(request.texts)]
                start += len(request.texts)
                answers[position] = [_trim(result, request) for result in own]
        return answers[0] if single else answers

    def unbatch(self, outputs: list[Any]) -> list[Any]:
        return outputs

    def encode_response(self, output: list[dict[str, Any]]) -> dict[str, Any]:
        return {"results": output}


def _trim(result: dict[str, Any], request: PredictRequest) -> dict[str, Any]:
    """Drop what this request did not ask for (another request in its batch may have)."""
    if "error" in result:
        return result
    result = dict(result)
    if not request.word_scores:
        for key in ("words", "spans", "scores"):
            result.pop(key, None)
    if request.top_words:
        result["top_words"] = result["top_words"][: request.top_words]
    else:
        result.pop("top_words", None)
    if not (request.word_scores or request.top_words):
        result.pop("method", None)
    return result


def _validation_message(errors: list[dict[str, Any]]) -> str:
    """One line from FastAPI's validation errors: where, what, and the shape we expect."""
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
    what = first.get("msg", "invalid")
    if first.get("type") == "json_invalid":
        what = f"not valid JSON ({first.get('ctx', {}).get('error', 'decode error')})"
        where = "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return (
        f"{where}: {what}{more}; send "
        f'{{"texts": ["document", ...]}} with 1 to {MAX_TEXTS_PER_REQUEST} strings'
    )


class JsonBodies:
    """ASGI middleware: a ``POST /predict`` body is JSON whatever its content type says.

    ``curl -d '{"texts": [...]}'`` labels its body ``application/x-www-form-urlencoded``, and
    FastAPI then refuses to read it as JSON. The body is the same bytes either way, and JSON is
    the only thing /predict understands, so the label is set to what the endpoint reads.
    """

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") == "http" and scope.get("path") == "/predict":
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            # Every label, "text/json" too: FastAPI reads only application/json (and +json) as
            # JSON and answered 422 to a JSON body labelled otherwise.
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an interface, or the name a request's Host gives) is this machine's
    loopback: ``localhost`` or a loopback address (127.0.0.0/8, ::1). A name that merely starts
    with "127." (``127.attacker.example``) is a name someone else's DNS answers for."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    # ::ffff:127.0.0.1 is 127.0.0.1 as a dual-stack socket reports it.
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


class RefuseWebPages:
    """ASGI middleware: 403 for requests a web page made, which no client of this API is.

    - A request with an ``Origin`` header comes from a browser page. A page of another site may
      post to a local server without asking first (a "simple" request, which
      :class:`JsonBodies` would read as JSON): it is refused unless its origin is the server
      itself (this server serves no pages, so in practice always).
    - On a loopback interface, a ``Host`` that is not a loopback name means a name resolved
      to 127.0.0.1 by someone else's DNS ("DNS rebinding"), through which a page could read the
      answers and /info. Open to the network (``--host 0.0.0.0``), clients may use any name
      (the machine's own, 0.0.0.0 as uvicorn prints it, a proxy's), so that check is off: a
      server open to the network is open to a page that rebinds a name to it.
    """

    def __init__(self, app, loopback: bool) -> None:
        self.app, self.loopback = app, loopback

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") == "http":
            headers = {k.lower(): v.decode("latin-1") for k, v in scope["headers"]}
            reason = self._refusal(headers.get(b"host"), headers.get(b"origin"), self.loopback)
            if reason is not None:
                from starlette.responses import JSONResponse

                answer = JSONResponse(status_code=403, content={"error": reason})
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _refusal(host: str | None, origin: str | None, loopback: bool) -> str | None:
        if loopback and host is not None:
            name = urlsplit(f"//{host}").hostname or ""
            if not is_loopback(name):
                return (
                    f"Host {host!r} is not this machine's loopback name; from this machine, "
                    "call the server as 127.0.0.1 or localhost"
                )
        if origin is not None and urlsplit(origin).netloc != (host or ""):
            return (
                f"requests from web pages (Origin {origin!r}) are refused; call the API from a "
                "program, which sends no Origin header"
            )
        return None


def _install_error_handlers(app) -> None:
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    async def validation_error(request, error: RequestValidationError) -> JSONResponse:
        errors = list(error.errors())
        message = _validation_message(errors)
        return JSONResponse(
            status_code=422,
            content={
                "error": message,
                "detail": [
                    {key: entry[key] for key in ("type", "loc", "msg") if key in entry}
                    for entry in errors
                ],
            },
        )

    async def http_error(request, error: StarletteHTTPException) -> JSONResponse:
        message = str(error.detail)
        if error.status_code == 400 and "parsing the body" in message:
            # FastAPI's answer when the bytes are not text at all (not UTF-8).
            message = (
                "body could not be read as JSON text (is it UTF-8?); send UTF-8 encoded "
                '{"texts": ["document", ...]}'
            )
        elif error.status_code == 413:
            message = f"request body too large: {message}; send fewer or shorter texts per request"
        return JSONResponse(
            status_code=error.status_code,
            content={"error": message, "detail": error.detail},
            headers=getattr(error, "headers", None),
        )

    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_middleware(JsonBodies)


def check_port_free(host: str, port: int) -> None:
    """A one-line error now, rather than a traceback from inside the server later."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ConfigError(
                f"cannot listen on {host}:{port} ({error.strerror}); pass another --port"
            ) from error


def accelerator_of(device: str) -> str:
    """Our ``--device`` spelling → LitServe's accelerator, checked against this machine."""
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: use auto, cpu or cuda")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu")
    return device


def token_cap(model_max_tokens: int | None, max_tokens: int) -> int:
    """Tokens read per text: ``--max_tokens``, or the model's own limit when that is smaller."""
    return min(model_max_tokens, max_tokens) if model_max_tokens else max_tokens


def _tie_forks_to_this_process() -> None:
    """Every process this one forks from now on (LitServe's HTTP servers and its queue
    manager) ends with it, and leaves the stop signals to the server process."""
    server = forker = os.getpid()

    def before() -> None:
        nonlocal forker
        forker = os.getpid()
        # Held until the child has its own dispositions: caught in between by the handler it
        # inherits, a SIGTERM from LitServe stopping it at once would be lost.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def in_parent() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def in_child() -> None:
        if forker == server:  # not a process forked by one of the server's children
            end_with_parent(server)
            # LitServe stops its forks with SIGTERM; the server's own handlers would swallow
            # it. Ctrl+C reaches the whole group, and the server stops its children itself.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    os.register_at_fork(before=before, after_in_parent=in_parent, after_in_child=in_child)


def _stop_on_signals(server: litserve.LitServer) -> threading.Event:
    """SIGTERM and SIGINT start LitServe's own shutdown, the one its ``/shutdown`` endpoint
    starts: the HTTP servers finish the requests in flight, then the workers are ended.

    Python's default for SIGTERM ends the process at once, skipping that shutdown, and the
    processes LitServe started kept serving on the port, orphaned. Returns the event set
    once a stop is asked for.
    """
    stopping = threading.Event()

    def relay() -> None:
        # LitServe waits on a multiprocessing-manager event; setting it from the signal
        # handler would reuse the connection the main thread is blocked on, so a thread does.
        stopping.wait()
        if server._shutdown_event is None:
            return
        logger.warning("stopping: answering the requests in flight, then ending the workers")
        try:
            server._shutdown_event.set()
        except (OSError, EOFError):
            pass  # the manager is gone too (see _run_until_stopped); LitServe stops all the same

    def handle(signum: int, frame: Any) -> None:
        if stopping.is_set():
            return  # already stopping; a second signal must not cut the shutdown short
        stopping.set()
        if server._shutdown_event is None:
            raise KeyboardInterrupt  # nothing serves yet; _end_children ends what started

    threading.Thread(target=relay, daemon=True, name="docclass-stop-on-signal").start()
    for signum in STOP_SIGNALS:
        signal.signal(signum, handle)
    return stopping


def _end_children(grace: float = CHILD_GRACE_S) -> None:
    """End every process still running that this one started: SIGTERM, ``grace`` seconds,
    then SIGKILL. LitServe ends its own on shutdown; this covers a stop during start-up."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    deadline = time.monotonic() + grace
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join()


def _served_model(classifier) -> dict[str, Any]:
    """What a worker must agree on with ``/info``: the weights, labels and temperature."""
    from docclass.inference.model_facts import fitted_temperature

    return {
        "weights": classifier.trained.fingerprint,
        "labels": list(classifier.labels),
        "temperature": fitted_temperature(classifier.calibration),
    }


def _read_model(ckpt: str) -> tuple[str, dict[str, Any]]:
    """The model's local path and what ``/info`` says of it; one line if it cannot be read.

    Read here, before worker processes start and each trip over the same file; a hub id is
    downloaded once, here, and the workers read the local copy.
    """
    from docclass.artifacts.folder import read_folder_config
    from docclass.artifacts.load import load_classifier, read_artifact
    from docclass.artifacts.locate import resolve_model
    from docclass.inference.model_facts import (
        fitted_temperature,
        model_calibration,
        model_default_method,
    )

    local = resolve_model(ckpt)
    artifact = read_artifact(local)
    folder_config = read_folder_config(local) if local.is_dir() else {}
    # Loaded once: a model folder's weights are fingerprinted as a checkpoint's are.
    fingerprint = functools.cache(lambda: load_classifier(local).fingerprint)
    default = model_default_method(local, folder_config, fingerprint)
    calibration = model_calibration(local, folder_config, fingerprint)
    facts = {
        "checkpoint": str(ckpt),
        "labels": list(artifact["label_names"]),
        "max_tokens": artifact.get("max_tokens"),
        "max_texts_per_request": MAX_TEXTS_PER_REQUEST,
        "default_method": default.method,
        "default_method_reason": default.reason,
        # What /predict divides the logits by unless a request asks for the raw softmax (null
        # when it gives the raw softmax anyway), and why none was fitted where one was tried.
        "temperature": fitted_temperature(calibration),
        "calibration": (calibration or {}).get("fit", "none for these weights"),
        # Which weights the workers serve: each checks that it loaded these.
        "weights": fingerprint(),
    }
    return str(local), facts


def _check_options(port: int, batch_timeout: float, timeout: float) -> None:
    """One line for an impossible option, before anything is read or started."""
    if not 1024 <= port <= 65535:
        raise ConfigError(f"--port {port}: use a port from 1024 to 65535")
    if batch_timeout >= timeout:
        raise ConfigError("--batch_timeout must be shorter than --timeout")


def _check_listen(host: str, port: int) -> None:
    """One line for a busy port; a warning when the server is open to the network."""
    check_port_free(host, port)
    if not is_loopback(host):
        logger.warning(
            "serving on %s: reachable from other machines; there is no authentication", host
        )


def _run_until_stopped(server: litserve.LitServer, host: str, port: int, log_level: str) -> None:
    """Serve until SIGTERM or SIGINT; then answer the requests in flight and end every
    process started here."""
    _freeze_loaded_objects()  # the HTTP server processes are forked from here
    _tie_forks_to_this_process()
    stopping = _stop_on_signals(server)
    try:
        server.run(host=host, port=port, log_level=log_level, generate_client_file=False)
    except KeyboardInterrupt:
        pass  # a stop asked for during start-up, before LitServe's own shutdown could take it
    except EOFError:
        # LitServe's queue manager went away under it: a SIGTERM sent to the whole process
        # group (systemd's default KillMode) ends the manager as well. LitServe's shutdown
        # has run by now; anything else is a real fault.
        if not stopping.is_set():
            raise
    finally:
        _end_children()


def serve(
    ckpt: str,
    host: Host = "127.0.0.1",
    port: int = 8000,
    device: str = "auto",
    workers: PositiveInt = 1,
    batch_size: PositiveInt = 64,
    max_batch_size: PositiveInt = 16,
    batch_timeout: NonNegativeFloat = 0.005,
    max_body_mb: PositiveFloat = 8.0,
    max_tokens: PositiveInt = DEFAULT_MAX_TOKENS,
    timeout: PositiveFloat = 60.0,
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info",
) -> None:
    """Serve a trained model over HTTP: POST /predict, GET /health, GET /info.

    Args:
        ckpt: checkpoint written by 'docclass fit', a folder written by 'docclass export', or
            hub:owner/name@<commit> (a folder on the hub, pinned).
        host: interface to listen on (127.0.0.1: this machine only; 0.0.0.0 or :: open the
            server to the network, without authentication).
        port: 1024 to 65535.
        device: auto (CUDA if available), cpu, cuda.
        workers: model worker processes per device.
        batch_size: documents per forward pass.
        max_batch_size: requests gathered into one model call (1 turns request batching off).
        batch_timeout: seconds to wait for more requests before a model call.
        max_body_mb: larger request bodies get 413.
        max_tokens: most tokens read per text; the rest is cut and the result says
            truncated: true. The model's own limit wins when smaller.
        timeout: seconds a request may wait (then 504), and at a stop, for those in flight.
        log_level: the server's log level.
    """
    _check_options(port, batch_timeout, timeout)
    local, facts = _read_model(ckpt)
    facts["max_tokens"] = token_cap(facts["max_tokens"], max_tokens)
    accelerator = accelerator_of(device)
    _check_listen(host, port)
    server = litserve.LitServer(
        ClassifierAPI(
            local,
            batch_size,
            max_batch_size,
            batch_timeout,
            facts["max_tokens"],
            described={key: facts[key] for key in ("weights", "labels", "temperature")},
        ),  # fmt: skip
        accelerator=accelerator,
        devices="auto" if accelerator != "cpu" else 1,
        workers_per_device=workers,
        timeout=timeout,
        max_payload_size=int(max_body_mb * 1024 * 1024),
        model_metadata=facts,
        # No Swagger page: it loaded unpinned scripts from a CDN into this server's origin,
        # whose requests the web-page refusal must let through.
        disable_openapi_url=True,
    )
    # At a stop, every request in flight gets as long as any request may take (LitServe's
    # default is 30 s), so each ends with its answer or its 504, never a dropped connection.
    server.uvicorn_graceful_timeout = timeout
    _install_error_handlers(server.app)
    server.app.add_middleware(RefuseWebPages, loopback=is_loopback(host))
    _run_until_stopped(server, host, port, log_level)
