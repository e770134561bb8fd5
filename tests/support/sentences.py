"""How long the docs' sentences are: the mean and the 90th percentile of words per
sentence, page by page.

``python -m tests.support.sentences`` prints the table for the pages of the user's
site (mkdocs.yml's nav) and the README; ``--ref REV`` measures them as they were at
a git revision, beside today's. tests/project/test_plain_sentences.py holds every
user-facing page's mean under :data:`MEAN_LIMIT`.

What counts is the prose a reader reads: code blocks, tables, headings, HTML
comments and mkdocstrings' ``:::`` directives are left out (a table's cells are
compared, not read as sentences). A paragraph and a list item each end a sentence;
inside them a sentence ends at ``.``, ``!`` or ``?`` before a space, except after
the abbreviations in :data:`ABBREVIATIONS`. Inline code counts as one word, a
link as its text.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MEAN_LIMIT = 20
"""The mean words per sentence every user-facing page stays under (issue 33)."""
ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")

_FENCE = re.compile(r"^(\s*)(```|~~~).*?^\1\2[ \t]*$", re.DOTALL | re.MULTILINE)
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.MULTILINE)
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_CODE = re.compile(r"`[^`]+`")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")
_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")
_WORD = re.compile(r"[\w\d]")


@dataclass(frozen=True)
class Measure:
    """One page's sentences: how many, their mean length and 90th percentile."""

    page: str
    sentences: int
    mean: float
    p90: int

    @classmethod
    def of(cls, page: str, text: str) -> Measure:
        lengths = sorted(len(sentence.split()) for sentence in sentences(text))
        if not lengths:
            return cls(page, 0, 0.0, 0)
        # The nearest-rank percentile: a length some sentence of the page has.
        p90 = lengths[max(math.ceil(0.9 * len(lengths)) - 1, 0)]
        return cls(page, len(lengths), sum(lengths) / len(lengths), p90)


def sentences(markdown: str) -> Iterator[str]:
    """The prose sentences of a Markdown page, each as plain words."""
    text = _COMMENT.sub("", _FENCE.sub("\n", _without_front_matter(markdown)))
    for block in _blocks(text.splitlines()):
        plain = _CODE.sub("code", _LINK.sub(r"\1", block))
        plain = re.sub(r"[*_]{1,2}(?=\w)|(?<=\w)[*_]{1,2}", "", plain)
        for abbreviation in ABBREVIATIONS:
            plain = plain.replace(abbreviation, abbreviation.replace(".", ""))
        for sentence in _END.split(plain):
            if _WORD.search(sentence):
                yield sentence.strip()


def _without_front_matter(markdown: str) -> str:
    if markdown.startswith("---\n"):
        _, _, rest = markdown[4:].partition("\n---\n")
        return rest
    return markdown


def _blocks(lines: Iterable[str]) -> Iterator[str]:
    """Paragraphs and list items, joined into one line each."""
    block: list[str] = []
    for line in lines:
        stripped = line.strip()
        skipped = stripped.startswith(("#", "|", ":::", "!!!", "???", "--8<--", "<", "[^"))
        if not stripped or skipped or _ITEM.match(line):
            if block:
                yield " ".join(block)
            block = []
            if _ITEM.match(line):
                block.append(_ITEM.sub("", line).strip())
            continue
        block.append(stripped)
    if block:
        yield " ".join(block)


def user_pages() -> list[Path]:
    """The README and every page of the user's site, in the nav's order."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return [ROOT / "README.md", *(ROOT / "docs" / page for page in _nav_pages(config["nav"]))]


def _nav_pages(nav: object) -> Iterator[str]:
    if isinstance(nav, str):
        if nav.endswith(".md"):
            yield nav
    elif isinstance(nav, list):
        for entry in nav:
            yield from _nav_pages(entry)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_pages(value)


def page_text(path: Path, read: Callable[[Path], str] | None = None) -> str:
    """A page's Markdown with its snippets (``--8<-- "CHANGELOG.md"``) included."""
    reader = read or (lambda p: p.read_text())

    def included(match: re.Match[str]) -> str:
        name, _, section = match.group(1).partition(":")
        text = reader(ROOT / name)
        if section:
            start, end = f"--8<-- [start:{section}]", f"--8<-- [end:{section}]"
            text = text.split(start, 1)[1].split(end, 1)[0]
        return text

    return _SNIPPET.sub(included, reader(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.sentences")
    parser.add_argument("--ref", help="also measure the pages as they were at this git revision")
    parser.add_argument("pages", nargs="*", type=Path, help="default: the user's site and README")
    args = parser.parse_args(argv)
    pages = [page.resolve() for page in args.pages] or user_pages()
    print(_table(pages, args.ref))
    over = [p for p in pages if Measure.of(_name(p), page_text(p)).mean >= MEAN_LIMIT]
    return 1 if over else 0


def _table(pages: list[Path], ref: str | None) -> str:
    head = "| page | sentences | mean | p90 |"
    rule = "|---|---:|---:|---:|"
    if ref:
        head = f"| page | mean at {ref} | p90 at {ref} | sentences | mean | p90 |"
        rule = "|---|---:|---:|---:|---:|---:|"
    rows = [head, rule]
    for path in pages:
        now = Measure.of(_name(path), page_text(path))
        cells = [f"`{now.page}`"]
        if ref:
            before = _at(ref, path)
            cells += [f"{before.mean:.1f}", str(before.p90)] if before else ["(new)", ""]
        cells += [str(now.sentences), f"{now.mean:.1f}", str(now.p90)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _at(ref: str, path: Path) -> Measure | None:
    """The page as it was at ``ref``, found by its name then or by git's rename."""

    def read(p: Path) -> str:
        shown = subprocess.run(
            ["git", "show", f"{ref}:{p.relative_to(ROOT)}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if shown.returncode:
            raise FileNotFoundError(p)
        return shown.stdout

    # A page rewritten as it moved is past git's rename detection: its old
    # name in docs/ is tried too (docs/guides/jobs.md was docs/jobs.md).
    candidates = (path, *_renamed_from(ref, path), ROOT / "docs" / path.name)
    for candidate in candidates:
        try:
            return Measure.of(_name(path), page_text(candidate, read))
        except FileNotFoundError:
            continue
    return None


def _renamed_from(ref: str, path: Path) -> list[Path]:
    """Where git says ``path`` was at ``ref``, if it moved since."""
    diff = subprocess.run(
        ["git", "diff", "--name-status", "-M20%", ref, "--", "docs", "README.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    relative = str(path.relative_to(ROOT))
    return [
        ROOT / fields[1]
        for line in diff.splitlines()
        if (fields := line.split("\t"))[0].startswith("R") and fields[2] == relative
    ]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT / "docs")) if path.is_relative_to(ROOT / "docs") else path.name


if __name__ == "__main__":
    sys.exit(main())
