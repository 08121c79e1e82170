"""`phalanx status`: the job as etcd sees it, as a table or JSON: its nodes, groups, leader
and step, its goodput (from the time each node's progress carries) and its incidents
(the job's incident record, ``daemon.coordination.incident_store``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from daemon.accounting import Incident
from daemon.coordination.coordinator import JobView

SHOWN = 5  # incidents the table shows (--incidents: all)


def status_json(job: str, view: JobView, incidents: Sequence[Incident] = ()) -> dict[str, Any]:
    nodes = [
        {
            "id": node_id,
            "group": record.get("group"),
            "state": record.get("state"),
            "pid": record.get("pid"),
            "step": record.get("step"),
            "host": record.get("host"),
            "http_port": record.get("http_port"),
            "participants": record.get("participants"),
            "leader": node_id == view.leader,
            "node_rank": record.get("node_rank"),
            "generation": record.get("generation"),
            "waiting_for": record.get("waiting_for"),
            "spare": record.get("spare") is True,  # claims a seat when one frees
            "health": _failing_checks(record.get("health")),
        }
        for node_id, record in sorted(view.nodes.items())
    ]
    steps = [n["step"] for n in nodes if isinstance(n["step"], int)]
    # How the groups exchange: as the nodes' job file says (only a semi-synchronous one is
    # written in their records).
    told = [r["exchange"] for r in view.nodes.values() if isinstance(r.get("exchange"), dict)]
    state = (view.state or {}).get("state") or ("running" if nodes else None)
    return {
        "job": job,
        "state": state,
        "step": max(steps) if steps else (view.state or {}).get("step"),
        "leader": view.leader,
        "lighthouse": view.lighthouse,
        "exchange": told[0] if told else {"semi_sync_method": "none"},
        "groups": {str(gid): node for gid, node in sorted(view.groups.items())},
        # Groups that span nodes: each one's node ids by node rank, generation and state.
        "seats": {str(g): {str(r): n for r, n in held.items()} for g, held in view.seats.items()},
        "generations": {str(gid): n for gid, n in sorted(view.generations.items())},
        "group_states": group_states(view),
        "checkpoint": view.checkpoint,
        "nodes": nodes,
        "warnings": replication_warnings(nodes, len(view.groups), view.state or {}),
        "goodput": job_goodput(list(view.nodes.values())),
        "incidents": [i.shown() for i in incidents],
    }


def job_goodput(records: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """The job's goodput: its live nodes' training seconds over all their seconds (every
    node runs node.nproc ranks, so seconds weigh as accelerator-seconds), since their
    daemons started and over the last hour, as their last progress writes said."""

    def share(field: str) -> float | None:
        training = total = 0.0
        for record in records:
            spent = record.get(field)
            if not isinstance(spent, dict):
                continue
            seconds = {k: float(v) for k, v in spent.items() if isinstance(v, int | float)}
            training += seconds.get("training", 0.0)
            total += sum(seconds.values())
        return round(training / total, 4) if total > 0 else None

    return {"since_start": share("time"), "last_hour": share("time_1h")}


def incidents_table(doc: dict[str, Any], last: int | None = None) -> str:
    """The job's incidents, oldest first (the `last` ones, else all)."""
    shown = doc.get("incidents", [])[-last:] if last else doc.get("incidents", [])
    rows = [("BEGAN (UTC)", "KIND", "NODE", "GROUP", "DETECT_S", "RECOVER_S", "ACTION", "COST")]
    for i in shown:
        began = datetime.fromtimestamp(i["began"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        recover = "-" if i["recovered"] is None else f"{i['recovered'] - i['detected']:.1f}"
        rows.append(
            (
                began,
                i["kind"],
                str(i["node"]),
                "-" if i["group"] is None else str(i["group"]),
                f"{i['detected'] - i['began']:.1f}",
                recover,
                i["action"],
                f"{i['cost_group_s']:.1f} group-s",
            )
        )
    if len(rows) == 1:
        return "(no incidents)"
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _failing_checks(value: object) -> dict[str, str]:
    """A record's failing health checks (name -> reason), read without trusting it."""
    if not isinstance(value, dict):
        return {}
    return {str(k)[:64]: str(v)[:400] for k, v in value.items()}


def group_states(view: JobView) -> dict[str, str]:
    """Each spanning group's state from its seats and its nodes' records: "waiting for
    nodes" (a seat is free), "running" (every node's ranks run its current generation),
    "restarting" (a node is stopping or restarting its ranks), else "forming"."""
    sections = (view.spec or {}).get("sections") or {}
    size = str(sections.get("job.nodes_per_group", ""))
    states = {}
    for gid, held in view.seats.items():
        records = [view.nodes.get(n) or {} for n in held.values()]
        current = view.generations.get(gid)
        if len(held) < (int(size) if size.isdigit() else 2):
            states[str(gid)] = "waiting for nodes"
        elif all(r.get("state") == "running" and r.get("generation") == current for r in records):
            states[str(gid)] = "running"
        elif any(r.get("state") in ("stopping", "restarting") for r in records):
            states[str(gid)] = "restarting"
        else:
            states[str(gid)] = "forming"
    return states


def replication_warnings(
    nodes: list[dict[str, Any]], groups: int, state: dict[str, Any]
) -> list[str]:
    """Where the job trains, or trained, with fewer groups in its quorum than hold slots."""
    warnings = [
        f"node {n['id']} trains in a quorum of {n['participants']} of the {groups} replica "
        "groups holding a slot"
        for n in nodes
        if n["state"] == "running"
        and isinstance(n["participants"], int)
        and n["participants"] < groups
    ]
    largest, most = state.get("largest_quorum"), state.get("groups")
    completed = state.get("state") == "completed"
    if completed and isinstance(largest, int) and isinstance(most, int) and largest < 2 <= most:
        warnings.append(
            f"the job completed unreplicated: node {state.get('node')}'s group never shared "
            f"a quorum with another of the {most} groups that held a slot (never_replicated)"
        )
    return warnings


def status_table(doc: dict[str, Any]) -> str:
    head = (
        f"job {doc['job']}  state {doc['state'] or '-'}  step {doc['step'] if doc['step'] is not None else '-'}  "
        f"leader {doc['leader'] or '-'}  lighthouse {doc['lighthouse'] or '-'}"
    )
    exchange = doc.get("exchange") or {}
    if exchange.get("semi_sync_method", "none") != "none":
        head += (
            f"\nexchange {exchange['semi_sync_method']}: groups sync every "
            f"{exchange.get('sync_steps')} steps"
        )
        if exchange.get("num_fragments"):
            head += f", in {exchange['num_fragments']} fragments synced in turn"
    checkpoint = doc.get("checkpoint")
    if checkpoint:
        head += f"\nlatest checkpoint: step {checkpoint.get('step')} at {checkpoint.get('path')}"
    for warning in doc.get("warnings", []):
        head += f"\nwarning: {warning}"
    good = doc.get("goodput") or {}
    if good.get("since_start") is not None:
        hour = good.get("last_hour")
        head += f"\ngoodput {good['since_start']:.3f} since the daemons started" + (
            f", {hour:.3f} over the last hour" if hour is not None else ""
        )
    for gid, held in doc.get("seats", {}).items():
        generation = doc.get("generations", {}).get(gid, "-")
        state = doc.get("group_states", {}).get(gid, "-")
        nodes = ", ".join(f"{r}={n}" for r, n in sorted(held.items(), key=lambda i: int(i[0])))
        head += f"\ngroup {gid} ({state}, generation {generation}): {nodes}"
    rows = [("NODE", "GROUP", "STATE", "STEP", "PID", "HOST", "")]
    for n in doc["nodes"]:
        rows.append(
            (
                str(n["id"]),
                _group(n),
                str(n["state"] or "-"),
                "-" if n["step"] is None else str(n["step"]),
                str(n["pid"] or "-"),
                f"{n['host']}:{n['http_port']}" if n["host"] else "-",
                "leader" if n["leader"] else "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    if len(rows) == 1:
        lines.append("(no live nodes)")
    lines += [
        f"{n['id']} waits for {n['waiting_for']}" for n in doc["nodes"] if n.get("waiting_for")
    ]
    lines += [
        f"{n['id']} is unhealthy: {name}: {reason}"
        for n in doc["nodes"]
        for name, reason in sorted((n.get("health") or {}).items())
    ]
    if doc.get("incidents"):
        lines += ["", "last incidents (all: phalanx status --incidents):"]
        lines.append(incidents_table(doc, SHOWN))
    return head + "\n" + "\n".join(lines)


def _group(node: dict[str, Any]) -> str:
    """The node's group, and its node rank where groups span nodes: "1.0"."""
    if node["group"] is None:
        return "-"
    rank = node.get("node_rank")
    return f"{node['group']}.{rank}" if isinstance(rank, int) else str(node["group"])


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, default=str)
