"""The repository stands on its own, and what it says about its docs is true.

- No file leans on anything outside the clone: no section numbers of the product spec the project started
  from, no folder beside the checkout, no absolute path of one machine. Every rule is written in `docs/`.
- Every pointer into `docs/` (a page, optionally with a `#heading` anchor) names a page and a heading that
  exist, and so does every relative link of a Markdown file.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# Spelled in pieces, so this file does not match itself.
FORBIDDEN = ("SPEC" + " §", ".." + "/shared", "/" + "work/")

DOCS_POINTER = re.compile(r"\bdocs/([A-Za-z0-9_-]+\.md)(?:#([A-Za-z0-9_-]+))?")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def repository_files() -> list[Path]:
    """Tracked files and untracked ones that git does not ignore (not .git, .venv, caches or build outputs)."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted(path for name in listing.split("\0") if name and (path := REPO_ROOT / name).is_file())


def text_files() -> list[tuple[Path, str]]:
    files = []
    for path in repository_files():
        try:
            files.append((path, path.read_text(encoding="utf-8")))
        except UnicodeDecodeError:
            continue  # binary: it names no page
    return files


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors_of(page: Path) -> frozenset[str]:
    anchors: set[str] = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        match = None if in_code else HEADING.match(line)
        if match:
            slug = github_slug(match.group(1))
            suffix = 0
            while (candidate := slug if suffix == 0 else f"{slug}-{suffix}") in anchors:
                suffix += 1
            anchors.add(candidate)
    return frozenset(anchors)


def target_problem(page: Path, anchor: str | None) -> str | None:
    if not page.exists():
        return f"{page.relative_to(REPO_ROOT)} does not exist"
    if anchor and page.suffix == ".md" and page.is_file() and anchor not in anchors_of(page):
        return f"{page.relative_to(REPO_ROOT)} has no heading #{anchor}"
    return None


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def test_github_slug_follows_githubs_rules() -> None:
    assert github_slug("Collections (the batch runner)") == "collections-the-batch-runner"
    assert github_slug("Keys read from the merged run YAML") == "keys-read-from-the-merged-run-yaml"
    assert github_slug("Domains of `service/`") == "domains-of-service"


def test_no_file_leans_on_anything_outside_the_clone() -> None:
    offenders = []
    for path in repository_files():
        data = path.read_bytes()
        for needle in FORBIDDEN:
            at = data.find(needle.encode())
            if at >= 0:
                line = data.count(b"\n", 0, at) + 1
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{line} mentions {needle!r}")
    assert not offenders, "the clone stands alone (rules in docs/, fixtures in tests/data/):\n" + "\n".join(offenders)


def test_every_pointer_into_docs_names_a_page_and_heading_that_exist() -> None:
    broken = []
    for path, text in text_files():
        for match in DOCS_POINTER.finditer(text):
            problem = target_problem(REPO_ROOT / "docs" / match.group(1), match.group(2))
            if problem:
                broken.append(f"{path.relative_to(REPO_ROOT)}:{line_of(text, match.start())}: {problem}")
    assert not broken, "\n".join(broken)


def test_every_relative_link_of_the_markdown_files_resolves() -> None:
    broken = []
    for path, text in text_files():
        if path.suffix != ".md":
            continue
        for match in MARKDOWN_LINK.finditer(text):
            target = match.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto: ...
            location, _, anchor = target.partition("#")
            page = (path.parent / location).resolve() if location else path
            problem = target_problem(page, anchor or None) if page.is_relative_to(REPO_ROOT) else "outside the clone"
            if problem:
                broken.append(f"{path.relative_to(REPO_ROOT)}:{line_of(text, match.start())}: {target}: {problem}")
    assert not broken, "\n".join(broken)
