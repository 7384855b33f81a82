"""Writing corpus HLO files: one over a size is gzipped (no time stamp: a rerun gives the
same bytes). Shared by make_corpus.py and make_third_party.py."""
from __future__ import annotations

import gzip
from pathlib import Path


def write_hlo(directory: Path, name: str, text: str, compress_above: int) -> str:
    """Write ``text`` as ``directory/name``, or gzipped as ``name.gz`` when it is larger than
    ``compress_above`` bytes; returns the file name written."""
    data = text.encode("utf-8")
    if len(data) <= compress_above:
        (directory / name).write_bytes(data)
        return name
    (directory / f"{name}.gz").write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return f"{name}.gz"
