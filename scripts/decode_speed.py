"""Time and peak memory of reading a large text file that is not valid UTF-8, the way training
reads class folders and `docclass classify` reads `.txt` files (`decode_text`):
`python -m scripts.decode_speed` writes reports/decode-speed.json. Each file is decoded in its
own process, so each peak is its own."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

# Windows-1252 French (read whole as Windows-1252), and UTF-8 Chinese and Greek with three
# pasted Windows-1252 bytes (read as UTF-8, the strays by Windows-1252).
FILES = {
    "windows_1252_french": "('Le café est très bon, l’été à Paris. ' * REPEAT).encode('cp1252')",
    "utf8_with_strays": "('中文文本分类 Καλημέρα κόσμε. ' * REPEAT).encode() + b'\\x93x\\x94'",
}
CHILD = """
import resource, time
from docclass.data.sources import decode_text
raw = {expression}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
text, legacy = decode_text(raw)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(len(raw), round(seconds, 3), round((peak - before) / 1024, 1), legacy)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=150_000, help="copies of the sentence")
    parser.add_argument("--out", default="reports/decode-speed.json")
    args = parser.parse_args()
    runs = []
    for name, expression in FILES.items():
        code = CHILD.format(expression=expression.replace("REPEAT", str(args.repeat)))
        output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        size, seconds, extra_mib, legacy = output.stdout.decode().split()
        runs.append(
            {
                "file": name,
                "bytes": int(size),
                "seconds": float(seconds),
                "peak_rss_added_mib": float(extra_mib),
                "was_legacy": legacy == "True",
            }
        )
        print(f"{name}: {int(size) / 1e6:.1f} MB in {seconds} s, peak RSS +{extra_mib} MiB")
    Path(args.out).write_text(
        json.dumps({"command": "python -m scripts.decode_speed", "runs": runs}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
