"""The lighthouse address etcd publishes, followed for this node's ranks.

The ranks dial the node's forwarder (``TORCHFT_LIGHTHOUSE``), which points at the
address the leader published; when it moves, and when the leader announces quorum
members its lighthouse lost or a group's daemon announces its failure, the ranks are
told at once (rank_notice.py). Part of the etcd upkeep (upkeep.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from daemon.coordination import JobView
from daemon.leadership import Forwarder, parse_address
from daemon.supervision.rank_notice import RankNotice
from trainer import logs
from trainer.contracts import notice_file


class LighthouseFollow:
    def __init__(self, proxy_port: int, run_dir: Path, secret: Callable[[], bytes]) -> None:
        self.forwarder = Forwarder(port=proxy_port)
        self.notice = RankNotice(run_dir / notice_file.NAME)  # the ranks told at once
        self.address: str | None = None  # the address etcd published, last followed
        self._secret = secret  # the job's, for the forwarder's handshake
        self._bad: object = None  # the malformed value last reported
        self.log = logs.get()

    @property
    def ranks_url(self) -> str | None:
        """The ranks' TORCHFT_LIGHTHOUSE once the forwarder has a target, else None."""
        return self.forwarder.url if self.forwarder.target is not None else None

    def follow(self, job: JobView) -> None:
        """One round's job view: its lighthouse address, lost members and failed groups."""
        self._point(job.lighthouse)
        self.notice.follow_lost(job.lost, job.lighthouse)
        self.notice.follow_failed(job.failed, job.lighthouse)

    def _point(self, address: str | None) -> None:
        """Point the forwarder at the published address; a key briefly absent during a
        leader change keeps the old target, and a malformed value is reported and ignored."""
        if not address:
            return
        if parse_address(address) is None:
            if address != self._bad:
                self.log.error("lighthouse_address_invalid", value=str(address)[:200])
                self._bad = address
            return
        moved = self.address is not None and self.address != address
        self.address = address
        self.forwarder.set_target(address, self._secret())
        if moved:  # the ranks abandon a step that may wait on the old leader's group
            self.notice.tell(address, "a new leader published it")

    def close(self) -> None:
        self.forwarder.close()
