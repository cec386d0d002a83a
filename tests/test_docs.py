"""The docs show the current standing, and every link in them resolves.

`docs/benchmarks.md` is the page a user reads for the current numbers: one table per suite
with its command, host and commit, what was tried and lost one line each. It grew into a lab
notebook once (834 lines); earlier runs and their notes belong in git history, so its length
is capped. `docs/results/` holds only the CSVs and plots the current tables link, so it is
capped too, and every file in it must be linked from README.md or a page under docs/: a
result nobody links is a superseded one. A relative link that points nowhere is a broken doc.

Pure Python, no TVM: `make test` (and so `.ci/run`) keeps these limits.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"

# Lines in docs/benchmarks.md: the current table of each suite, not the history of each run.
BENCHMARKS_MAX_LINES = 600
# Files in docs/results/: what the current tables link; older results live in git history.
RESULTS_MAX_FILES = 40

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^\"']*[\"'])?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _results() -> list[Path]:
    return sorted(p for p in RESULTS.iterdir() if not p.name.startswith("."))


def _links(text: str) -> list[str]:
    """Targets of the markdown links in `text`, code blocks and code spans left out."""
    prose = _CODE_SPAN.sub("", _FENCE.sub("", text))
    return _LINK.findall(prose) + _REFERENCE.findall(prose)


def test_benchmarks_md_short():
    lines = (DOCS / "benchmarks.md").read_text().count("\n")
    assert lines <= BENCHMARKS_MAX_LINES, (
        f"docs/benchmarks.md has {lines} lines (at most {BENCHMARKS_MAX_LINES}): keep one "
        "current table per suite, move superseded runs and narrative to git history"
    )


def test_results_few():
    files = _results()
    assert len(files) <= RESULTS_MAX_FILES, (
        f"docs/results/ holds {len(files)} files (at most {RESULTS_MAX_FILES}): keep what the "
        "current tables link, `git rm` the rest"
    )


def test_results_all_linked():
    text = "\n".join(p.read_text() for p in _docs())
    unlinked = [
        p.name
        for p in _results()
        if not re.search(r"(?<![\w.-])(?:docs/)?results/" + re.escape(p.name) + r"(?![\w.-])", text)
    ]
    assert not unlinked, f"docs/results files no doc links (link them or `git rm` them): {unlinked}"


def test_relative_links_resolve():
    broken = []
    for doc in _docs():
        for target in _links(doc.read_text()):
            if _SCHEME.match(target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0].split("?", 1)[0]
            if path and not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    ("text", "links"),
    [
        ("[a](results/x.csv) and ![p](docs/y.png#top)", ["results/x.csv", "docs/y.png#top"]),
        ("`[no](link.md)` then\n```\nf[x](y)\n```\n[yes](z.md)", ["z.md"]),
        ('[t](a.md "title") [u](https://e.org)', ["a.md", "https://e.org"]),
    ],
)
def test_link_extraction(text, links):
    assert _links(text) == links
