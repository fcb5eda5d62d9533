"""Where a node sits in the cluster's interconnect, from what the cluster states about it.

A node's **NVLink domain** (the nodes one NVLink switch fabric joins: a GB200/GB300 NVL72
rack is one domain of 18 nodes), its **rack**, and its **topology rank** (its position
along the network, e.g. SLURM's ``SLURM_TOPOLOGY_ADDR``) are read, in this order, from:

* node labels: Ray's ``ray.io/gpu-domain`` for the domain; ``placectl.io/rack`` and
  ``placectl.io/topo-rank`` where Ray has no label;
* NeMo-RL's custom resources: ``nvlink_domain_<ClusterUUID>`` (one per node, the fabric's
  cluster UUID that NeMo-RL's start script reads from ``nvidia-smi -q``) and ``topo_rank``.

placectl does not read ``nvidia-smi`` itself: the order of nodes is decided before any
process runs on them, so the domain has to be stated when the node joins (a label or a
resource given to ``ray start``).

A value that does not parse (a topology rank that is not an int) is ignored and named by
:func:`topology_problems`, never an error: labels are written by people, and the
controller must keep running with them.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

GPU_DOMAIN_LABEL = "ray.io/gpu-domain"
RACK_LABEL = "placectl.io/rack"
TOPO_RANK_LABEL = "placectl.io/topo-rank"
NVLINK_RESOURCE_PREFIX = "nvlink_domain_"  # NeMo-RL's
TOPO_RANK_RESOURCE = "topo_rank"  # NeMo-RL's


class Topology(msgspec.Struct, kw_only=True, frozen=True):
    """One node's place in the interconnect; empty fields are unknown.

    Attributes:
        domain: its NVLink domain.
        rack: its rack.
        topo_rank: its topology rank (lower is earlier), None when unknown.
        source: where the domain was read (a label or resource name), "" when unknown.
    """

    domain: str = ""
    rack: str = ""
    topo_rank: int | None = None
    source: str = ""

    @property
    def known(self) -> bool:
        return bool(self.domain or self.rack) or self.topo_rank is not None

    def describe(self) -> str:
        """``domain=a rack=r1 topo=3``, or ``-`` when nothing is known."""
        parts = []
        if self.domain:
            parts.append(f"domain={self.domain}")
        if self.rack:
            parts.append(f"rack={self.rack}")
        if self.topo_rank is not None:
            parts.append(f"topo={self.topo_rank}")
        return " ".join(parts) or "-"


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def topology_of(labels: dict[str, str], resources: dict[str, float]) -> Topology:
    """A node's topology from its labels and custom resources (see the module docstring
    for the order in which they are read)."""
    domain, source = "", ""
    if labels.get(GPU_DOMAIN_LABEL):
        domain, source = labels[GPU_DOMAIN_LABEL], GPU_DOMAIN_LABEL
    else:
        nvlink = sorted(k for k in resources if k.startswith(NVLINK_RESOURCE_PREFIX))
        if nvlink:
            domain, source = nvlink[0][len(NVLINK_RESOURCE_PREFIX) :], nvlink[0]
    topo = _int(labels.get(TOPO_RANK_LABEL))
    if topo is None and TOPO_RANK_LABEL not in labels:
        topo = _int(resources.get(TOPO_RANK_RESOURCE))
    return Topology(domain=domain, rack=labels.get(RACK_LABEL, ""), topo_rank=topo, source=source)


def topology_problems(labels: dict[str, str], resources: dict[str, float]) -> list[str]:
    """What a node states about its topology that placectl could not read."""
    problems = []
    if TOPO_RANK_LABEL in labels and _int(labels[TOPO_RANK_LABEL]) is None:
        problems.append(f"label {TOPO_RANK_LABEL}={labels[TOPO_RANK_LABEL]!r} is not an int")
    nvlink = [k for k in resources if k.startswith(NVLINK_RESOURCE_PREFIX)]
    if len(nvlink) > 1:
        problems.append(f"several NVLink domain resources ({', '.join(sorted(nvlink))})")
    return problems


def place_of(topology: Topology, within: str) -> str:
    """The NVLink domain (``within="nvlink-domain"``) or rack (``"rack"``) of a node;
    "" when it states none."""
    return topology.domain if within == "nvlink-domain" else topology.rack


_LAST = float("inf")


def topology_order(topologies: Sequence[Topology]) -> list[int]:
    """Positions ``0..n-1`` (the order without topology) rearranged so that the nodes of
    one NVLink domain are consecutive, and within it those of one rack.

    Domains come in the order of their lowest topology rank (as NeMo-RL orders them),
    then of their first node; within a domain, racks the same way; within a rack, nodes
    by topology rank, then position. Nodes with no domain come after every domain.
    Without any topology the order is unchanged.
    """
    if not any(t.known for t in topologies):
        return list(range(len(topologies)))

    def first(members: list[int]) -> tuple[float, int]:
        ranks = [topologies[i].topo_rank for i in members if topologies[i].topo_rank is not None]
        return (min(ranks) if ranks else _LAST, min(members))

    domains: dict[str, list[int]] = {}
    for i, t in enumerate(topologies):
        domains.setdefault(t.domain, []).append(i)
    order: list[int] = []
    for domain in sorted(domains, key=lambda d: (d == "", first(domains[d]))):
        racks: dict[str, list[int]] = {}
        for i in domains[domain]:
            racks.setdefault(topologies[i].rack, []).append(i)
        for rack in sorted(racks, key=lambda r: (r == "", first(racks[r]))):
            members = racks[rack]
            members.sort(
                key=lambda i: (
                    _LAST if topologies[i].topo_rank is None else topologies[i].topo_rank,
                    i,
                )
            )
            order.extend(members)
    return order


__all__ = [
    "GPU_DOMAIN_LABEL",
    "NVLINK_RESOURCE_PREFIX",
    "RACK_LABEL",
    "TOPO_RANK_LABEL",
    "TOPO_RANK_RESOURCE",
    "Topology",
    "place_of",
    "topology_of",
    "topology_order",
    "topology_problems",
]
