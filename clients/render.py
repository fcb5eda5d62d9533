"""Text pictures of a plan: one row per node, one cell per accelerator."""

from __future__ import annotations

import time

from controller import ComponentPlacement
from controller.planning.node_groups import ACCELERATOR, HARDWARE
from controller.planning.ranks import format_ranks

_HEAD, _TAIL = 16, 4  # nodes shown before and after an elision in large clusters


def _cells(cp: ComponentPlacement) -> dict[tuple[int, str], dict[str, list[int]]]:
    """(node rank, column) -> component -> ranks, in configuration order."""
    cells: dict[tuple[int, str], dict[str, list[int]]] = {}
    for name in cp.components:
        for p in cp.placements(name):
            if p.kind == ACCELERATOR:
                cols = [f"{cp.spec.accelerator}{g}" for g in p.local_resource_ranks]
            elif p.kind == HARDWARE:
                cols = [f"{p.hardware}{u}" for u in p.local_resource_ranks]
            else:
                cols = ["node"]
            for col in cols:
                cells.setdefault((p.node_rank, col), {}).setdefault(name, []).append(p.rank)
    return cells


def _column_order(cp: ComponentPlacement, cells) -> list[str]:
    acc = cp.spec.accelerator
    most_gpus = max((n.num_gpus for n in cp.view.nodes), default=0)
    cols = [f"{acc}{g}" for g in range(most_gpus)]
    extra = sorted({c for (_, c) in cells} - set(cols) - {"node"})
    cols += extra
    if any(c == "node" for (_, c) in cells):
        cols.append("node")
    return cols


def render_plan(cp: ComponentPlacement) -> str:
    """The placement map followed by a per-component summary."""
    cells = _cells(cp)
    cols = _column_order(cp, cells)
    nodes = list(range(cp.view.num_nodes))
    shown = nodes if len(nodes) <= _HEAD + _TAIL + 1 else nodes[:_HEAD] + nodes[-_TAIL:]
    texts: dict[tuple[int, str], list[str]] = {}
    for nr in shown:
        for col in cols:
            entry = cells.get((nr, col), {})
            lines = [f"{name}:{format_ranks(ranks)}" for name, ranks in entry.items()]
            if not lines:
                absent = col.startswith(cp.spec.accelerator) and col not in (
                    f"{cp.spec.accelerator}{g}" for g in range(cp.view.nodes[nr].num_gpus)
                )
                lines = [" " if absent else "."]
            texts[(nr, col)] = lines
    topo = {nr: cp.view.nodes[nr].topology for nr in shown}
    known = any(t.known for t in topo.values())
    names = {nr: f"node {nr}" + (f" {topo[nr].describe()}" if known else "") for nr in shown}
    label_w = max(len(names[nr]) for nr in shown) if shown else 4
    widths = {
        col: max([len(col)] + [len(t) for nr in shown for t in texts[(nr, col)]]) for col in cols
    }
    out = []
    total = sum(n.num_gpus for n in cp.view.nodes)
    out.append(
        f"placectl plan: {cp.view.num_nodes} node(s), {total} {cp.spec.accelerator}, "
        f"{len(cp.components)} component(s)"
    )
    out.append("")
    out.append(" " * label_w + "  " + "  ".join(col.ljust(widths[col]) for col in cols).rstrip())
    for i, nr in enumerate(shown):
        if i == _HEAD and len(shown) < len(nodes):
            out.append(f"... {len(nodes) - len(shown)} more nodes ...")
        height = max(len(texts[(nr, col)]) for col in cols) if cols else 1
        for line in range(height):
            label = names[nr] if line == 0 else ""
            row = [
                (texts[(nr, col)][line] if line < len(texts[(nr, col)]) else "").ljust(widths[col])
                for col in cols
            ]
            out.append(label.ljust(label_w) + "  " + "  ".join(row).rstrip())
    out.append("")
    out.extend(render_summary(cp))
    return "\n".join(out)


def _span(values: list) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def render_summary(cp: ComponentPlacement) -> list[str]:
    """One line per component: world size, nodes, processes per resource, share."""
    header = [
        "component",
        "group",
        "world",
        "nodes",
        "procs/res",
        "res/proc",
        "share",
        "child",
        "isolate",
    ]
    rows = [header]
    for name in cp.components:
        pool = cp.pool(name)
        ps = cp.placements(name)
        spec = cp.spec.component(name)
        per_res: dict[int, int] = {}
        for p in ps:
            for r in p.resource_ranks:
                per_res[r] = per_res.get(r, 0) + 1
        res_name = {ACCELERATOR: cp.spec.accelerator, HARDWARE: pool.hardware}.get(
            pool.kind, "node" if pool.kind != "mixed" else "res"
        )
        accel = [p for p in ps if p.kind == ACCELERATOR]
        seeing = [p for p in ps if p.kind != ACCELERATOR and p.cuda_visible_devices]
        rows.append(
            [
                name,
                ",".join(spec.node_groups),
                str(len(ps)),
                format_ranks(sorted({p.node_rank for p in ps})),
                f"{_span(list(per_res.values()))}/{res_name}",
                f"{_span([len(p.resource_ranks) for p in ps])} {res_name}",
                _span([p.accelerator_share for p in accel]) if accel else "-",
                _span([p.child_share for p in accel]) if spec.starts_children and accel else "-",
                ("no" if spec.isolate is False else "yes")
                if accel
                else ("sees node" if seeing else "-"),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    engines = [n for n in cp.components if cp.spec.component(n).starts_children]
    if engines:
        lines.append("")
        lines.append(
            "engines (" + ", ".join(engines) + "): each process may start one child per "
            "accelerator it holds (Assignment.child_options(i)); the child column is the "
            "share each child requests"
        )
    if cp.spec.spares:
        standing = [n for n in cp.components if cp.spec.component(n).standby]
        lines.append(
            f"spares: {cp.spec.spares} whole node(s) of the slots' kind held besides these, "
            "each as one group with the bundles of its busiest node, counted in the quota"
            + (f"; standbys of {', '.join(standing)} run there" if standing else "")
        )
    hardware = sorted({p.hardware for n in cp.components for p in cp.placements(n) if p.hardware})
    if hardware:
        lines.append("hardware units are requested from Ray as: " + ", ".join(hardware))
    seeing = [
        n
        for n in cp.components
        if any(p.kind != ACCELERATOR and p.cuda_visible_devices for p in cp.placements(n))
    ]
    if seeing:
        lines.append(
            f"processes of {', '.join(seeing)} see every accelerator of their node, as RLinf "
            "shows them; the job holds those accelerators so no other job can take them "
            "(isolate: true: see none, hold none)"
        )
    return lines


def render_reservation(
    info,
    assignments: dict[str, list],
    standbys: dict[str, list[str]] | None = None,
    short: dict | None = None,
) -> str:
    """A reserved job's map: one row per node slot (with its IP), one cell per physical
    accelerator id listing the ``component:ranks`` on it; then its held spares, per
    component with standbys how many are ready, starting and missing (``standbys``:
    each standby's state, by component), and the groups running short (``short``:
    each one's :class:`clients.short.ShortRecord`, by component)."""
    acc = info.accelerator
    on_node: dict[int, list] = {}
    for s in info.slots:  # a node may hold several groups after an apply
        on_node.setdefault(s.node_rank, []).append(s)
    to_physical = {
        nr: {k: v for s in slots for k, v in s.local_to_physical.items()}
        for nr, slots in on_node.items()
    }
    cells: dict[tuple[int, str], dict[str, list[int]]] = {}
    for name, items in assignments.items():
        for a in items:
            p = a.placement
            if p.local_gpu_id >= 0:
                to_phys = to_physical[p.node_rank]
                cols = [f"{acc}{to_phys[g]}" for g in p.local_resource_ranks]
            elif a.resources:
                cols = [f"{k}{p.local_resource_ranks[0]}" for k in a.resources]
            else:
                cols = ["node"]
            for col in cols:
                cells.setdefault((p.node_rank, col), {}).setdefault(name, []).append(p.rank)
    preempting = ""
    if info.preempting:
        at = time.strftime("%H:%M:%S", time.localtime(info.preempt_at))
        preempting = f", preempting: released at {at}"
    out = [
        f"{info.job}: {info.state}{preempting}, epoch {info.epoch}, {node_count(info)} "
        f"node(s), {info.num_accelerators} {acc}" + (f" ({info.reason})" if info.reason else "")
    ]
    for nr in sorted(on_node):
        slot = on_node[nr][0]
        ids = ", ".join(s.group_id for s in on_node[nr])
        label = "groups" if len(on_node[nr]) > 1 else "group"
        where = f"  {slot.topology}" if slot.topology else ""
        out.append(f"node {nr}  {slot.node_ip}  {slot.node_id[:12]}{where}  {label} {ids}")
        cols = sorted({c for (r, c) in cells if r == nr}, key=lambda c: (len(c), c))
        for col in cols:
            entry = cells[(nr, col)]
            text = "  ".join(f"{name}:{format_ranks(ranks)}" for name, ranks in entry.items())
            out.append(f"    {col:<8} {text}")
    if info.spares_wanted or info.spares:
        held = ", ".join(
            f"{s.node_ip} ({s.node_id[:12]}) group {s.group_id}, a copy of node {s.copies}"
            for s in info.spares
        )
        out.append(
            f"spares: {len(info.spares)} of {info.spares_wanted} held"
            + (held and f": {held}")
            + (info.spares_short and f"; fewer: {info.spares_short}")
        )
    for name, states in (standbys or {}).items():
        counts = ", ".join(f"{states.count(s)} {s}" for s in ("ready", "starting", "missing"))
        out.append(f"standbys of {name}: {counts}" if states else f"standbys of {name}: none")
    out += [render_short(name, record) for name, record in (short or {}).items()]
    return "\n".join(out)


def render_short(component: str, record, now: float | None = None) -> str:
    """One line for a group running short (a :class:`clients.short.ShortRecord`)."""
    ago = max((now or time.time()) - record.since, 0.0)
    line = f"{component}: running short, ranks {record.ranks} lost {ago:.0f}s ago"
    if record.ready:
        return line + f"; replacements of {record.ready} ready, waiting for the job to admit them"
    return line + "; their replacements are starting"


def node_count(info) -> int:
    """Nodes a reservation uses (a node may hold several of its groups)."""
    return len({s.node_rank for s in info.slots})


def render_reservations(infos) -> str:
    """One line per reservation."""
    if not infos:
        return "no reservations"
    rows = [["JOB", "STATE", "EPOCH", "NODES", "ACCEL", "COMPONENTS", "REASON"]]
    for i in infos:
        comps = ",".join(f"{n}x{w}" for n, w in i.components.items())
        rows.append(
            [
                i.job,
                i.state,
                str(i.epoch),
                str(node_count(i)),
                str(i.num_accelerators),
                comps,
                i.reason[:60],
            ]
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def render_apply(summary) -> str:
    """What an apply did (or would do, with ``--plan``), one line per component."""
    verb = "applied" if summary.applied else "would apply"
    head = f"{summary.job}: {verb}, epoch {summary.epoch}"
    if summary.note:
        return f"{head}: {summary.note}"
    out = [
        f"{head}; slots: {summary.slots_kept} kept, {summary.slots_created} made, "
        f"{summary.slots_removed} removed"
        + (
            f" (rebuilt on node ranks {format_ranks(summary.rebuilt_nodes)})"
            if summary.rebuilt_nodes
            else ""
        )
    ]
    for c in summary.components:
        parts = [
            f"{what} {format_ranks(ranks)}"
            for what, ranks in (
                ("stay", c.stays),
                ("move", c.moves),
                ("start", c.starts),
                ("stop", c.stops),
            )
            if ranks
        ]
        line = f"  {c.name}: {c.old_world_size} -> {c.new_world_size} ranks; " + ", ".join(parts)
        if c.restart:
            line += f"; needs a new process group ({c.restart})"
        out.append(line)
    return "\n".join(out)
