"""Every command the README and docs/ mark runnable runs, and exits 0.

A fenced block whose info string is ``bash runnable`` holds commands a reader can paste on a
fresh checkout that take seconds and start nothing (``--help``, ``validate``, ``backends``):
each block runs as a bash script (``set -e``, globs expanded) from the repository root, with
``bakeoff`` the worktree's package under this interpreter. Blocks that need a server, an engine
or a GPU stay plain ``bash``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNABLE = re.compile(r"^```bash runnable\n(.*?)^```$", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    """(page:line, block text) of every runnable block."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in RUNNABLE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(REPO)}:{line}", match.group(1)))
    return found


def test_the_readme_and_docs_mark_commands_runnable_and_link_every_page() -> None:
    where = [w for w, _ in blocks()]
    assert any(w.startswith("README.md") for w in where) and any(w.startswith("docs/") for w in where), where
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    for page in PAGES[1:]:
        assert f"](docs/{page.name})" in readme, f"README does not link {page.name}"
    # Every relative link in the docs names a file that exists.
    for page in PAGES:
        for target in re.findall(r"\]\((?!https?:|#)([^)#]+)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links {target}, which is not there"


@pytest.mark.parametrize(("where", "block"), blocks(), ids=[w for w, _ in blocks()])
def test_each_runnable_block_exits_0(where: str, block: str) -> None:
    commands = [c for c in block.splitlines() if c.strip() and not c.lstrip().startswith("#")]
    assert commands and all(c.split()[0] == "bakeoff" for c in commands), f"{where}: {commands}"
    script = f'bakeoff() {{ "{sys.executable}" -m bakeoff "$@"; }}\nset -e\n{block}'
    done = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{where} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
