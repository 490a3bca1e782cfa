"""How each rank finds the others, the framework's own way, on free ports.

Every rank also gets DLC_RANK / DLC_WORLD_SIZE / DLC_LOCAL_RANK so adapters read their place
uniformly; the framework-specific variables are what the framework's runtime itself reads.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Placement:
    """Where one rank runs: its global rank, its rank on the node, and the node's address."""

    rank: int
    local_rank: int
    world_size: int
    node_address: str = "127.0.0.1"


def common_env(place: Placement) -> dict[str, str]:
    return {"DLC_RANK": str(place.rank), "DLC_WORLD_SIZE": str(place.world_size),
            "DLC_LOCAL_RANK": str(place.local_rank)}


def torch_env(place: Placement, master_address: str, master_port: int) -> dict[str, str]:
    """torch.distributed's env:// rendezvous: rank 0 hosts the TCP store."""
    return {"MASTER_ADDR": master_address, "MASTER_PORT": str(master_port),
            "RANK": str(place.rank), "WORLD_SIZE": str(place.world_size),
            "LOCAL_RANK": str(place.local_rank)}


class Rendezvous:
    """Per-run rendezvous: picks ports once, then gives each rank its environment."""

    def __init__(self, kind: str, placements: list[Placement]):
        if kind not in ("torch",):
            raise ValueError(f"no rendezvous of kind {kind!r}")
        self.kind = kind
        self.placements = placements
        self.master_address = placements[0].node_address
        self.master_port = free_port()

    def rank_env(self, place: Placement) -> dict[str, str]:
        env = common_env(place)
        if self.kind == "torch":
            env.update(torch_env(place, self.master_address, self.master_port))
        return env
