"""Whole-document fine-tuning speed on a GPU: docclass's MiniLM (documents cut into encoder
windows, one attention pool over every window) against ``transformers``'
BertForSequenceClassification on the same window rows, eager and under ``torch.compile``.

BERT reads at most 512 positions, so "the same batches" are the rows docclass's blocks see: each
training batch's documents cut into windows of ``model.window_tokens`` (``window_layout``), one
row per window, every row labelled with its document's label and classified from its own [CLS]
state, which is what a user without docclass would fine-tune on chunks. Both sides run the same
real tokens through the same six blocks with the same dropout; docclass adds its attention pool,
BERT its pooler. BERT pads each batch's rows to the longest, so its counted FLOPs include its
padding: ``flops_per_real_token`` says how much.

Each side's FLOPs are counted by ``torch.utils.flop_counter`` on every timed batch once (eager),
so MFU is counted FLOPs over seconds over the chip's dense bf16 peak. Rounds alternate the
sides' order; the figure kept is each side's median.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.encoder_speed import bert_like, bert_training_step
from benchmarks.throughput import _train_steps, load_config_datamodule
from benchmarks.training_flops import CPU_ATTENTION_FLOPS, PEAK_BF16_TFLOPS
from docclass.nn.windows import window_layout
from docclass.train.lit_module import DocClassifierModule

Step = Callable[[dict[str, torch.Tensor]], torch.Tensor]
REFERENCE = "transformers BertForSequenceClassification"


def window_rows(batch: dict[str, torch.Tensor], window: int, overlap: int = 0) -> dict:
    """A batch of whole documents as BERT-sized rows: every window of every document a row
    (the same cut docclass's blocks see), each labelled with its document's label.

    Overlapping windows are refused: BERT would read (and be credited for) the shared tokens
    twice, and the two sides would no longer run the same real tokens."""
    if overlap:
        raise ValueError(
            f"window overlap {overlap}: the comparison needs windows that share no tokens"
        )
    mask = batch["attention_mask"].bool()
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    if mask.shape[1] <= window:
        return {"input_ids": batch["input_ids"], "attention_mask": mask,
                "labels": batch["labels"]}  # fmt: skip
    layout = window_layout(mask, positions, window, overlap)
    document_of_row = torch.zeros(layout.rows, dtype=torch.long)
    document_of_row[layout.row] = layout.document
    return {
        "input_ids": layout.to_rows(batch["input_ids"]),
        "attention_mask": layout.row_mask,
        "labels": batch["labels"][document_of_row],
    }


def _counted_flops(step: Step, batches: list[dict], device: torch.device, bf16: bool) -> int:
    """Forward and backward FLOPs of one pass over ``batches`` (no optimiser: its elementwise
    work is not counted as model FLOPs)."""
    counter = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    with counter:
        for batch in batches:
            with autocast:
                loss = step(batch)
            loss.backward()
    return counter.get_total_flops()


def _sides(config_path: str | Path, device: torch.device, batch_tokens: int, cycle: int) -> tuple:
    """Both models on ``device`` from the same MiniLM weights, and each side's first ``cycle``
    batches."""
    datamodule, model_section = load_config_datamodule(config_path)
    if batch_tokens:
        datamodule.max_batch_tokens = batch_tokens
    torch.manual_seed(0)
    ours = DocClassifierModule(
        **model_section, num_classes=datamodule.num_classes, vocab_size=datamodule.vocab_size
    ).to(device)
    window = ours.model.config.window_tokens
    if not window:
        raise ValueError(f"{config_path}: reads no encoder windows (model.window_tokens)")
    theirs = bert_like(ours, model_section["encoder"], datamodule.num_classes).to(device)
    documents = list(itertools.islice(datamodule.train_dataloader(), cycle))
    rows = [window_rows(b, window, ours.model.config.window_overlap) for b in documents]
    return datamodule, ours, theirs, documents, rows


def gpu_encoder_speed(
    config_path: str | Path = "configs/minilm.yaml",
    steps: int = 20,
    rounds: int = 3,
    device: str = "cuda",
    precision: str = "bf16-mixed",
    compile_models: bool = True,
    batch_tokens: int = 0,
    distinct_batches: int = 0,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Training real tokens/s, counted TFLOP/s and MFU of both sides, eager (and compiled), on
    the first ``steps`` training batches of the config (``batch_tokens`` 0: its own budget).

    ``distinct_batches`` n > 0 cycles the first n batches instead: with n = 1 every step has
    the same shapes, so ``torch.compile`` traces each side's graphs once rather than again for
    every shape (docclass's graph breaks and length groups still make several graphs). ``progress``
    gets the figures after each mode (a run stopped during compiling keeps the eager ones)."""
    target = torch.device(device)
    bf16 = precision == "bf16-mixed"
    cycle = min(distinct_batches or steps, steps)
    datamodule, ours, theirs, documents, rows = _sides(config_path, target, batch_tokens, cycle)
    smoothing = ours.hparams.label_smoothing
    documents = cycled([{k: v.to(target) for k, v in b.items()} for b in documents], steps)
    rows = cycled([{k: v.to(target) for k, v in b.items()} for b in rows], steps)

    def our_step(batch):
        return ours._shared_step(batch)[0]

    their_step = bert_training_step(theirs, smoothing)

    ours.train()
    theirs.train()
    sides = {"docclass": (our_step, ours, documents), REFERENCE: (their_step, theirs, rows)}
    flops = {name: _counted_flops(step, batches, target, bf16)
             for name, (step, _, batches) in sides.items()}  # fmt: skip
    for _, model, _ in sides.values():
        model.zero_grad(set_to_none=True)
    figures = _what_was_run(config_path, target, precision, rounds, datamodule, sides, flops)
    figures["distinct_batches"] = cycle
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in figures["device"]), None)
    modes = ["eager", "compiled"] if compile_models else ["eager"]
    for mode in modes:
        if mode == "compiled":
            ours.model.compile()
            theirs.compile()
        # Batches differ in shape: marked dynamic after the first recompile, and a limit high
        # enough that no side falls back to eager unseen (for this call only).
        with torch._dynamo.config.patch(cache_size_limit=64):
            figures[mode] = _rounds(sides, target, precision, rounds, flops, peak)
        if progress is not None:
            progress(figures)
    if compile_models:
        torch._dynamo.reset()  # another call's modules start from no compiled graphs
        figures["compiled_over_eager"] = {
            name: round(figures["compiled"]["real_tokens_per_s"][name]
                        / figures["eager"]["real_tokens_per_s"][name], 3)
            for name in sides
        }  # fmt: skip
    return figures


def _what_was_run(config_path, device, precision, rounds, datamodule, sides, flops) -> dict:
    """The run's heading: machine, batches, tokens, and each side's FLOPs for one pass."""
    documents = sides["docclass"][2]
    rows = sides[REFERENCE][2]
    return {
        "config": str(config_path),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "precision": precision,
        "steps_per_round": len(documents),
        "rounds": rounds,
        "max_batch_tokens": datamodule.max_batch_tokens,
        "documents": sum(len(b["labels"]) for b in documents),
        "window_rows": sum(len(b["labels"]) for b in rows),
        "real_tokens": sum(int(b["attention_mask"].sum()) for b in documents),
        # BERT's rows are padded to each batch's longest (as its collators pad); docclass runs
        # its rows in groups of similar length.
        "bert_row_slots_per_real_token": round(
            sum(b["input_ids"].numel() for b in rows)
            / sum(int(b["attention_mask"].sum()) for b in rows),
            3,
        ),
        "counted_tflops_per_pass": {n: round(f / 1e12, 4) for n, f in flops.items()},
        # BERT's count includes its padding slots: per real token it is the larger.
        "flops_per_real_token": {
            n: round(f / sum(int(b["attention_mask"].sum()) for b in sides[n][2]))
            for n, f in flops.items()
        },
    }


def _rounds(sides: dict, device: torch.device, precision: str, rounds: int, flops: dict,
            peak: float | None) -> dict[str, Any]:  # fmt: skip
    """One untimed pass per side, then ``rounds`` timed passes alternating which side goes
    first, so drift in the machine's speed hits both alike."""
    warm: dict[str, float] = {}
    for name, (step, model, batches) in sides.items():
        # One pass first: kernels chosen, memory pooled, and under compile every shape traced.
        run = _train_steps(step, list(model.parameters()), batches, device, precision)
        warm[name] = run["seconds"]
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    real: dict[str, int] = {}
    for index in range(rounds):
        order = list(sides.items())[:: 1 if index % 2 == 0 else -1]
        for name, (step, model, batches) in order:
            run = _train_steps(step, list(model.parameters()), batches, device, precision)
            seconds[name].append(run["seconds"])
            real[name] = run["real_tokens"]
    return {"first_pass_s": {n: round(s, 2) for n, s in warm.items()},
            **mode_figures(seconds, real, flops, peak)}  # fmt: skip


def cycled(batches: list, steps: int) -> list:
    """``steps`` batches taken from ``batches`` in turn."""
    return [batches[i % len(batches)] for i in range(steps)]


def mode_figures(
    seconds: dict[str, list[float]], real: dict[str, int], flops: dict[str, int],
    peak: float | None,
) -> dict[str, Any]:  # fmt: skip
    """Each side's median over its rounds → real tokens/s, counted TFLOP/s, MFU against
    ``peak`` TFLOP/s, and docclass's speed as a multiple of BERT's on the same real tokens."""
    if real["docclass"] != real[REFERENCE]:
        raise ValueError(f"the sides ran different real tokens: {real}")
    median = {name: statistics.median(times) for name, times in seconds.items()}
    tflops = {name: flops[name] / median[name] / 1e12 for name in seconds}
    return {
        "seconds_per_round": {n: [round(s, 4) for s in v] for n, v in seconds.items()},
        "real_tokens_per_s": {name: round(real[name] / median[name]) for name in seconds},
        "tflops_per_s": {name: round(value, 2) for name, value in tflops.items()},
        "mfu_vs_dense_bf16_peak": (
            {name: round(value / peak, 4) for name, value in tflops.items()} if peak else None
        ),
        "docclass_over_transformers": round(median[REFERENCE] / median["docclass"], 3),
    }
