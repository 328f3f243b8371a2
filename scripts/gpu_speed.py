"""Training speed of a config's model on a CUDA GPU: real tokens/s, FLOPs counted by torch's
FlopCounterMode, and model FLOPs utilisation (MFU) against the GPU's dense bf16 peak.

Example (on a GPU machine):
    python -m scripts.gpu_speed --config configs/bbc.yaml --out reports/gpu-speed-bbc.json
"""

import argparse
import json
import logging
import time
from pathlib import Path

import datasets
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.throughput import load_config_datamodule
from docclass.train.lit_module import DocClassifierModule

# Dense bf16 tensor-core peak of the H100 SXM (NVIDIA's data sheet, without sparsity).
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0}


def predict_speed(ckpt: str, datamodule) -> dict:
    """``predict()`` documents/s on the GPU over the validation + test texts, median of 3."""
    from docclass.inference.classifier import DocClassifier

    texts = [t for split in ("val", "test") for t in datamodule.splits[split]["text"]]
    classifier = DocClassifier.load(ckpt, device="cuda")
    classifier.predict(texts[:64])
    figures = {"documents": len(texts)}
    for name, kwargs in {
        "labels": {},
        "labels, batches of 256": {"batch_size": 256},
        "+ class contribution per word": {"word_scores": True, "method": "contribution"},
    }.items():
        times = []
        for _ in range(3):
            torch.cuda.synchronize()
            started = time.perf_counter()
            classifier.predict(texts, **kwargs)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        figures[name] = round(len(texts) / sorted(times)[1], 1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/bbc.yaml")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch_size", type=int, default=0, help="0: the config's")
    parser.add_argument("--precision", default="bf16-mixed", choices=["32", "bf16-mixed"])
    parser.add_argument("--ckpt", help="also time predict() on the GPU with this model")
    parser.add_argument("--out", default="reports/gpu-speed.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    datasets.disable_progress_bars()
    datamodule, model_section = load_config_datamodule(args.config)
    if args.batch_size:
        datamodule.batch_size = args.batch_size
    device = torch.device("cuda")
    torch.manual_seed(0)
    module = DocClassifierModule(
        **model_section, num_classes=datamodule.num_classes, vocab_size=datamodule.vocab_size
    ).to(device)
    module.train()
    # The epoch's batches, repeated when it has fewer than --steps (large batches).
    epoch = [{k: v.to(device) for k, v in b.items()} for b in datamodule.train_dataloader()]
    batches = [epoch[i % len(epoch)] for i in range(args.steps)]
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision != "32")

    def step(batch):
        with autocast:
            loss = module._shared_step(batch)[0]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for batch in batches[:3]:  # warm-up: kernels chosen, memory pooled
        step(batch)
    counter = FlopCounterMode(display=False)
    with counter:
        step(batches[0])
    flops_first = counter.get_total_flops()
    padded_first = batches[0]["input_ids"].numel()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for batch in batches:
        step(batch)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["input_ids"].numel() for b in batches)
    # FLOPs scale with padded tokens (attention with their square: this slightly undercounts).
    flops = flops_first / padded_first * padded
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    figures = {
        "config": args.config,
        "gpu": name,
        "torch": torch.__version__,
        "precision": args.precision,
        "steps": len(batches),
        "batch_size": datamodule.batch_size,
        "seconds": round(seconds, 3),
        "real_tokens_per_s": round(real / seconds),
        "padded_tokens_per_s": round(padded / seconds),
        "tflops_per_s": round(flops / seconds / 1e12, 2),
        "mfu_vs_dense_bf16_peak": round(flops / seconds / 1e12 / peak, 4) if peak else None,
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
    }
    if args.ckpt:
        figures["predict"] = predict_speed(args.ckpt, datamodule)
    print(json.dumps(figures, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
