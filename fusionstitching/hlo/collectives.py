"""Collectives' replica groups: XLA's three spellings read as lists of device indices.

    replica_groups={{0,1},{2,3}}                      lists
    replica_groups=[2,4]<=[4,2]T(1,0)                 iota: an iota reshaped, transposed, cut
    replica_groups=mesh['x'=2,'y'=4] {'y'}            mesh axes: one group per other-axes index
    replica_groups=mesh['x'=2,'y'=4], device_ids=([4,2]T(1,0)) {'y'}    ... of these devices

jaxlib's HLO -> StableHLO converter writes the mesh form in a way its own parser rejects, so
modules are compiled with the groups spelled as lists (``explicit_replica_groups``).
"""
from __future__ import annotations

import math
import re

import numpy as np

_IOTA = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?$")
_DEVICE_IDS = r"(?:,\s*device_ids=\(((?:[^()]|\([^()]*\))*)\))?"
_MESH = re.compile(r"mesh\[([^\]]*)\]" + _DEVICE_IDS + r"\s*\{([^}]*)\}$")
_AXIS = re.compile(r"'([^']+)'=(\d+)$")
_MESH_ATTR = re.compile(r"replica_groups=(mesh\[[^\]]*\]" + _DEVICE_IDS.replace("(((", "((?:(")
                        + r"\s*\{[^}]*\})")


class GroupsError(ValueError):
    """Replica groups this module does not know how to read (sub-axes, device lists)."""


def replica_groups(value: str) -> list[list[int]]:
    """The groups of a ``replica_groups`` attribute value; ``[]`` for ``{}`` (all devices)."""
    value = value.strip()
    if value.startswith("mesh["):
        return _mesh_groups(value)
    iota = _IOTA.match(value)
    if iota:
        dims, reshape, perm = (_ints(g) if g else None for g in iota.groups())
        ids = np.arange(math.prod(reshape)).reshape(reshape)
        if perm is not None:
            ids = ids.transpose(perm)
        return ids.reshape(dims).tolist()
    if not (value.startswith("{") and value.endswith("}")):
        raise GroupsError(f"replica_groups={value}: not a list, iota or mesh form")
    inner = value[1:-1].strip()
    return [_ints(g) for g in re.findall(r"\{([^{}]*)\}", inner)] if inner else []


def _mesh_groups(value: str) -> list[list[int]]:
    match = _MESH.match(value)
    if not match:
        raise GroupsError(f"replica_groups={value}: a mesh with sub-axes")
    names, sizes = [], []
    for axis in match.group(1).split(","):
        part = _AXIS.match(axis.strip())
        if not part:
            raise GroupsError(f"replica_groups={value}: axis {axis.strip()!r}")
        names.append(part.group(1))
        sizes.append(int(part.group(2)))
    grouped = [a.strip().strip("'") for a in match.group(3).split(",") if a.strip()]
    if any(a not in names for a in grouped):
        raise GroupsError(f"replica_groups={value}: grouped axes {grouped} (sub-axes?)")
    order = [i for i, n in enumerate(names) if n not in grouped] + \
        [names.index(a) for a in grouped]
    size = math.prod(sizes[names.index(a)] for a in grouped)
    ids = _device_ids(match.group(2), math.prod(sizes), value)
    return ids.reshape(sizes).transpose(order).reshape(-1, size).tolist()


def _device_ids(text: str | None, count: int, value: str) -> np.ndarray:
    """The mesh's devices in order: an iota (``[2,4]T(1,0)``: reshaped, transposed,
    flattened), a list, or by default 0..count-1."""
    if text is None:
        return np.arange(count)
    iota = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", text.strip())
    if iota:
        ids = np.arange(count).reshape(_ints(iota.group(1)))
        return (ids.transpose(_ints(iota.group(2))) if iota.group(2) else ids).reshape(-1)
    ids = np.array(_ints(text))
    if ids.size != count:
        raise GroupsError(f"replica_groups={value}: {ids.size} device ids for {count} devices")
    return ids


def explicit_replica_groups(text: str) -> str:
    """``text`` with every mesh-form ``replica_groups`` written as lists."""
    def lists(match: re.Match) -> str:
        groups = replica_groups(match.group(1))
        return "replica_groups={" + ",".join(
            "{" + ",".join(map(str, g)) + "}" for g in groups) + "}"
    return _MESH_ATTR.sub(lists, text)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


_CHANNEL = re.compile(r"\bchannel_id=\d+,\s*|,\s*channel_id=\d+\b")
_GLOBAL_IDS = re.compile(r",\s*use_global_device_ids=true\b")


def as_replicas(text: str) -> str:
    """An SPMD-partitioned module (one program per partition) as the same program run by
    replicas: XLA compiles a module of several partitions only through its SPMD partitioner,
    which does not take a module it already partitioned. ``partition-id`` becomes
    ``replica-id`` and each collective a cross-replica one (no channel, no global ids): with
    one partition a device's replica id is its partition id was, and its global id."""
    text = without_shardings(explicit_replica_groups(text))
    text = re.sub(r"\bpartition-id\(\)", "replica-id()", text)
    return _GLOBAL_IDS.sub("", _CHANNEL.sub("", text))


def without_shardings(text: str) -> str:
    """``text`` less its ``sharding={...}`` attributes (what the partitioner left of them
    describes the whole array, not the program each device runs)."""
    pieces, pos = [], 0
    for match in re.finditer(r",\s*sharding=\{", text):
        if match.start() < pos:
            continue
        depth, end = 1, match.end()
        while depth and end < len(text):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        pieces.append(text[pos:match.start()])
        pos = end
    return "".join(pieces) + text[pos:]
