"""Files small (about 400 lines at most), and none kept under that by `# fmt: skip`:
each file that uses it must still fit once the formatter lays it out (issue 50)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.harness import ROOT

MOST_LINES = 400
SKIP = "  # fmt: skip"


def _sources() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return out.split()


def test_no_source_file_is_over_400_lines() -> None:
    long = {
        f: n for f in _sources() if (n := len((ROOT / f).read_text().splitlines())) > MOST_LINES
    }
    assert not long, f"split these by what they hold: {long}"


def test_no_file_fits_only_because_the_formatter_was_told_to_skip() -> None:
    fitted = {}
    for f in _sources():
        text = (ROOT / f).read_text()
        if SKIP not in text:
            continue
        laid_out = subprocess.run(
            [sys.executable, "-m", "ruff", "format", "--stdin-filename", f, "-"],
            input=text.replace(SKIP, ""),
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        if (n := len(laid_out.splitlines())) > MOST_LINES:
            fitted[f] = n
    assert not fitted, f"over {MOST_LINES} lines without `# fmt: skip`: {fitted}"
