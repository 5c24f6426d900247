"""MkDocs hooks for taskq's documentation site (named in mkdocs.yml; not part of the package).

1. The import layout. setuptools installs folders under other names (pyproject.toml's
   `[tool.setuptools.package-dir]`: `runtime/` is `taskq`, `actors/` is `taskq.actors`, ...), so no folder
   of the repository is called `taskq` and griffe, which reads source statically, cannot find the package
   by name. Before every build this writes a tree of symbolic links, `build/docs-src/taskq/...`, laid out
   as the installed package is, from that table; mkdocstrings reads it (`paths: [build/docs-src]` in
   mkdocs.yml). The links point at the working files, so the reference always shows the checkout being
   built, and the tree follows any new module or subpackage at the next build.
2. Links out of docs/. The guides link to files elsewhere in the repository (`../benchmarks/README.md`,
   `../sql/roles.sql`) so that they work where the repository is read (GitHub, an editor). Such a file is
   not a page of the site: when it exists in the repository the link becomes a link to it under
   `repo_url` (when mkdocs.yml sets one) or its plain text with the repository path, so a broken
   link still fails the strict build while a good one does not.
"""

from __future__ import annotations

import os
import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TREE = REPO_ROOT / "build" / "docs-src"

# [text](target) where target is a relative path leaving docs/ (starts with ../), optional #anchor
_OUTSIDE_LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>\.\./[^)#\s]+)(?P<anchor>#[^)\s]*)?\)")


def package_dirs(pyproject: Path) -> dict[str, Path]:
    """Package name -> the folder setuptools installs it from, for every package with a folder."""
    config = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    mapping = {name: REPO_ROOT / folder for name, folder in config.get("package-dir", {}).items()}
    dirs: dict[str, Path] = {}
    for name in config["packages"]:
        if name in mapping:
            dirs[name] = mapping[name]
            continue
        # a package without an entry lives inside its nearest mapped ancestor, as setuptools places it
        parent, _, leaf = name.rpartition(".")
        while parent and parent not in mapping:
            parent, _, more = parent.rpartition(".")
            leaf = f"{more}.{leaf}"
        base = mapping.get(parent, REPO_ROOT)
        dirs[name] = base.joinpath(*leaf.split("."))
    return dirs


def build_tree(target: Path = TREE) -> Path:
    """Lay out the installed package as links under `target`; return `target`.

    A package gets a real folder in the tree when it, or a package inside it, is installed from a folder
    other than its place in its parent's folder; everything else in its folder is linked as it is.
    """
    dirs = package_dirs(REPO_ROOT / "pyproject.toml")

    def moved(name: str) -> bool:
        parent, _, leaf = name.rpartition(".")
        return parent not in dirs or dirs[parent] / leaf != dirs[name]

    real = {name for name in dirs if moved(name) or any(moved(m) for m in dirs if m.startswith(f"{name}."))}
    if target.exists():
        shutil.rmtree(target)
    for name in sorted(real, key=lambda n: n.count(".")):
        package_dir = target.joinpath(*name.split("."))
        package_dir.mkdir(parents=True, exist_ok=True)
        for entry in sorted(dirs[name].iterdir()):
            if entry.name != "__pycache__" and f"{name}.{entry.name}" not in real:
                (package_dir / entry.name).symlink_to(os.path.relpath(entry, package_dir))
    return target


def on_config(config: Any) -> Any:
    build_tree()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    page_dir = Path(config["docs_dir"]) / Path(page.file.src_path).parent
    repo_url = (config.get("repo_url") or "").rstrip("/")

    def rewrite(match: re.Match[str]) -> str:
        path = (page_dir / match["target"]).resolve()
        docs_dir = Path(config["docs_dir"]).resolve()
        if not path.exists() or path.is_relative_to(docs_dir) or not path.is_relative_to(REPO_ROOT):
            return match[0]  # left to mkdocs' own link validation
        relative = path.relative_to(REPO_ROOT).as_posix()
        if repo_url:
            return f"[{match['text']}]({repo_url}/blob/main/{relative}{match['anchor'] or ''})"
        text = match["text"]
        return text if text.strip("`") == relative else f"{text} (`{relative}` in the repository)"

    return _OUTSIDE_LINK.sub(rewrite, markdown)
