"""How many batches each DDP rank steps through per epoch under a token budget, against the
batches one process cuts: `python -m scripts.ddp_batches`. No training: the sampler alone, on
BBC-like lengths under MiniLM (log-normal around 480 tokens, 1,700 documents)."""

import argparse
import json
import math
from pathlib import Path

import torch

from docclass.data.samplers import BucketBatchSampler, EpochShuffleSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=1700)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--max_batch_tokens", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--out", default="reports/ddp-batches.json")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    lengths = (torch.randn(args.documents, generator=generator) * 0.6 + math.log(480)).exp()
    lengths = lengths.clamp(20, 2048).long().tolist()
    figures = {
        "documents": args.documents,
        "batch_size": args.batch_size,
        "max_batch_tokens": args.max_batch_tokens,
        "epochs": args.epochs,
        "ranks": {},
    }
    for world_size in (1, 2, 4):
        ranks = [
            BucketBatchSampler(
                EpochShuffleSampler(args.documents), args.batch_size, False, lengths,
                max_batch_tokens=args.max_batch_tokens, rank=rank, world_size=world_size,
            )
            for rank in range(world_size)
        ]  # fmt: skip
        cut = []
        for epoch in range(args.epochs):
            ranks[0].sampler.set_epoch(epoch)
            cut.append(len(ranks[0]._batches(list(ranks[0].sampler))))
        per_rank = len(ranks[0])
        figures["ranks"][world_size] = {
            "batches_per_rank": per_rank,
            "single_process_cut": [min(cut), max(cut)],
            "documents_per_batch": round(args.documents / (per_rank * world_size), 2),
        }
        print(f"{world_size} rank(s): {per_rank} batches each; one process cuts "
              f"{min(cut)}-{max(cut)} an epoch")  # fmt: skip
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
