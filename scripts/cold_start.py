"""How long the commands a user waits on take to start, side by side in one run: `make
cold-start`. Each command is a fresh process (nothing imported or cached by an earlier one in
this script), run in turn, ``--repeats`` rounds; the medians are compared with `python -c
"import torch"` on the same machine at the same time, as ratios, because a shared machine's
seconds are noise. Prints the figures and writes them as JSON."""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def seconds(command: list[str], stdin: str | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(command, input=stdin, capture_output=True, text=True, check=True)
    return time.perf_counter() - started


def imports_lightning(module: str) -> bool:
    probe = f"import sys, {module}; print('lightning' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return result.stdout.strip() == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt", default="reports/bbc/checkpoints/last.ckpt")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="reports/cold-start.json")
    args = parser.parse_args()
    docclass = [sys.executable, "-m", "docclass.cli"]
    with tempfile.TemporaryDirectory() as folder:
        one = Path(folder) / "one.txt"
        one.write_text("The striker scored twice as the home side won the cup final.\n")
        commands = {
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
            "docclass --help": [*docclass, "--help"],
            "docclass classify one.txt": [*docclass, "classify", "--ckpt", args.ckpt, str(one)],
            "docclass fit --help (Lightning)": [*docclass, "fit", "--help"],
        }
        rounds: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, command in commands.items():  # interleaved: drift hits every command
                rounds[name].append(seconds(command))
    medians = {name: round(statistics.median(values), 3) for name, values in rounds.items()}
    torch_s = medians["python -c 'import torch'"]
    figures = {
        "repeats": args.repeats,
        "checkpoint": args.ckpt,
        "median_s": medians,
        "ratio_to_import_torch": {name: round(s / torch_s, 2) for name, s in medians.items()},
        "lightning_imported_by": {
            module: imports_lightning(module)
            for module in (
                "docclass.cli",
                "docclass.inference.classify",
                "docclass.inference.serve",
                "docclass.inference.export",
                "docclass.inference.classifier",
            )
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    for name, value in medians.items():
        print(f"{name:34s} {value:6.2f} s   {figures['ratio_to_import_torch'][name]:.2f}× torch")
    print("imports Lightning:", figures["lightning_imported_by"])


if __name__ == "__main__":
    main()
