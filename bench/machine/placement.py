"""Where each rank runs, and which node a multi-node failure points to.

``placement()`` is this rank's node (SLURM's node name, else the hostname), hostname, local rank,
the node's IPv4 addresses, the rendezvous address (MASTER_ADDR / MASTER_PORT) and what it resolves to
on this node, and the socket interfaces named for gloo / NCCL (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME).
Every rank's record holds it (``rank{r}.json``, ``metrics.json`` ``ranks[].placement``; the run's
``placement`` sums it up: which ranks ran on which node, and the master address).  Under SLURM each
rank also writes it at its start (``node_rank{r}.json``): a rank killed with its node leaves nothing
else, and :func:`node_note` names that node in the run's error.

The bug class it records: a rank whose hostname resolves to a loopback address (Debian's
``127.0.1.1 <hostname>``, a container's ``127.0.0.1 <hostname>``) makes gloo bind to, and advertise,
127.0.0.1; ranks on other nodes then cannot reach it ("Connection refused, remote=[127.0.0.1]:...").
Naming the interface (GLOO_SOCKET_IFNAME) fixes it; :func:`node_note` says so when a multi-node
run fails that way.
"""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Optional

from bench.jsonio import read_json_dict, write_json_atomic

SOCKET_IFNAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_PEER = re.compile(r"\[([0-9A-Fa-f:.]+)\]:\d+")  # gloo's "[10.0.0.2]:43727", "remote=[127.0.0.1]:31138"


def _ipv4_addresses() -> list[str]:
    """This node's IPv4 addresses, one per interface (SIOCGIFADDR), loopback excluded."""
    import fcntl
    import struct

    out = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:
                    res = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
                except OSError:
                    continue
                addr = socket.inet_ntoa(res[20:24])
                if not addr.startswith("127."):
                    out.append(addr)
    except OSError:
        pass
    return out


def _resolve(name: Optional[str]) -> Optional[str]:
    if not name:
        return None
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def placement() -> dict:
    """Where this rank runs (see the module's docstring)."""
    host = socket.gethostname()
    master = os.environ.get("MASTER_ADDR")
    port = os.environ.get("MASTER_PORT")
    return {
        "node": os.environ.get("SLURMD_NODENAME") or host,
        "hostname": host,
        "hostname_ip": _resolve(host),  # where gloo binds unless GLOO_SOCKET_IFNAME names an interface
        "local_rank": int(os.environ["LOCAL_RANK"]) if os.environ.get("LOCAL_RANK", "").isdigit() else None,
        "addresses": _ipv4_addresses(),
        "master_addr": master,
        "master_port": int(port) if port and port.isdigit() else port,
        "master_ip": _resolve(master),  # the rendezvous address as this node resolves it
        "socket_ifname": {k: os.environ[k] for k in SOCKET_IFNAMES if os.environ.get(k)},
    }


def write_placement(run_dir: Path, rank: int) -> dict:
    p = {"rank": rank, **placement()}
    write_json_atomic(Path(run_dir) / f"node_rank{rank}.json", p)
    return p


def read_placements(run_dir: Path) -> dict[int, dict]:
    """{rank: placement} from the ``node_rank{r}.json`` the ranks wrote at their start."""
    out = {}
    for p in Path(run_dir).glob("node_rank*.json"):
        d = read_json_dict(p)
        if d is not None and isinstance(d.get("rank"), int):
            out[d["rank"]] = d
    return out


def summary(placements: list[dict]) -> Optional[dict]:
    """metrics.json ``placement``: {"nodes": {node: [ranks]}, "master_addr", "master_port"} from the
    ranks' placements (rank order), or None without any."""
    placed = [p for p in placements if p]
    if not placed:
        return None
    nodes: dict[str, list[int]] = {}
    for r, p in enumerate(placements):
        if p:
            nodes.setdefault(str(p.get("node")), []).append(p.get("rank", r))
    return {"nodes": nodes, "master_addr": placed[0].get("master_addr"), "master_port": placed[0].get("master_port")}


def span(ranks: list[int]) -> str:
    """[0, 1, 3] -> "0-1, 3"."""
    out, rs = [], sorted(ranks)
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(f"{rs[i]}-{rs[j]}" if j > i else str(rs[i]))
        i = j + 1
    return ", ".join(out)


def _address_nodes(placements: dict[int, dict]) -> dict[str, str]:
    """{address: node} over the ranks' placements; an address several nodes have (docker0) is left out."""
    seen: dict[str, set] = {}
    for p in placements.values():
        for a in p.get("addresses") or []:
            seen.setdefault(a, set()).add(str(p.get("node")))
    return {a: next(iter(ns)) for a, ns in seen.items() if len(ns) == 1}


def node_note(failures: list[dict], placements: dict[int, dict]) -> Optional[str]:
    """What the failure of a run on several nodes says about them, or None (one node, or a root cause
    that is not a lost connection): the node(s) the root cause's connection pointed to, and whether
    their ranks left no failure record (killed, or the node died); or, for a peer at a loopback
    address, the fix."""
    by_node: dict[str, list[int]] = {}
    for r, p in placements.items():
        by_node.setdefault(str(p.get("node")), []).append(r)
    if len(by_node) < 2 or not failures or not _PEER.search(str(failures[0].get("message") or "")):
        return None
    peers = _PEER.findall(str(failures[0].get("message") or ""))  # the root cause's, not its collateral's
    if any(a.startswith("127.") or a == "::1" for a in peers):
        return ("a rank reached a peer at a loopback address: on several nodes a rank whose hostname resolves to "
                "127.x binds gloo there and advertises it to the other nodes; name the network interface "
                "(GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME: hydra.launcher.setup, docs/sweeps.md)")
    addr_node = _address_nodes(placements)
    recorded = {f.get("rank") for f in failures}
    named = list(dict.fromkeys(addr_node[a] for a in peers if a in addr_node))
    if not named:
        return None
    parts = []
    for n in named:
        addrs = ", ".join(sorted({a for a in peers if addr_node.get(a) == n}))
        silent = not recorded & set(by_node[n])
        parts.append(f"node {n} (ranks {span(by_node[n])}): the connection to it ({addrs}) failed"
                     + ("; its ranks left no failure record: they were killed, or the node died" if silent else ""))
    return "lost " + "; ".join(parts)
