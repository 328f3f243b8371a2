"""docs/reliability.md is generated from the ``fault`` marks on the tests, so it cannot drift.

Regenerate after adding or changing a mark:
    DOCCLASS_WRITE_RELIABILITY=1 .venv/bin/python -m pytest tests/test_reliability_doc.py
"""

import importlib.util
import os
from pathlib import Path

from helpers import REPO

DOC = REPO / "docs" / "reliability.md"
HEADER = """# What docclass was made to survive

Every fault and bad input the test suite tries, and what it gets. Generated from the
`@pytest.mark.fault(what, outcome)` marks on the tests (`tests/test_reliability_doc.py` fails
when this file and the marks disagree); each row names the test that checks it, and `make test`
runs them all.

| fault or input | what it gets | checked by |
| --- | --- | --- |
"""


def fault_rows() -> list[tuple[str, str, str]]:
    rows = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        # By file: the test folders mirror the package and are not packages themselves.
        spec = importlib.util.spec_from_file_location(f"_faults_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, function in vars(module).items():
            if not name.startswith("test_") or not callable(function):
                continue
            for mark in getattr(function, "pytestmark", []):
                if mark.name == "fault":
                    what, outcome = mark.args
                    rows.append((what, outcome, f"`{path.relative_to(REPO)}::{name}`"))
    return rows


def render() -> str:
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines = [f"| {cell(w)} | {cell(o)} | {t} |" for w, o, t in fault_rows()]
    return HEADER + "\n".join(lines) + "\n"


def test_reliability_doc_lists_every_fault_the_tests_try():
    rows = fault_rows()
    assert len(rows) >= 25  # the marks are found at all
    if os.environ.get("DOCCLASS_WRITE_RELIABILITY") == "1":
        DOC.parent.mkdir(exist_ok=True)
        DOC.write_text(render(), encoding="utf-8")
    assert Path(DOC).read_text(encoding="utf-8") == render(), (
        "docs/reliability.md is out of date: DOCCLASS_WRITE_RELIABILITY=1 "
        ".venv/bin/python -m pytest tests/test_reliability_doc.py"
    )
