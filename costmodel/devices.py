"""GPU devices from XLA's own target configs (GpuTargetConfigProto text format).

The .txtpb files in data/ are copied from openxla/xla
``xla/backends/gpu/target_config/specs/`` (Apache-2.0); see data/README.md. XLA has no
config for the T4 (the paper's second GPU), so ``t4.json`` holds its numbers from NVIDIA's
public specifications, each field with its source.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
# Threads per warp on every NVIDIA GPU (each target config's threads_per_warp says 32): the
# code generator's schedules are built around it, so it is a constant, not a device field read.
WARP = 32
TARGETS = {"h100": "h100_sxm.txtpb", "a100": "a100_sxm_40.txtpb", "v100": "v100.txtpb",
           "t4": "t4.json"}


@dataclass(frozen=True)
class Device:
    name: str
    sm_arch: str  # "sm_90"
    sm_count: int
    clock_ghz: float
    memory_bandwidth: float  # bytes/s
    l2_bytes: int
    warp_size: int
    max_threads_per_block: int
    max_threads_per_sm: int
    shared_memory_per_block: int  # default limit without opt-in
    shared_memory_per_block_optin: int
    shared_memory_per_sm: int
    registers_per_sm: int
    registers_per_block: int


_TOKEN = re.compile(r'\s*(?:(#[^\n]*)|(\w+)\s*:\s*("(?:[^"\\]|\\.)*"|[^\s{}]+)|(\w+)\s*\{|(\}))')


def parse_textproto(text: str) -> dict:
    """A minimal protobuf text-format reader: nested messages become dicts (repeated fields
    keep the last value, which is all these configs need)."""
    stack: list[dict] = [{}]
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip():
                raise ValueError(f"textproto: cannot read at offset {pos}: {text[pos:pos+40]!r}")
            break
        pos = m.end()
        comment, key, value, open_key, close = m.groups()
        if comment:
            continue
        if key:
            stack[-1][key] = _scalar(value)
        elif open_key:
            child: dict = {}
            stack[-1][open_key] = child
            stack.append(child)
        elif close:
            stack.pop()
    return stack[0]


def _scalar(text: str):
    if text.startswith('"'):
        return text[1:-1]
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


@lru_cache(maxsize=None)
def load_device(target: str = "h100") -> Device:
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; known: {', '.join(sorted(TARGETS))}")
    path = DATA_DIR / TARGETS[target]
    if path.suffix == ".json":
        return Device(**json.loads(path.read_text())["device"])
    proto = parse_textproto(path.read_text())
    info = proto["gpu_device_info"]
    cc = info["cuda_compute_capability"]
    return Device(
        name=info["name"],
        sm_arch=f"sm_{cc.get('major', 0)}{cc.get('minor', 0)}",
        sm_count=info["core_count"],
        clock_ghz=info["clock_rate_ghz"],
        memory_bandwidth=float(info["memory_bandwidth"]),
        l2_bytes=info["l2_cache_size"],
        warp_size=info["threads_per_warp"],
        max_threads_per_block=info["threads_per_block_limit"],
        max_threads_per_sm=info["threads_per_core_limit"],
        shared_memory_per_block=info["shared_memory_per_block"],
        shared_memory_per_block_optin=info["shared_memory_per_block_optin"],
        shared_memory_per_sm=info["shared_memory_per_core"],
        registers_per_sm=info["registers_per_core_limit"],
        registers_per_block=info["registers_per_block_limit"],
    )
