"""Training speed in FLOPs: a config's model for a number of optimiser steps, its real tokens/s,
the FLOPs of those steps (counted by ``torch.utils.flop_counter`` on one step and scaled by
padded tokens) and, on a GPU whose dense bf16 peak is known, the model FLOPs utilisation (MFU);
and ``predict()`` documents/s on the same device."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from benchmarks.throughput import _train_steps, interleaved_seconds
from docclass.train.datamodule import DocDataModule
from docclass.train.lit_module import DocClassifierModule

# torch counts its GPU attention kernels but not the CPU one (2.13), so a CPU run left out every
# block's attention: a third of the tiny config's FLOPs. These count it as torch counts the GPU's.
_aten = torch.ops.aten
CPU_ATTENTION_FLOPS = {
    _aten._scaled_dot_product_flash_attention_for_cpu: (
        lambda query, key, value, *_, **__: sdpa_flop_count(query, key, value)
    ),
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: (
        lambda grad, query, key, value, *_, **__: sdpa_backward_flop_count(grad, query, key, value)
    ),
}

# Dense bf16 tensor-core peaks, TFLOP/s, from NVIDIA's data sheets (without sparsity); the
# H200 has the H100's tensor cores.
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0}


def training_flops(
    datamodule: DocDataModule,
    model_section: dict[str, Any],
    steps: int = 40,
    batch_size: int = 0,
    device: str = "cuda",
    precision: str = "bf16-mixed",
) -> dict[str, Any]:
    """``steps`` optimiser steps of the prepared data's model (:func:`load_config_datamodule`;
    its own batches, repeated when an epoch has fewer; ``batch_size`` 0 keeps the config's)
    after three warm-up steps."""
    if batch_size:
        datamodule.batch_size = batch_size
    target = torch.device(device)
    torch.manual_seed(0)
    module = DocClassifierModule(
        **model_section, num_classes=datamodule.num_classes, vocab_size=datamodule.vocab_size
    ).to(target)
    module.train()
    epoch = list(datamodule.train_dataloader())
    batches = [epoch[i % len(epoch)] for i in range(steps)]
    parameters = list(module.parameters())

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return module._shared_step(batch)[0]

    _train_steps(step, parameters, batches[:3], target, precision)  # kernels chosen, memory pooled
    counter = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS)
    with counter:
        _train_steps(step, parameters, batches[:1], target, precision)
    # FLOPs grow with padded tokens (attention's with their square: this undercounts a little).
    flops_per_token = counter.get_total_flops() / batches[0]["input_ids"].numel()
    run = _train_steps(step, parameters, batches, target, precision)
    padded = sum(batch["input_ids"].numel() for batch in batches)
    tflops = flops_per_token * padded / run["seconds"] / 1e12
    name = torch.cuda.get_device_name(target) if target.type == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    return {
        "device": name,
        "torch": torch.__version__,
        "precision": precision,
        "steps": steps,
        "batch_size": datamodule.batch_size,
        "seconds": round(run["seconds"], 3),
        "real_tokens_per_s": round(run["real_tokens_per_s"]),
        "padded_tokens_per_s": round(padded / run["seconds"]),
        "flops_per_padded_token": round(flops_per_token),
        "tflops_per_s": round(tflops, 2),
        "mfu_vs_dense_bf16_peak": round(tflops / peak, 4) if peak else None,
        "peak_memory_gib": round(run["peak_mib"] / 1024, 2),
    }


def predict_speed(
    ckpt: str, texts: list[str], device: str = "cuda", rounds: int = 3
) -> dict[str, Any]:
    """``predict()`` documents/s: labels at the default batch and at 256 documents, and with
    every word's class contribution; interleaved rounds, medians."""
    import statistics

    from docclass.inference.classifier import DocClassifier

    classifier = DocClassifier.load(ckpt, device=device)
    classifier.predict(texts[:64])  # warm-up

    def timed(**kwargs: Any):
        def run() -> None:
            classifier.predict(texts, **kwargs)
            if classifier.device.type == "cuda":
                torch.cuda.synchronize()

        return run

    ways = {
        "labels": timed(),
        "labels, batches of 256": timed(batch_size=256),
        "+ class contribution per word": timed(word_scores=True, method="contribution"),
    }
    seconds, _ = interleaved_seconds(ways, rounds)
    figures: dict[str, Any] = {"documents": len(texts)}
    for name, times in seconds.items():
        figures[name] = round(len(texts) / statistics.median(times), 1)
    return figures
