"""Asynchronous DCP checkpoints, written by one replica group, trusted only when complete.

Layout of ``<checkpoint.dir>/<job>/run-<id>/step-<N>/`` (``trainer.checkpoint.files``):

* DCP files (``__<rank>_0.distcp``, ``.metadata``): parameters and optimizer state,
  as DTensors, so a load into another (dp_shard, tp, pp) layout reshards, and the
  persistent buffers' committed values (``buffers.<name>``; checkpoints saved before
  buffers were kept have none, and load without them);
* ``train_state.json``: step, tokens, LR schedule, torchft counters (no pickle);
* ``COMPLETE.json``: the completion marker (step, layout, model hash, time, every
  file with its size and SHA-256), written atomically only after the save has
  finished and, under a daemon, once its etcd lease is confirmed after the step
  (``trainer.checkpoint.lease_fence``: a cut-off node's save never becomes a checkpoint).
  Rank 0 computes the checksums in a background thread once the files are
  written, and applies retention there too: neither is on the training path.

Only the lowest-id participating group writes (torchft orders the quorum by
replica id). Saves are asynchronous: DCP copies the state in a background
thread (training waits for that copy only before it next changes a parameter)
and writes it in another; the save's collectives use a dedicated Gloo group so
they never interleave with training's. At most one save is in flight; a save
that falls due while the previous one runs is skipped and counted.

Loading (``trainer.checkpoint.resume``: every group loads the same checkpoint)
trusts nothing without a marker, checks every listed file's size and checksum,
and refuses pickled data: DCP metadata is read with an allow-list unpickler and any
non-tensor item in a checkpoint is an error: nothing is ever unpickled in full.
"""

from __future__ import annotations

import contextvars
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from trainer import logs
from trainer.chaos import Chaos, completes_late
from trainer.checkpoint.files import (
    MARKER,
    NO_MARKER,
    PREFIX,
    SCALARS,
    Candidate,
    describe_files,
    fsync_dir,
    problem,
    retain,
    write_json_atomic,
)
from trainer.checkpoint.lease_fence import Confirmation, LeaseFence
from trainer.checkpoint.pending import PendingSave
from trainer.checkpoint.space import INTERRUPTS, describe, no_room
from trainer.config import CheckpointConfig
from trainer.contracts import rank_events as events
from trainer.ft.replication import Checkpointing
from trainer.ft.state import TrainState, local
from trainer.metrics import TrainMetrics
from trainer.parallel.group_ops import on_every_rank


class Checkpointer:
    def __init__(
        self,
        cfg: CheckpointConfig,
        root: Path,
        state: TrainState,
        replication: Checkpointing,
        metrics: TrainMetrics,
        model_hash: str,
        layout: dict[str, int],
        rank: int,
        chaos: Chaos | None = None,
        fence: LeaseFence | None = None,
    ) -> None:
        self.cfg = cfg
        self.root = root
        self.state = state
        self.replication = replication
        self.metrics = metrics
        self.model_hash = model_hash
        self.layout = layout
        self.rank = rank
        self.chaos = chaos
        self.fence = fence
        self.log = logs.get()
        self.distributed = dist.is_initialized()
        # Background saves run collectives from another thread: give them their own group.
        self.pg = dist.new_group(backend="gloo") if self.distributed else None
        # One stager per save (_write): torch 2.11's async_save closes the stager it is given
        # once the upload is done, which empties its copy table, and the next save's staging
        # then failed with KeyError (<class 'type'>) on an H200.
        self.stager: DefaultStager | None = None
        self.staging: Future[None] | None = None
        self.upload: Future[Any] | None = None
        self.pending: PendingSave | None = None
        self.skipped = 0
        self.last_saved: int | None = None
        # Rank 0: checksums of written files, then retention, off the training thread.
        self.hasher = ThreadPoolExecutor(1, "checkpoint_files") if rank == 0 else None
        self.hashing: Future[dict[str, Any]] | None = None
        self.trusted: set[Path] = set()  # valid checkpoint paths (used by the hasher only)
        self.reported: set[Path] = set()
        # The directory of the newest save started, set before it is created: retention (in
        # the hasher thread) may find it without its marker while it is still being written.
        self.started_path: Path | None = None
        # Bytes a checkpoint needs on the volume: the last save's, or until one is known an
        # estimate from this rank's tensors times the ranks writing (rank 0 checks the room).
        self.needed: int | None = self._estimate()
        if rank == 0:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as e:  # each save says so again; training goes on
                self._failed(0, f"{self.root}: {e.strerror or e}")

    def note(self, level: str, event: str, **fields: Any) -> None:
        """Group-wide facts (skipped, invalid, loaded) are reported once, by rank 0."""
        if self.rank == 0:
            getattr(self.log, level)(event, **fields)

    def _estimate(self) -> int:
        mine = sum(
            local(t).numel() * t.element_size()
            for group in self.tensors().values()
            for value in group.values()
            for t in (value.values() if isinstance(value, dict) else [value])
            if isinstance(t, torch.Tensor)
        )
        return mine * (dist.get_world_size(self.pg) if self.distributed else 1)

    def tensors(self) -> dict[str, Any]:
        held = {
            "model": dict(self.state.params),
            "optimizer": self.state.optimizer_tensors(),
            "buffers": dict(self.state.buffers.committed),
        }
        if self.state.outer is not None:  # diloco: the outer momentum (saved at a round's end)
            held["outer"] = self.state.outer.tensors()
            synced = self.state.outer.synced_tensors()  # streaming: they differ from the live
            if synced:
                held["synced"] = synced
        return held

    # -- saving

    def due(self, step: int) -> bool:
        """Whether committing `step` starts a save (every checkpoint.interval_steps)."""
        interval = self.cfg.interval_steps
        return bool(interval) and step % interval == 0

    def after_commit(self, step: int) -> None:
        """Called after every committed step: finish a done save, start a due one."""
        self.poll()
        if self.due(step):
            self.save(step)

    def agree(self, mine: bool) -> bool:
        """Every rank of the group must take the same decision (a save is collective)."""
        return on_every_rank([mine])[0]

    def save(self, step: int, final: bool = False) -> None:
        """Start a save of the live state at `step` (the writer group only; collective in the
        group). Any failure (DCP's CheckpointException included, a BaseException) is a
        checkpoint_failed event and a metric, never a crash: training goes on, the partial
        files are removed and the next interval tries again."""
        if not self.replication.is_writer():
            return
        if not final and not self.agree(self.upload is None or self.upload.done()):
            self.skipped += 1
            self.metrics.observe_checkpoint_skipped()
            self.note(
                "warning",
                "checkpoint_skipped",
                step=step,
                reason="the previous save is still running",
                skipped=self.skipped,
            )
            return
        self.finish(block=True)  # the previous save is done (or, for the final save, waited for)
        if final and self.agree(self.last_saved == step):
            return  # on disk already (saved by every rank, or loaded from there)
        path = self.root / f"{PREFIX}{step}"
        if not self.agree(self.rank != 0 or not self._complete(step, path)):  # rank 0 decides
            # Never replaced: written by the groups that went on (a fenced minority back
            # after the end must not overwrite the job's history) or by ourselves before.
            self.note("info", "checkpoint_exists", step=step, path=str(path))
            return
        started, self.started_path = time.monotonic(), path
        problem_here = self._prepare(path) if self.rank == 0 else None
        # Also the barrier of old: nobody writes before rank 0 has prepared the directory.
        if not self.agree(problem_here is None):
            self._failed(step, problem_here or "rank 0 could not prepare the directory", path)
            return
        try:
            self._write(path)
        except BaseException as e:  # DCP raises on every rank when any rank's write fails
            if isinstance(e, INTERRUPTS):
                raise
            self.upload = self.staging = self.hashing = None
            self._failed(step, describe(e, self.root, self.needed), path)
            return
        chaos = self.chaos if self.cfg.async_save else None
        if chaos is not None and chaos.at("checkpoint", step) and self.upload is not None:
            self.upload = completes_late(self.upload, chaos.sleep_s)  # PHALANX_CHAOS slow
        blocked = time.monotonic() - started
        stamp = self.fence.stamp() if self.fence is not None and self.rank == 0 else None
        self.pending = PendingSave(step, path, started, blocked, stamp)
        if not self.cfg.async_save:
            self.finish(block=True)

    def _complete(self, step: int, path: Path) -> bool:
        """Rank 0: a complete, valid checkpoint of this step is on disk already."""
        return (path / MARKER).is_file() and problem(Candidate(step, path), self.model_hash) is None

    def _prepare(self, path: Path) -> str | None:
        """Rank 0: a fresh directory with the scalars in it; what went wrong, or None."""
        try:
            # Leftovers of an earlier attempt at this step (a save killed mid-way) go first.
            shutil.rmtree(path, ignore_errors=True)
            # Rather than fill the volume (and fail half-way): skip, and say why.
            full = no_room(self.root, self.needed)
            if full is not None:
                return full + "; the save was not started"
            path.mkdir(parents=True)
            scalars = {**self.state.scalars(), "torchft": self.replication.ft_state()}
            write_json_atomic(path / SCALARS, scalars)
        except OSError as e:
            return f"{path}: {e.strerror or e}"
        return None

    def _failed(self, step: int, error: str, partial: Path | None = None) -> None:
        """Counted, said once for the group; rank 0 removes what the save had written (the
        last complete checkpoint is untouched, and the space goes back to the volume)."""
        self.metrics.observe_checkpoint_failure()
        self.note("error", events.CHECKPOINT_FAILED, step=step, error=error)
        if partial is not None and self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)

    def _write(self, path: Path) -> None:
        """Hand the state to DCP: asynchronously (upload pending) or at once."""
        writer = FileSystemWriter(str(path), sync_files=True)
        if self.cfg.async_save:
            if self.stager is not None:
                self.stager.close()  # its save is finished: save() waited for it
            self.stager = DefaultStager(StagingOptions(False, False, True, False))
            response = async_save(
                self.tensors(),
                storage_writer=writer,
                process_group=self.pg,
                async_stager=self.stager,
            )
            if isinstance(response, Future):
                self.upload, self.staging = response, None
            else:
                self.upload, self.staging = response.upload_completion, response.staging_completion
            if self.hasher is not None:
                self.hashing = self.hasher.submit(_describe_once_written, self.upload, path)
        else:
            dcp_save(self.tensors(), storage_writer=writer, process_group=self.pg)
            self.upload, self.staging = None, None

    def wait_staged(self) -> None:
        """Block until the background copy of the state is done (before anything mutates it)."""
        if self.staging is not None:
            started, staging, self.staging = time.monotonic(), self.staging, None
            try:
                staging.result()
            except BaseException as e:  # a failed save, never a crashed rank: finish() says so
                if isinstance(e, INTERRUPTS) or self.pending is None:
                    raise
                self.pending.error = e
            if self.pending is not None:
                self.pending.blocked += time.monotonic() - started

    def poll(self) -> None:
        self.finish(block=False)

    def finish(self, block: bool) -> None:
        """If the pending save has finished (or block): write its marker and apply retention."""
        if self.pending is None:
            return
        busy = [f for f in (self.upload, self.hashing) if f is not None and not f.done()]
        if busy and not block:
            return
        pending, self.pending = self.pending, None
        hashing, self.hashing = self.hashing, None
        path = pending.path
        try:
            self.wait_staged()
            if pending.error is not None:
                raise pending.error
            if self.upload is not None:
                self.upload.result()
            if self.rank == 0 and pending.files is None:  # a sync save: written just now
                pending.files = hashing.result() if hashing else describe_files(path)
        except BaseException as e:
            if isinstance(e, INTERRUPTS):
                raise
            self._failed(pending.step, describe(e, self.root, self.needed), path)
            return
        finally:
            self.upload = None
        if not self._fence_allows(pending, block):
            return
        total = time.monotonic() - pending.started
        if self.rank == 0:
            files = pending.files or {}
            marker = {
                "step": pending.step,
                "layout": self.layout,
                "model_hash": self.model_hash,
                "time": time.time(),
                "files": files,
                "seconds_blocked": round(pending.blocked, 4),
                "seconds_total": round(total, 4),
            }
            try:
                write_json_atomic(path / MARKER, marker)
                fsync_dir(self.root)  # the run directory's new step-<N> entry, too
            except OSError as e:
                self._failed(pending.step, f"{path / MARKER}: {e.strerror or e}", path)
                return
            self.needed = sum(f["size"] for f in files.values())
            self.log.info(
                events.CHECKPOINT_SAVED,
                step=pending.step,
                path=str(path),
                seconds_blocked=round(pending.blocked, 4),
                seconds_total=round(total, 4),
                bytes=sum(f["size"] for f in files.values()),
            )
            assert self.hasher is not None
            # With this thread's log context (job, node, group, rank) on its events.
            self.hasher.submit(contextvars.copy_context().run, self._retain, path)
        self.last_saved = pending.step  # only now: a failed save leaves it where it was
        self.metrics.observe_checkpoint(pending.step, pending.blocked, total)

    def _retain(self, written: Path) -> None:
        """Retention, in the hasher thread: counts valid checkpoints only (checkpoint_files)."""
        try:
            self.trusted.add(written)  # its checksums were taken from the files on disk
            result = retain(self.root, self.cfg.keep, self.model_hash, self.trusted)
        except Exception as e:  # never kills the thread; the next save tries again
            self.log.error("checkpoint_retention_failed", error=f"{type(e).__name__}: {e}")
            return
        if result.removed:
            self.log.info("checkpoint_retained", removed=[p.name for p in result.removed])
        for path, why in result.suspicious.items():
            # Read after the scan: a save started before the scan is named here by now, or
            # has finished since (its marker is there; the next save took the name).
            writing = path == self.started_path or (why == NO_MARKER and (path / MARKER).is_file())
            if path not in self.reported and not writing:
                self.reported.add(path)
                self.log.warning(
                    events.CHECKPOINT_INVALID, path=str(path), reason=why, deleted=False
                )

    def _fence_allows(self, pending: PendingSave, block: bool) -> bool:
        """The marker waits for the lease to be confirmed after the step (trainer.checkpoint.lease_fence)."""
        stamp = pending.stamp
        if self.fence is None or stamp is None:
            return True
        verdict = self.fence.wait(stamp) if block else self.fence.verdict(stamp)
        if verdict == Confirmation.WAIT and not block:
            self.pending = pending  # the files are written; only the marker waits
            return False
        if verdict != Confirmation.OK:
            self.metrics.observe_checkpoint_failure()
            why = (
                "the lease changed"
                if verdict == Confirmation.LOST
                else "the lease was not confirmed"
            )
            self.log.error("checkpoint_fenced", step=pending.step, reason=why)
        return verdict == Confirmation.OK

    def close(self) -> None:
        self.finish(block=True)
        if self.hasher is not None:
            self.hasher.shutdown(wait=True)  # the last retention
        if self.stager is not None:
            self.stager.close()


def _describe_once_written(upload: Future[Any] | None, path: Path) -> dict[str, Any]:
    """The files of a save with their sizes and checksums, once DCP has written them all
    (rank 0's upload completes after every rank's files and the metadata are written)."""
    if upload is not None:
        upload.result()
    return describe_files(path)
