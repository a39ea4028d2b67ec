"""Where a campaign on Ray keeps its results: one folder every node sees, or an object store.

``--store`` names it. A path (``/mnt/shared/bakeoff/c1``) is used as the campaign folder
itself: every node writes its cells there, through :mod:`bakeoff.results.store`'s atomic renames,
exactly as a local campaign does. A URI (``s3://bucket/bakeoff/c1``, ``gs://...``, or
``file:///...``) goes through fsspec: the driver keeps a local copy of the campaign folder
(plans, ``campaign.yaml``, the report), each cell task works in a scratch folder on its
node, pulled from the store, and pushes the cell back when it ends, however it ends.

A pushed file is written under a temporary name and moved into place, and within a run
``summary.json`` goes last, ``cell.json`` last of all: a reader that sees a run's summary
sees the whole run, and a cell whose ``cell.json`` says ``ok`` has every run beside it.
Object stores write each object whole, so the move only matters for ``file://``.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bakeoff.errors import SpecError
from bakeoff.results.layout import REHEARSAL_MARKER
from bakeoff.results.store import CELL_INFO, SUMMARY, atomic_write_bytes

CAMPAIGN_COPY = "campaign.yaml"
# Pushed last: a run is whole once its summary is there, a cell once its cell.json is.
_LAST = {SUMMARY: 1, CELL_INFO: 2}


def is_uri(text: str) -> bool:
    return "://" in text


class ResultStore:
    """A campaign folder shared by every node (``uri`` None) or kept in an fsspec store."""

    def __init__(self, local: Path, uri: str | None = None) -> None:
        self.local = local
        self.uri = uri
        self._fs: Any = None
        self._root = ""
        if uri is not None:
            try:
                import fsspec
            except ImportError as exc:
                raise SpecError(f"--store {uri}: object stores need fsspec: pip install 'bakeoff[ray]'") from exc
            try:
                self._fs, self._root = fsspec.core.url_to_fs(uri)
            except (ImportError, ValueError) as exc:
                raise SpecError(
                    f"--store {uri}: {exc}; install the fsspec driver for that scheme (s3fs for s3://, gcsfs for gs://)"
                ) from exc
            self._root = self._root.rstrip("/")

    @classmethod
    def open(cls, store: str | None, default_local: Path) -> ResultStore:
        """``--store`` as given: None keeps ``default_local``; a path is the folder; a URI is remote."""
        if store is None:
            return cls(default_local.resolve())
        if is_uri(store):  # file:// too: the object-store path, on a local disk
            return cls(default_local.resolve(), store)
        return cls(Path(store).expanduser().resolve())

    @property
    def shared(self) -> bool:
        return self.uri is None

    def where(self) -> str:
        return self.uri or str(self.local)

    def _key(self, rel: str) -> str:
        return f"{self._root}/{rel}".rstrip("/")

    def push(self, local_dir: Path, rel: str) -> None:
        """Copy ``local_dir`` to ``rel`` in the store, summaries then ``cell.json`` last."""
        if self.shared or not local_dir.exists():
            return
        files = [p for p in local_dir.rglob("*") if p.is_file() and not p.name.startswith(".")]
        for path in sorted(files, key=lambda p: (_LAST.get(p.name, 0), str(p))):
            self.push_file(path, f"{rel}/{path.relative_to(local_dir).as_posix()}")

    def push_file(self, path: Path, rel: str) -> None:
        if self.shared:
            return
        final = self._key(rel)
        temporary = f"{final}.part-{uuid.uuid4().hex[:8]}"
        self._fs.makedirs(final.rsplit("/", 1)[0], exist_ok=True)
        self._fs.put_file(str(path), temporary)
        self._fs.mv(temporary, final)

    def pull(self, rel: str, local_dir: Path) -> int:
        """Copy ``rel`` from the store into ``local_dir`` (atomically per file); return files copied."""
        if self.shared:
            return 0
        top = self._key(rel)
        if not self._fs.exists(top):
            return 0
        count = 0
        for key in self._fs.find(top):
            name = key[len(top) :].lstrip("/")
            if ".part-" in name.rsplit("/", 1)[-1]:
                continue  # a push cut short
            atomic_write_bytes(local_dir / name, self._fs.cat_file(key))
            count += 1
        return count

    def delete(self, rel: str) -> None:
        if not self.shared and self._fs.exists(self._key(rel)):
            self._fs.rm(self._key(rel), recursive=True)

    @contextlib.contextmanager
    def working_copy(self, cell_id: str) -> Iterator[Path]:
        """The campaign folder a cell task works in; a scratch copy pushed back on exit for a URI store."""
        if self.shared:
            if not (self.local / CAMPAIGN_COPY).is_file():
                raise SpecError(
                    f"campaign folder {self.local} is not visible on this node; give --store a folder every "
                    "node mounts, or an object-store URI"
                )
            yield self.local
            return
        scratch = Path(tempfile.mkdtemp(prefix="bakeoff-cell-"))
        try:
            for rel in (CAMPAIGN_COPY, REHEARSAL_MARKER):
                self._pull_file(rel, scratch / rel)
            self.pull("plans", scratch / "plans")
            self.pull(f"cells/{cell_id}", scratch / "cells" / cell_id)
            try:
                yield scratch
            finally:
                self.push(scratch / "cells" / cell_id, f"cells/{cell_id}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _pull_file(self, rel: str, path: Path) -> None:
        key = self._key(rel)
        if self._fs.exists(key):
            atomic_write_bytes(path, self._fs.cat_file(key))
