"""``model.cpu_train_precision`` measured: the two parts of a held-block run's training that it
puts in bf16, each in float32 and under bf16 autocast, on the same batches in one run.

- the held blocks' states (what ``cache_encoder_states`` computes once per training document);
- a training step from those states: the blocks above, the pool and the read-out, forward and
  backward, with the optimiser step.

Rounds alternate the two precisions, so a drift in the machine's speed hits both alike; each
side keeps its median. The training steps also run a third way, bf16 with the attention in bf16
too (how they ran before ``docclass.nn.attention`` kept a bf16 step's attention in float32 on
the CPU), so that choice is measured on the same batches. Also reported: how far the bf16
states are from the float32 ones, and whether this CPU has native bf16 (where ``auto`` chooses
bf16).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from benchmarks.throughput import load_config_datamodule
from docclass.nn import attention
from docclass.train.lit_module import DocClassifierModule, native_cpu_bf16

PRECISIONS = ("float32", "bf16")
BF16_ATTENTION = "bf16, attention in bf16"


def _autocast(precision: str) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "float32")


def _attention_as(precision: str) -> contextlib.AbstractContextManager:
    if precision != BF16_ATTENTION:
        return contextlib.nullcontext()
    return mock.patch.object(attention, "_bfloat16_backward_on_cpu", lambda *tensors: False)


def _held_states(module: DocClassifierModule, batches: list[dict], precision: str) -> tuple:
    blocks = module.hparams.freeze_blocks
    started = time.perf_counter()
    with torch.no_grad(), _autocast(precision):
        states = [
            module.model.lower_block_states(b["input_ids"], b["attention_mask"], blocks).float()
            for b in batches
        ]
    return time.perf_counter() - started, states


def _training_steps(
    module: DocClassifierModule, batches: list[dict], states: list, precision: str
) -> float:
    blocks = module.hparams.freeze_blocks
    trained = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-5)
    started = time.perf_counter()
    for batch, held in zip(batches, states, strict=True):
        with _attention_as(precision):
            with _autocast(precision):
                logits, _ = module.model.classify_from_block(held, batch["attention_mask"], blocks)
            loss = torch.nn.functional.cross_entropy(logits.float(), batch["labels"])
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def cpu_bf16_speed(config_path: str | Path, steps: int, rounds: int) -> dict[str, Any]:
    """Median seconds of each part in each precision over ``rounds``, their ratios, and the
    bf16 states' relative error."""
    datamodule, model_section = load_config_datamodule(config_path)
    if not model_section.get("freeze_blocks"):
        raise ValueError(f"{config_path}: the benchmark needs a config with model.freeze_blocks")
    torch.manual_seed(0)
    module = DocClassifierModule(
        **model_section, num_classes=datamodule.num_classes, vocab_size=datamodule.vocab_size
    ).train()
    module._hold_frozen_in_eval()
    batches = list(datamodule.train_dataloader())[:steps]
    seconds: dict[str, dict[str, list[float]]] = {
        "held_states": {p: [] for p in PRECISIONS},
        "training_steps": {p: [] for p in (*PRECISIONS, BF16_ATTENTION)},
    }
    states = {}
    for round_ in range(rounds):
        for precision in PRECISIONS:
            elapsed, states[precision] = _held_states(module, batches, precision)
            seconds["held_states"][precision].append(elapsed)
            # Both precisions train from the float32 states: the step's own cost is compared.
            ways = (precision, BF16_ATTENTION) if precision == "bf16" else (precision,)
            for way in ways[:: -1 if round_ % 2 else 1]:  # the two bf16 ways take turns first
                steps_s = _training_steps(module, batches, states["float32"], way)
                seconds["training_steps"][way].append(steps_s)
    errors = torch.cat([
        ((bf16 - exact).norm(dim=-1) / exact.norm(dim=-1))[batch["attention_mask"].bool()]
        for exact, bf16, batch in zip(states["float32"], states["bf16"], batches, strict=True)
    ])  # fmt: skip
    medians = {
        part: {way: round(statistics.median(times), 3) for way, times in values.items()}
        for part, values in seconds.items()
    }
    return {
        "config": str(config_path),
        "batches": len(batches),
        "real_tokens": int(sum(int(b["attention_mask"].sum()) for b in batches)),
        "rounds": rounds,
        "threads": torch.get_num_threads(),
        "native_cpu_bf16": native_cpu_bf16(),
        "median_seconds": medians,
        "speedup_bf16": {part: round(m["float32"] / m["bf16"], 2) for part, m in medians.items()},
        "speedup_float32_attention_in_bf16_steps": round(
            medians["training_steps"][BF16_ATTENTION] / medians["training_steps"]["bf16"], 2
        ),
        "bf16_state_relative_error": {
            "median": round(float(errors.median()), 5),
            "max": round(float(errors.max()), 5),
        },
    }
