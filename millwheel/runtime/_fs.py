"""The few filesystem operations the driver needs, on a local path or any URI pyarrow knows.

Spark reads and writes the same locations through Hadoop; the driver only lists, reads
small files, writes small files and renames. A rename is atomic on a local disk and on
HDFS, which is what makes stream-log publication atomic; object stores (``s3://``) copy on
rename and need the Kafka-backed stream instead (see ``docs/runtime.md``).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import pyarrow.fs as pafs


@dataclass(frozen=True)
class Location:
    """A root directory: ``uri`` for Spark, ``fs`` + ``path`` for pyarrow."""

    uri: str
    fs: pafs.FileSystem
    path: str

    @classmethod
    def of(cls, root: str) -> Location:
        if "://" not in root:
            root = os.path.abspath(root)
            return cls(root, pafs.LocalFileSystem(), root)
        fs, path = pafs.FileSystem.from_uri(root)
        return cls(root.rstrip("/"), fs, path.rstrip("/"))

    @property
    def local(self) -> bool:
        """On this machine's filesystem (a path or a ``file:`` URI)."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    def child(self, *parts: str) -> Location:
        sub = "/".join(parts)
        return Location(f"{self.uri}/{sub}", self.fs, f"{self.path}/{sub}")

    # ---- operations ------------------------------------------------------------------
    def mkdirs(self) -> None:
        self.fs.create_dir(self.path, recursive=True)

    def exists(self) -> bool:
        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    def list(self) -> list[str]:
        """Names directly under this directory (empty if it does not exist)."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        except FileNotFoundError:
            return []
        return [i.base_name for i in infos]

    def read_text(self) -> str | None:
        try:
            with self.fs.open_input_stream(self.path) as f:
                return f.read().decode()
        except (FileNotFoundError, OSError):
            return None

    def _tmp(self) -> str:
        """A hidden temporary file beside this one, of a name no other writer uses."""
        parent, name = self.path.rsplit("/", 1)
        return f"{parent}/.{name}.{uuid.uuid4().hex[:12]}.tmp"

    def write_text(self, text: str) -> None:
        """Write atomically: a hidden temporary file, then a rename. The temporary file's
        name is unique, so two writers (a driver and its zombie) never rename each other's."""
        tmp = self._tmp()
        with self.fs.open_output_stream(tmp) as f:
            f.write(text.encode())
        self.fs.move(tmp, self.path)

    def write_new(self, text: str) -> bool:
        """Write ``text`` here only if nothing is here yet (``False``: something was). On a
        local disk a hidden temporary file is linked to the name, so the write is atomic and
        exclusive; elsewhere a look, then :meth:`write_text` (the caller's fence narrows the
        window between the two)."""
        if not self.local:
            if self.exists():
                return False
            self.write_text(text)
            return True
        tmp = self._tmp()
        with open(tmp, "w") as f:
            f.write(text)
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True

    def move_to(self, dest: Location) -> None:
        self.fs.move(self.path, dest.path)

    def delete(self) -> None:
        info = self.fs.get_file_info(self.path)
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(self.path)
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(self.path)
