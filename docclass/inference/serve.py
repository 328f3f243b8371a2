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
model call (``--max-batch-size``, ``--batch-timeout``); the texts of a call are then grouped by
length (``docclass.interpret.inputs``), so a short document never waits on padding to a long one.

The body is validated before it reaches the model: malformed JSON and wrong types get 422,
bodies over ``--max-body-mb`` get 413, and more than ``MAX_TEXTS_PER_REQUEST`` texts get 422 —
each with a one-line ``error`` naming the fix.
"""

# No ``from __future__ import annotations`` here: LitServe reads ``decode_request``'s annotation
# at run time to build the endpoint, and a string would make FastAPI expect a query parameter.
import gc
import logging
import os
import signal
import socket
from typing import Any, Literal

import litserve
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from docclass.errors import ConfigError
from docclass.inference.classifier import WordScoreMethod

# A request is classified as a unit: this bounds the work one client can put in one batch.
MAX_TEXTS_PER_REQUEST = 256
MAX_TOP_WORDS = 100
# What LitServe accepts: this machine only, or every IPv4 / IPv6 interface.
Host = Literal["127.0.0.1", "0.0.0.0", "::"]

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


class ClassifierAPI(litserve.LitAPI):
    """Loads the checkpoint in each worker process and answers ``/predict``.

    LitServe starts workers with ``spawn``, so this class lives at module level (it is pickled
    by reference) and carries only the checkpoint path, never the model.
    """

    def __init__(
        self, ckpt: str, batch_size: int = 64, max_batch_size: int = 16, batch_timeout: float = 0.0
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.ckpt = ckpt
        self.batch_size = batch_size

    def setup(self, device: str) -> None:
        from docclass.inference.classifier import DocClassifier

        # Ctrl+C reaches the whole process group; the server stops its workers itself, and a
        # worker interrupted mid-wait would only print a traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.classifier = DocClassifier.load(self.ckpt, device=device)
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
        by_method: dict[str, list[int]] = {}
        for position, request in enumerate(batch):
            by_method.setdefault(request.method or default, []).append(position)
        # One model call per method asked for; options differ per request, so compute the most
        # any request asked for and trim per request below.
        for method, positions in by_method.items():
            group = [batch[p] for p in positions]
            results = self.classifier.predict(
                [text for request in group for text in request.texts],
                batch_size=self.batch_size,
                top_words=max(request.top_words for request in group),
                word_scores=any(request.word_scores for request in group),
                method=method,
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
            declared = [v for k, v in scope["headers"] if k.lower() == b"content-type"]
            if not declared or b"json" not in declared[0].lower():
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


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
    timeout: PositiveFloat = 60.0,
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info",
) -> None:
    """Serve a trained model over HTTP: POST /predict, GET /health, GET /info.

    Args:
        ckpt: checkpoint written by 'docclass fit', a folder written by 'docclass export', or
            its hub id (owner/name[@revision]).
        host: interface to listen on (127.0.0.1: this machine only; 0.0.0.0 or :: open the
            server to the network, without authentication).
        port: 1024 to 65535.
        device: auto (CUDA if available), cpu, cuda.
        workers: model worker processes per device.
        batch_size: documents per forward pass.
        max_batch_size: requests gathered into one model call (1 turns request batching off).
        batch_timeout: seconds to wait for more requests before a model call.
        max_body_mb: larger request bodies get 413.
        timeout: seconds a request may wait (then 504).
        log_level: the server's log level.
    """
    from docclass.data.artifact import read_artifact, read_folder_config, resolve_model
    from docclass.inference.model_facts import model_default_method

    if not 1024 <= port <= 65535:
        raise ConfigError(f"--port {port}: use a port from 1024 to 65535")
    if batch_timeout >= timeout:
        raise ConfigError("--batch_timeout must be shorter than --timeout")
    # Fail here, in one line, before worker processes start and each trip over the same file;
    # a hub id is downloaded once, here, and the workers read the local copy.
    local = resolve_model(ckpt)
    artifact = read_artifact(local)
    default = model_default_method(local, read_folder_config(local) if local.is_dir() else {})
    accelerator = accelerator_of(device)
    check_port_free(host, port)
    if host != "127.0.0.1":
        logger.warning(
            "serving on %s: reachable from other machines; there is no authentication", host
        )
    server = litserve.LitServer(
        ClassifierAPI(str(local), batch_size, max_batch_size, batch_timeout),
        accelerator=accelerator,
        devices="auto" if accelerator != "cpu" else 1,
        workers_per_device=workers,
        timeout=timeout,
        max_payload_size=int(max_body_mb * 1024 * 1024),
        model_metadata={
            "checkpoint": str(ckpt),
            "labels": list(artifact["label_names"]),
            "max_tokens": artifact.get("max_tokens"),
            "max_texts_per_request": MAX_TEXTS_PER_REQUEST,
            "default_method": default.method,
            "default_method_reason": default.reason,
        },
    )
    _install_error_handlers(server.app)
    _freeze_loaded_objects()  # the HTTP server processes are forked from here
    server.run(host=host, port=port, log_level=log_level, generate_client_file=False)
