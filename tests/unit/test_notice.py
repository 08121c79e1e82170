"""A rank abandons a collective when its daemon says the lighthouse moved (trainer/ft/notice.py)."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import torch
from torch.distributed import AllreduceOptions, TCPStore  # type: ignore[attr-defined]
from torchft.process_group import ProcessGroupGloo

from daemon.supervision.rank_notice import RankNotice
from trainer.contracts.notice_file import write as write_notice
from trainer.ft import torchft_adapter as ft
from trainer.ft.notice import Notice, StepWaits, Told
from trainer.ft.step_notices import StepNotices


def _moved(seq: int, lighthouse: str, reason: str) -> Told:
    return Told(seq, lighthouse, reason)


def test_a_notice_is_news_once_and_what_came_before_the_rank_is_not(tmp_path: Path) -> None:
    path = tmp_path / "notice.json"
    write_notice(path, [_moved(1, "10.0.0.1:1", "before this rank")])
    notice = Notice(path)
    assert notice.changed() is None
    write_notice(path, [_moved(1, "10.0.0.1:1", "before"), _moved(2, "10.0.0.2:2", "moved")])
    told = notice.changed()
    assert told is not None and (told.seq, told.lighthouse, told.moved) == (2, "10.0.0.2:2", True)
    assert notice.changed() is None
    path.write_text("{not json")  # half a file never reads as news
    assert notice.changed() is None
    assert Notice(None).changed() is None


def test_members_lost_concern_only_the_quorum_they_were_lost_from(tmp_path: Path) -> None:
    """The daemon's RankNotice writes what the ranks' StepNotices read. An announcement
    of members lost from quorum 7 concerns a rank still in quorum 7 with one of them, not
    a rank already in quorum 8 (where a replacement took the lost member's replica id);
    a move written behind it is still seen by a rank that reads both at once."""
    path = tmp_path / "notice.json"
    daemon_side = RankNotice(path)
    daemon_side.follow_lost(None, "10.0.0.1:1")  # the first view: nothing is news
    quorums: dict[str, tuple[int, list[str]] | None] = {
        "in": (7, ["g0:a", "g1:b"]),
        "later": (8, ["g0:a", "g1:b"]),
    }
    in_quorum = StepNotices(path, lambda: quorums["in"])
    later = StepNotices(path, lambda: quorums["later"])
    building = later.build_watch()  # quorum 8's build, begun before the announcement

    lost = {"replicas": ["g1:b"], "quorum_id": 7, "lighthouse": "10.0.0.1:1", "at": 1}
    daemon_side.follow_lost(lost, "10.0.0.1:1")
    daemon_side.follow_lost(lost, "10.0.0.1:1")  # the same announcement is told once
    told = in_quorum.notice.changed(in_quorum.concerns)
    assert told is not None and (told.quorum_id, told.replicas) == (7, ("g1:b",))
    assert not told.moved
    assert in_quorum.build_watch()() == told.reason  # a build for quorum 7 gives up
    assert building() is None  # quorum 8's does not
    assert later.notice.changed(later.concerns) is None  # passed over, and seen
    assert later.notice.changed() is None  # ... so not told again
    # An announcement by a lighthouse no longer published concerns nobody.
    daemon_side.follow_lost({**lost, "quorum_id": 9, "lighthouse": "10.0.0.7:1"}, "10.0.0.1:1")
    assert in_quorum.notice.changed() is None
    # A move, then members lost: a rank that reads both at once sees the move, and a
    # build begun before the move gives up.
    daemon_side.tell("10.0.0.2:2", "a new leader published it")
    daemon_side.follow_lost({**lost, "quorum_id": 3, "lighthouse": "10.0.0.2:2"}, "10.0.0.2:2")
    assert building() == "a new leader published it"
    told = later.notice.changed(later.concerns)
    assert told is not None and told.moved and told.lighthouse == "10.0.0.2:2"
    quorums["later"] = None  # before any quorum, only moves concern a rank
    assert not later.concerns(Told(9, "10.0.0.2:2", "lost", 3, ("g1:b",)))


def test_a_collective_whose_peer_never_answers_is_abandoned_on_notice(tmp_path: Path) -> None:
    """Two gloo ranks; rank 1 never joins rank 0's all-reduce (a cut-off group). A notice
    ends rank 0's wait at once, not at the collective's timeout; its process group is set
    aside, and the next configure (alone) goes ahead without waiting on it."""
    store = TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=30), wait_for_workers=False)
    address = f"127.0.0.1:{store.port}"
    timeout = timedelta(seconds=20)
    pgs = [ProcessGroupGloo(timeout=timeout), ProcessGroupGloo(timeout=timeout)]
    threads = [
        threading.Thread(target=pgs[r].configure, args=(f"{address}/q1", f"r{r}", r, 2))
        for r in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    path = tmp_path / "notice.json"
    notice = Notice(path)
    # Two buckets of one step on the group whose peer never answers.
    works = [pgs[0].allreduce([torch.ones(4)], AllreduceOptions()) for _ in range(2)]
    moved = [_moved(1, "10.0.0.9:1", "a new leader published it")]
    threading.Timer(0.3, write_notice, (path, moved)).start()
    waits = StepWaits(notice)
    told = waits.wait(works[0], ft.pending_work(works[0]))
    assert told is not None and told.reason == "a new leader published it"
    assert not ft.pending_work(works[0]).is_completed()  # told while it waits, not timed out
    # The second bucket is abandoned with the step, not waited for to its timeout.
    assert waits.wait(works[1], ft.pending_work(works[1])) is told
    assert not ft.pending_work(works[1]).is_completed()
    waits.new_step()
    assert waits.told is None
    ft.bury_process_group(pgs[0], keep_s=60.0)
    pgs[0].configure(f"{address}/q2", "r0", 0, 1)  # alone now: no abort of the stuck group
    alone = torch.ones(2)
    pgs[0].allreduce([alone], AllreduceOptions()).wait()
    assert alone.tolist() == [1.0, 1.0]
