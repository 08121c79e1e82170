"""Where a node's time goes: each second attributed to one activity (goodput and its
badput by cause), kept as a value that the node's state and its ranks' events advance."""

from __future__ import annotations

from daemon.accounting.activities import ORDER, Activity
from daemon.accounting.incidents import Action, Incident, IncidentLog, Kind
from daemon.accounting.ledger import Ledger, goodput, time_document

__all__ = [
    "ORDER",
    "Action",
    "Activity",
    "Incident",
    "IncidentLog",
    "Kind",
    "Ledger",
    "goodput",
    "time_document",
]
