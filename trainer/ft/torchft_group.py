"""One ``torchft.Manager`` per replica group: the :class:`~trainer.ft.replication.Replication`
of a fault-tolerant job.

* a reconfigurable torchft process group (Gloo on CPU, NCCL on CUDA) links rank r of
  every participating group;
* gradients are averaged across groups through a ``ManagedProcessGroup``, either from
  FSDP2's all-reduce hook (called on each reduce-scatter output, i.e. on the already
  sharded gradient) or, for a group without sharding, by one bucketed all-reduce after
  backward;
* ``should_commit`` gates the optimizer step, so a step that lost a peer mid-all-reduce
  is discarded everywhere and retried by the survivors;
* live healing: a group whose step is behind receives :class:`TrainState` from a peer
  through :class:`~trainer.ft.transport.SnapshotTransport`. The healing group joins the
  step's gradient exchange (with zeros) as soon as its process group is configured,
  while the state still arrives: the survivors' step does not wait for the transfer,
  and the heal is applied before the healing group's optimizer step (should_commit).

Everything that touches torchft's private internals (the quorum id, the healing flag,
the quorum's members, the rendezvous prefix, the transport's loader) goes through
:mod:`trainer.ft.torchft_adapter`, which checks it all at startup.

``torchft.DistributedDataParallel`` is deliberately not used: in torchft 0.2.0 its comm
hook asserts when a peer dies during the all-reduce and takes the surviving group down
with it. The paths here report the error to the manager instead.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from concurrent.futures import wait
from functools import partial
from typing import Any

import torch
from torch.distributed import AllreduceOptions, ReduceOp
from torch.distributed.fsdp import FSDPModule

from trainer import logs
from trainer.chaos import Chaos
from trainer.config import FaultToleranceConfig
from trainer.config.env import RankEnv
from trainer.contracts import rank_events as events
from trainer.contracts.heartbeat import Heartbeat
from trainer.data.shares import Quorum
from trainer.ft import torchft_adapter as ft
from trainer.ft.grad_buckets import Reduce, buckets, reduce_options
from trainer.ft.manager_build import build_manager, managed_process_group
from trainer.ft.notice import Told
from trainer.ft.quorum_watch import QuorumWatch
from trainer.ft.replication import DRAIN_QUORUM_WAIT_S, NonFiniteStep, leave_unless_formed
from trainer.ft.state import TrainState
from trainer.ft.step_notices import StepNotices


class LighthouseMoved(RuntimeError):
    """The step was abandoned: the daemon said the lighthouse moved, or lost a member of
    this step's quorum, while it waited."""


def membership_token(replica_ids: Iterable[str], *, step: int) -> str:
    """A short name for a quorum's exact members and its members' `step` (max_step).

    A replica id names a group and its daemon (a restarted rank keeps its predecessor's,
    see :func:`~trainer.ft.torchft_adapter.replica_uuid`), so the ids alone repeat after a
    restart; the quorum id tells such quorums apart until a lighthouse restart numbers
    from 1 again, and the step then still does."""
    names = "\n".join(sorted(replica_ids))
    return hashlib.sha256(f"{names}\n@{step}".encode()).hexdigest()[:16]


class TorchFTGroup:
    def __init__(
        self,
        cfg: FaultToleranceConfig,
        env: RankEnv,
        device: torch.device,
        state: TrainState,
        chaos: Chaos,
        stop_requested: Callable[[], bool] = lambda: False,
        beat: Heartbeat | None = None,
    ) -> None:
        ft.check_torchft()
        self.beat = beat or Heartbeat(None)
        self.state = state
        self.chaos = chaos
        self.device = device
        self.log = logs.get()
        self._step_started = time.monotonic()
        self.manager, pg, self.transport = build_manager(
            cfg, env, device, self._load_healing, self._send_healing
        )
        self.pg = pg  # configured by each quorum for this rank's peers in every group
        self.recorder = recorder = ft.record_quorums(self.manager)
        # Each quorum's id into the heartbeat; a quorum that waited out the join timeout said.
        self.quorum_watch = QuorumWatch(self.beat, env.join_timeout_ms)
        recorder.observer = self.quorum_watch.observe
        pg.membership = lambda: (
            membership_token(recorder.replica_ids, step=recorder.max_step)
            if recorder.replica_ids is not None
            else "0"
        )
        self.managed_pg = managed_process_group(self.manager)
        # Whether this group was the writer in the quorum of its last committed step; a
        # drain that leaves a step's quorum unformed must not wait on it to ask.
        self._writer: bool | None = None
        self.stop_requested = stop_requested
        self._heal_seconds: list[float] = []  # see take_heals
        self._waited_s = 0.0  # see take_waited
        self._quorum_s = 0.0  # see take_quorum_wait
        self._last_quorum: Quorum | None = None
        self._next: Quorum | None = None  # see last_quorum
        self._timeout_s = cfg.timeout_s
        # The daemon's word that the lighthouse moved or lost members of our quorum.
        self.notices = StepNotices(env.notice, self._members)
        pg.interrupter = self.notices.build_watch  # a notice also ends a stuck configure

    def _send_healing(self) -> dict[str, Any]:
        """torchft's read of this group's state for a peer that heals from it."""
        self.beat.enter("heal")
        return self.state.healing_state_dict()

    def _load_healing(self, state_dict: dict[str, Any]) -> None:
        """torchft's load of a peer's state: apply it, then say how long the heal took."""
        self.beat.enter("heal")
        load_seconds = self.state.load_healing_state_dict(state_dict)
        seconds = time.monotonic() - self._step_started
        self.log.info(
            events.HEAL_DONE,
            step=self.state.step,
            seconds=round(seconds, 3),
            load_seconds=round(load_seconds, 3),
        )
        self._heal_seconds.append(seconds)

    def take_heals(self) -> list[float]:
        heals, self._heal_seconds = self._heal_seconds, []
        return heals

    def take_join_timeouts(self) -> int:
        return self.quorum_watch.take_join_timeouts()

    def start_step(self) -> None:
        self._step_started = time.monotonic()
        self.transport.close()  # a copy served to a healer in the last step
        self.notices.between_steps()
        began = time.monotonic()
        self.manager.start_quorum()  # a synchronous quorum forms (and heals) here
        self._quorum_s += time.monotonic() - began

    def _members(self) -> tuple[int, list[str]] | None:
        last = self.recorder.last
        return None if last is None else (int(last.quorum_id), [str(r) for r in last.replica_ids])

    def _wait(self, work: Any) -> bool:
        """`work.wait()`, unless the daemon says the lighthouse moved (or lost a member of
        this quorum) while the collective is still running: then the step is abandoned at
        once (its peers may be a cut-off group that would hold it for ``ft.timeout_s``),
        see :mod:`trainer.ft.notice`.
        False when abandoned; after that, every other collective of the step is too (a
        bucket issued before on the same process group would wait out its timeout)."""
        began = time.monotonic()
        done, told = self.notices.wait(work, ft.pending_work(work))
        self._waited_s += time.monotonic() - began
        if told is not None:
            self._abandon(told)
        return done

    def _abandon(self, told: Told) -> None:
        self.notices.told(told, abandoned=True, step=self.current_step())
        self.manager.report_error(LighthouseMoved(f"the step was abandoned: {told.reason}"))
        if self.device.type == "cuda":
            self.pg.abort()  # NCCL's abort ends the stuck collective
        else:  # gloo's would wait for it: the next quorum builds a new one beside it
            ft.bury_process_group(self.pg, keep_s=2 * self._timeout_s)

    def current_step(self) -> int:
        return int(self.manager.current_step())

    def participants(self) -> int:
        return int(self.manager.num_participants())

    def quorum(self) -> Quorum:
        """This step's quorum as the data contract needs it (waits for it to form; a SIGTERM
        meanwhile leaves the step if it does not form soon, see _quorum_or_drain). A group
        that heals in it knows as soon as its process group is ready: it takes no share.
        A wait for a quorum not yet formed is the heartbeat's ``quorum`` phase: torchft's
        quorum timeout bounds it, not the learned step time."""
        future = ft.quorum_future(self.manager)
        if future is not None and not future.done():
            self.beat.enter("quorum")
            began = time.monotonic()
            try:
                return self._quorum()
            finally:
                waited = time.monotonic() - began
                self._waited_s += waited
                self._quorum_s += waited
                self.beat.enter("step")
        return self._quorum()

    def take_waited(self) -> float:
        waited, self._waited_s = self._waited_s, 0.0
        return waited

    def take_quorum_wait(self) -> float:
        waited, self._quorum_s = self._quorum_s, 0.0
        return waited

    def _quorum(self) -> Quorum:
        if self._quorum_or_drain():
            last = self.recorder.last  # this step's: the healing flag is set after it
            self._last_quorum = Quorum(max(1, int(last.max_world_size)), None)
            return self._last_quorum
        participants = max(1, int(self.manager.num_participants()))
        rank = self.manager.participating_rank() if self.manager.is_participating() else None
        self._last_quorum = Quorum(participants, None if rank is None else int(rank))
        return self._last_quorum

    def last_quorum(self) -> Quorum | None:
        """This step's likely quorum, before it forms: the previous step's if that step
        committed with every member taking part, or this group alone if a two-group
        step failed because the other group did (a replacement joins healing and takes
        no share). None otherwise: one heals or joins, and guessing would waste a forward."""
        return self._next

    def quorum_id(self) -> int | None:
        return ft.quorum_id(self.manager)

    def is_writer(self) -> bool:
        """True for the lowest-id group among the up-to-date participants of the quorum
        of the last committed step (of this step's quorum before any commit)."""
        if self._writer is None:
            return bool(self.manager.participating_rank() == 0)
        return self._writer

    def fresh_start(self) -> bool:
        """After this step's quorum: no participant has committed a step (every group is new)."""
        if self._heals_now():
            return False  # a peer has committed: this group heals from it
        self.manager.wait_quorum()
        return not ft.is_healing(self.manager) and int(self.manager.current_step()) == 0

    def ft_state(self) -> dict[str, int]:
        return dict(self.manager.state_dict())

    def restore(self, step: int, ft_state: dict[str, int]) -> None:
        self.manager.load_state_dict(
            {"step": step, "batches_committed": ft_state.get("batches_committed", 0)}
        )
        self.state.step = step

    def _started(self, exchange: Callable[[torch.Tensor], object], flat: torch.Tensor) -> object:
        """`exchange(flat)`, or None with the error reported to the manager (the step fails)."""
        try:
            return exchange(flat)
        except Exception as e:  # torchft's managed all-reduce reports its own
            self.manager.report_error(e)
            return None

    def _healing_allreduce(self, tensor: torch.Tensor, op: Reduce = "avg") -> object:
        """This healing group's part of an all-reduce (zeros: it contributes nothing),
        straight on the process group its quorum configured; summed, not averaged."""
        tensor.zero_()
        return self.pg.allreduce([tensor], reduce_options(op, healing=True))

    def _allreduce(self, tensor: torch.Tensor, op: Reduce = "avg") -> object:
        return self.managed_pg.allreduce([tensor], reduce_options(op))

    def hook_fsdp(self, modules: Iterable[torch.nn.Module]) -> None:
        def hook(output: torch.Tensor) -> None:
            self._quorum_or_drain()
            work = self._allreduce(output)
            self.chaos.at("allreduce")
            self._wait(work)

        for module in modules:
            if isinstance(module, FSDPModule):
                module.set_all_reduce_hook(hook)

    def sync_gradients(self, grads: list[torch.Tensor], op: Reduce = "avg") -> bool:
        """Average (or `op`) unsharded gradients across groups, one flat all-reduce per
        bucket; True if the tensors now hold the participating groups' average (False when
        this group only heals in this step or the exchange failed). A failed exchange
        leaves the tensors as they were (this rank's own gradients, Loop._forward_backward).

        A group that heals in this step sends zeros as soon as its process group is ready,
        while the peer's state still arrives, and keeps the average for its optimizer step
        after the heal; torchft's managed all-reduce would first wait for the state."""
        early = self._quorum_or_drain()
        exchange = partial(self._healing_allreduce if early else self._allreduce, op=op)
        pending = []
        for bucket in buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            pending.append((bucket, flat, self._started(exchange, flat)))
        self.chaos.at("allreduce")
        for _, _, work in pending:
            try:
                if work is not None:
                    self._wait(work)
            except Exception as e:  # a raw process group's failure (the healing exchange)
                self.manager.report_error(e)
        if self.manager.errored() is not None:
            return False
        if early and op == "avg":
            participants = max(1, int(self.recorder.last.max_world_size))
            for _, flat, _ in pending:
                flat /= participants  # as torchft's managed all-reduce averages
        for bucket, flat, _ in pending:
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        return self.manager.errored() is None and bool(self.manager.is_participating())

    def should_commit(self, vote: bool = True) -> bool:
        """Commit the step unless any rank of any participating group failed it; `vote`
        False fails it here (torchft skips the step and reconfigures next quorum)."""
        if not vote:
            self.manager.report_error(NonFiniteStep(f"step {self.current_step()} is not finite"))
        committed = bool(self.manager.should_commit())
        if committed:
            self.state.step = self.current_step()
            self._writer = bool(self.manager.participating_rank() == 0)  # quorum formed
        self._next = self._likely_next(vote, committed)
        return committed

    def _likely_next(self, vote: bool, committed: bool) -> Quorum | None:
        """The next step's quorum, when this step's says it (see last_quorum)."""
        members, quorum = self.recorder.replica_ids, self._last_quorum
        if quorum is None or members is None or len(members) != quorum.participants:
            return None  # a member healed in this step: the next quorum differs
        if committed:
            return quorum
        lost_peer = vote and quorum.participants == 2 and self.manager.errored() is not None
        return Quorum(1, 0) if lost_peer and quorum.rank is not None else None

    def quorum_settles(self, seconds: float) -> bool:
        """Wait up to `seconds` for this step's quorum; True if it formed (not pending or failed)."""
        future = ft.quorum_future(self.manager)
        if future is None:
            return True
        done, _ = wait([future], timeout=seconds)
        return bool(done) and future.exception() is None

    def across_groups(self, values: list[int]) -> tuple[list[int], list[int]]:
        """Element-wise min and max of `values` over every group of this step's quorum.

        Collective: this rank's peers (same rank) in every group call it in the same step.
        """
        self.manager.wait_quorum()
        out: list[list[int]] = []
        for op in (ReduceOp.MIN, ReduceOp.MAX):
            t = torch.tensor(values, dtype=torch.int64, device=self.device)
            opts = AllreduceOptions()
            opts.reduceOp = op  # type: ignore[assignment]
            if not self._wait(self.pg.allreduce([t], opts)):
                raise LighthouseMoved("the lighthouse moved during a check across groups")
            out.append([int(v) for v in t.cpu().tolist()])
        return out[0], out[1]

    def quorum_step(self) -> int:
        """The step of this step's up-to-date groups (a healing group is behind it)."""
        self.manager.wait_quorum()
        last = self.recorder.last
        return int(last.max_step) if last is not None else self.current_step()

    def average_across_groups(self, t: torch.Tensor) -> torch.Tensor | None:
        """`t` averaged over the participating groups through the managed all-reduce, like
        gradients; None when this group only heals in this step or the exchange failed."""
        self._wait(self._allreduce(t))
        if self.manager.errored() is not None or not self.manager.is_participating():
            return None
        return t

    def _heals_now(self) -> bool:
        """Whether this step's quorum says this group heals, its process group is configured
        for that quorum and the peer's state is still on its way (torchft sets the healing
        flag after configuring the process group, before it fetches the state)."""
        future = ft.quorum_future(self.manager)
        return future is not None and not future.done() and ft.is_healing(self.manager)

    def _quorum_or_drain(self) -> bool:
        """Wait for this step's quorum before the first all-reduce across groups; a
        SIGTERM during that wait leaves the step if the quorum does not form soon. True
        when it stopped waiting because this group heals (see _heals_now)."""
        future = ft.quorum_future(self.manager)
        while future is not None and not future.done():
            if self._heals_now():
                return True
            if self.stop_requested():
                leave_unless_formed(self.quorum_settles(DRAIN_QUORUM_WAIT_S))
                return False
            wait([future], timeout=0.01)  # the healing flag comes before the future ends
        return False

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)
