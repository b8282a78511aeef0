"""Reading an offline wandb run back (for the logger tests), with wandb's own protobuf schema."""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any


def wandb_records(path: Path):
    """The records of an offline wandb run file (``run-<id>.wandb``), decoded with wandb's own
    protobuf schema (wandb_internal_pb2.Record).  wandb 0.31 has no Python reader any more
    (wandb.sdk.internal.datastore is gone); its file is a LevelDB-style log: a 7-byte header
    (":W&B", magic 0xBEE1, version), then 32 KiB blocks of chunks, each with a 7-byte header
    (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    if ident != b":W&B" or magic != 0xBEE1:
        raise ValueError(f"{path}: not a wandb run file")
    block, pos, buf = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0:  # zero padding up to the end of the block
            pos += left - 7
            continue
        chunk, pos = data[pos:pos + n], pos + n
        if kind in (1, 2):
            buf = chunk
        else:
            buf += chunk
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            yield r
            buf = b""


def read_wandb_run(run_file: Path, wait_s: float = 30.0) -> dict:
    """What an offline wandb run recorded: project, group, name, config, history and summary.  wandb's
    service process writes the file; on a loaded machine its records can land a moment after ``finish()``
    returns, so an incomplete file (no run record yet) is read again for up to ``wait_s``."""
    deadline = time.time() + wait_s
    while True:
        out = _read_once(run_file)
        if "project" in out or time.time() > deadline:
            return out
        time.sleep(0.5)


def _read_once(run_file: Path) -> dict:
    out: dict[str, Any] = {"config": {}, "history": [], "summary": {}}
    key = lambda item: item.key or ".".join(item.nested_key)  # noqa: E731
    for r in wandb_records(run_file):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out.update(project=r.run.project, group=r.run.run_group, name=r.run.display_name, id=r.run.run_id)
            out["config"].update({key(i): json.loads(i.value_json) for i in r.run.config.update})
        elif kind == "config":
            out["config"].update({key(i): json.loads(i.value_json) for i in r.config.update})
        elif kind == "history":
            out["history"].append({key(i): json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            out["summary"].update({key(i): json.loads(i.value_json) for i in r.summary.update if key(i)})
    return out
