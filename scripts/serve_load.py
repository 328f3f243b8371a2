"""Bounded load test of `docclass serve` on loopback: `make serve-load`.

Clients run in this process (threads with keep-alive connections) on the same machine as the
server, so on 2 cores they compete with it for CPU: the figures are a floor, not a ceiling.
"""

import argparse
import json
from pathlib import Path

import datasets

from benchmarks.measures import serve_load
from docclass.data.sources import SourceSpec, load_source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=100, help="requests per client")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per setting")
    parser.add_argument("--out", default="reports/serve-load.json")
    args = parser.parse_args()
    datasets.disable_progress_bars()
    texts = load_source(SourceSpec("bbc")).splits["train"]["text"]
    figures = serve_load(
        args.ckpt,
        texts,
        clients=args.clients,
        requests_per_client=args.requests,
        rounds=args.rounds,
        # The default (request batching) against none, and against the garbage collector left
        # to walk everything torch loaded, side by side in one run.
        server_settings={
            "default (--max_batch_size 16, 5 ms wait)": {},
            "no request batching (--max_batch_size 1)": {"args": ["--max_batch_size", "1"]},
            "default without gc.freeze (DOCCLASS_SERVE_GC_FREEZE=0)": {
                "env": {"DOCCLASS_SERVE_GC_FREEZE": "0"}
            },
        },
    )
    Path(args.out).write_text(json.dumps(figures, indent=2))
    for run in figures["runs"]:
        latency = run["latency_ms"]
        print(
            f"{run['setting']}: {run['requests']} requests, {run['errors']} errors; median of "
            f"{figures['rounds']} rounds: "
            f"{run['requests_per_s']} req/s, p50 {latency['p50']} ms, p95 {latency['p95']} ms, "
            f"p99 {latency['p99']} ms"
        )
    default, unbatched, unfrozen = figures["runs"]
    print(
        f"throughput vs default: no request batching "
        f"{unbatched['requests_per_s'] / default['requests_per_s']:.2f}×, without gc.freeze "
        f"{unfrozen['requests_per_s'] / default['requests_per_s']:.2f}×"
    )


if __name__ == "__main__":
    main()
