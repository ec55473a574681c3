"""The README is a front door, not a diary: at most 150 lines, exactly two set-up-and-run
commands, links that resolve, and a speed table whose every figure is in the raw output it
cites (the measurements' history is docs/benchmarks.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "results"


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_readme_is_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 150


def test_two_commands_set_up_and_run() -> None:
    (block,) = re.findall(r"```\n(.*?)```", _section("Two commands"), re.S)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_every_link_resolves() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8")):
        assert (ROOT / target).exists(), target


def test_every_speed_figure_is_in_the_raw_output_it_cites() -> None:
    rows = [line for line in _section("Speed, against the best plain decoding").splitlines()
            if line.startswith("| ") and not line.startswith(("| drafter", "| ---"))]
    assert rows
    source = None
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        cited = re.findall(r"`([^`]+)`", cells[-1])
        if cited:  # "same run" keeps the one above
            files = sorted(RESULTS.glob(cited[0]))
            assert files, cited[0]
            source = "\n".join(f.read_text(encoding="utf-8") for f in files)
        assert source is not None
        dtype, batch, k, plain, spec, ratio = cells[1:7]
        lines = [ln for ln in source.splitlines()
                 if re.match(rf"{dtype}\s+{batch}\s+", ln)]
        assert any(f" {ratio} " in ln and f"K = {k}" in ln and _shows(ln, spec)
                   for ln in lines), row
        assert any(_shows(ln, plain) for ln in lines), row


def _shows(line: str, figure: str) -> bool:
    """``line`` holds a number that ``figure`` writes rounded (815.4 as 815, 7482.5 as 7483)."""
    return any(abs(float(x) - float(figure)) <= 0.5 for x in re.findall(r"\d+\.\d+", line))
