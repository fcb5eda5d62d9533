"""Hardware units of a node group (robot arms and the like), from ``hardware.configs``.

Each entry of ``hardware.configs`` describes one unit attached to the node named by its
``node_rank``, in RLinf's form. For the hardware types RLinf knows, the fields of an
entry are checked against that type's fields (names from RLinf's robot modules); for any
other Ray resource only ``node_rank`` is required.
"""

from __future__ import annotations

import json
from typing import Any

from controller.errors import SpecError

# RLinf's robot types and the fields their config entries may carry (besides node_rank).
KNOWN_FIELDS: dict[str, frozenset[str]] = {
    "franka": frozenset(
        {
            "robot_ip",
            "camera_serials",
            "camera_type",
            "gripper_type",
            "gripper_connection",
            "controller_node_rank",
            "disable_validate",
        }
    ),
    "dualfranka": frozenset(
        {
            "left_robot_ip",
            "right_robot_ip",
            "left_camera_serials",
            "right_camera_serials",
            "base_camera_serials",
            "camera_type",
            "base_camera_type",
            "left_camera_type",
            "right_camera_type",
            "left_gripper_type",
            "right_gripper_type",
            "left_gripper_connection",
            "right_gripper_connection",
            "left_controller_node_rank",
            "right_controller_node_rank",
        }
    ),
    "dosw1": frozenset(
        {
            "robot_url",
            "left_arm_port",
            "right_arm_port",
            "left_lead_port",
            "right_lead_port",
            "camera_serials",
        }
    ),
    "gimarm": frozenset(
        {
            "can_interface",
            "arm_variant",
            "camera_serials",
            "camera_type",
            "enable_gripper",
            "gripper_type",
            "controller_node_rank",
            "disable_validate",
        }
    ),
    "turtle2": frozenset(),
}


def hardware_units(
    hardware: str, configs: list[Any], node_ranks: list[int] | None, where: str
) -> dict[int, int] | None:
    """Units per node rank, one per entry; None when there are no entries (the units then
    come from the cluster's resources of that name).

    Raises:
        SpecError: an entry that is not a mapping, lacks an int ``node_rank``, names a
            node outside the group, has fields its hardware type does not know, or
            repeats another entry; the message names the entry.
    """
    if not configs:
        return None
    allowed = KNOWN_FIELDS.get(hardware.lower())
    units: dict[int, int] = {}
    seen: dict[str, int] = {}
    for i, cfg in enumerate(configs):
        at = f"{where}.configs[{i}]"
        if not isinstance(cfg, dict):
            raise SpecError(f"{at}: expected a mapping with node_rank, got {cfg!r}")
        if "node_rank" not in cfg:
            raise SpecError(
                f"{at}: node_rank is missing; each entry names the node its {hardware} is "
                "attached to"
            )
        rank = cfg["node_rank"]
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise SpecError(f"{at}.node_rank {rank!r}: expected an int")
        if node_ranks is not None and rank not in node_ranks:
            raise SpecError(
                f"{at}.node_rank {rank}: not a node of the group (its nodes: {node_ranks})"
            )
        if allowed is not None:
            unknown = sorted(set(cfg) - allowed - {"node_rank"})
            if unknown:
                raise SpecError(
                    f"{at}: unknown field(s) {', '.join(unknown)} for {hardware} hardware; "
                    f"allowed: node_rank, {', '.join(sorted(allowed)) or '(none else)'}"
                )
        canonical = json.dumps(cfg, sort_keys=True, default=str)
        if canonical in seen:
            raise SpecError(
                f"{at}: repeats {where}.configs[{seen[canonical]}]; each {hardware} entry "
                "describes one unit and must be unique"
            )
        seen[canonical] = i
        units[rank] = units.get(rank, 0) + 1
    return units
