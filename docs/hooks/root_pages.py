"""MkDocs hook: the repository's front pages in the site, with their links kept working.

README.md and BENCHMARKS.md live at the repository's root, where GitHub and
a checkout show them, but MkDocs reads only docs/. This hook adds them to the
site as index.md and benchmarks/index.md, and rewrites every relative link
of every page from where the file lies in the repository to where the page
lies in the site: README's `docs/format.md` becomes `format.md`, a page's
`../README.md` becomes `index.md`. A link to anything else outside docs/ (a
source file) is left alone, so `mkdocs build --strict` fails on it: name
source files in code spans, not links.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

# Repository path -> site path, for the files outside docs/.
ROOT_PAGES = {"README.md": "index.md", "BENCHMARKS.md": "benchmarks/index.md"}

# An inline link or image target: ](target) or ](target "title").
LINK = re.compile(r"(\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})")


def _repo(config) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def on_files(files, config):
    root = _repo(config)
    for real, site in ROOT_PAGES.items():
        files.append(File.generated(config, site, abs_src_path=str(root / real)))
    return files


def _real_path(src_uri: str) -> str:
    """Where a page's file lies in the repository."""
    for real, site in ROOT_PAGES.items():
        if src_uri == site:
            return real
    return "docs/" + src_uri


def _site_path(real: str) -> str | None:
    if real in ROOT_PAGES:
        return ROOT_PAGES[real]
    if real.startswith("docs/"):
        return real[len("docs/"):]
    return None


def rewrite(markdown: str, src_uri: str) -> str:
    """Every relative link of the page at src_uri, made relative to the page's place in the site."""
    real_dir = posixpath.dirname(_real_path(src_uri))
    site_dir = posixpath.dirname(src_uri)

    def fix(m: re.Match) -> str:
        target = m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return m.group(0)
        path, hash_, anchor = target.partition("#")
        site = _site_path(posixpath.normpath(posixpath.join(real_dir, path)))
        if site is None:
            return m.group(0)
        return m.group(1) + posixpath.relpath(site, site_dir or ".") + hash_ + anchor + m.group(3)

    out, fence = [], None
    for line in markdown.splitlines(keepends=True):
        f = FENCE.match(line)
        if fence is None and f:
            fence = f.group(2)
        elif fence is not None and f and f.group(2).startswith(fence[0] * len(fence)):
            fence = None
        elif fence is None:
            line = LINK.sub(fix, line)
        out.append(line)
    return "".join(out)


def on_page_markdown(markdown, page, config, files):
    return rewrite(markdown, page.file.src_uri)
