"""Conversations on disk: one xz file per generated round, packed into shards of at most 15 MiB.

Contract:
- `write_round(out, r, convs)` writes OUT/rounds/round-RRRRR.jsonl.xz atomically (a temporary
  file renamed), one JSON conversation a line (sorted keys, ensure_ascii=False, so the same
  conversations give the same bytes); `read_rounds(out)` yields (r, conversations) in order.
- `pack(out, max_bytes=MAX_SHARD)` rewrites OUT/teacher-NNN.jsonl.xz from every round, in round
  order: each shard is the longest run of whole lines whose xz stream is <= max_bytes (lines
  are cut into shards by their uncompressed size, then a shard over the limit is split in
  two until it fits). Old teacher-*.jsonl.xz files are replaced. These shards are what
  `tinyllm.tools.data` reads (`--data OUT`); rounds/ is the generator's working state.
"""

from __future__ import annotations

import json
import lzma
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

MAX_SHARD = 15 * 1024 * 1024  # bytes of one xz shard (the repository's limit on a file)
RAW_PER_SHARD = 48 * 1024 * 1024  # uncompressed bytes tried first (chat text packs about 4-5x)


def dumps(conv: dict) -> str:
    return json.dumps(conv, ensure_ascii=False, sort_keys=True)


def round_path(out: Path, r: int) -> Path:
    return Path(out) / "rounds" / f"round-{r:05d}.jsonl.xz"


def write_round(out: str | Path, r: int, convs: list[dict]) -> Path:
    path = round_path(Path(out), r)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(lzma.compress("".join(dumps(c) + "\n" for c in convs).encode(), preset=3))  # fast: working files
    os.replace(tmp, path)
    return path


def read_rounds(out: str | Path) -> Iterator[tuple[int, list[dict]]]:
    for path in sorted((Path(out) / "rounds").glob("round-*.jsonl.xz")):
        r = int(path.name.split("-")[1].split(".")[0])
        with lzma.open(path, "rt", encoding="utf-8") as f:
            yield r, [json.loads(line) for line in f if line.strip()]


def _compress(lines: list[bytes], max_bytes: int) -> list[bytes]:
    """xz streams for lines: one if it fits max_bytes, else the halves', recursively."""
    blob = lzma.compress(b"".join(lines), preset=6)
    if len(blob) <= max_bytes:
        return [blob]
    assert len(lines) > 1, f"one conversation compresses to {len(blob)} bytes, over {max_bytes}"
    mid = len(lines) // 2
    return _compress(lines[:mid], max_bytes) + _compress(lines[mid:], max_bytes)


def _compress_job(job: tuple[list[bytes], int]) -> list[bytes]:
    return _compress(*job)


def pack(out: str | Path, max_bytes: int = MAX_SHARD, raw_per_shard: int = RAW_PER_SHARD,
         workers: int = 1) -> list[Path]:
    out = Path(out)
    groups: list[list[bytes]] = [[]]
    size = 0
    for _, convs in read_rounds(out):
        for c in convs:
            line = (dumps(c) + "\n").encode()
            if groups[-1] and size + len(line) > raw_per_shard:
                groups.append([])
                size = 0
            groups[-1].append(line)
            size += len(line)
    jobs = [(g, max_bytes) for g in groups if g]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(min(workers, len(jobs))) as pool:
            blobs = [b for part in pool.map(_compress_job, jobs) for b in part]
    else:
        blobs = [b for job in jobs for b in _compress_job(job)]
    for old in out.glob("teacher-*.jsonl.xz"):
        old.unlink()
    paths = []
    for i, blob in enumerate(blobs):
        p = out / f"teacher-{i:03d}.jsonl.xz"
        p.write_bytes(blob)
        paths.append(p)
    return paths
