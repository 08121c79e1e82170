"""Small pure pieces of the trainer: chaos specs, pipeline splits, buckets, LR, digests, state."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torchft.checkpointing.http_transport import HTTPTransport

from trainer.chaos import Chaos, InjectedCrash, Pace, parse, parse_delay, parse_ranks
from trainer.config import TrainConfig, TrainerConfig
from trainer.ft.grad_buckets import buckets
from trainer.ft.state import TrainState
from trainer.ft.torchft_adapter import SafeHTTPTransport
from trainer.optim import build_optimizer, build_scheduler, init_optimizer_state, lr_at
from trainer.parallel.digest import params_sha256
from trainer.parallel.materialize import build_materialized
from trainer.parallel.pipeline import stage_ids
from trainer.workloads.llama.workload import llama_workload, split_layers


def test_chaos_spec() -> None:
    faults = parse("allreduce@5, optimizer@+2:crash,start@0:stop")
    assert [(f.point, f.step, f.action, f.relative) for f in faults] == [
        ("allreduce", 5, "kill", False),
        ("optimizer", 2, "crash", True),
        ("start", 0, "stop", False),
    ]
    for bad in ["nowhere@1", "forward@x", "forward@1:explode", "forward"]:
        with pytest.raises(ValueError, match="PHALANX_CHAOS"):
            parse(bad)


def test_chaos_actions_that_belong_to_some_points_only() -> None:
    faults = parse("gradients@3:nan,resume@0:hide,optimizer@7:perturb,restored@0:perturb")
    assert [f.action for f in faults] == ["nan", "hide", "perturb", "perturb"]
    for bad in ["forward@1:nan", "checkpoint@0:hide", "forward@2:perturb", "resume@0:perturb"]:
        with pytest.raises(ValueError, match="only"):
            parse(bad)
    chaos = Chaos("resume@0:hide,optimizer@7:perturb", delay=0)
    assert chaos.at("resume") is True and chaos.at("optimizer") is False
    chaos.begin_step(7)
    assert chaos.at("optimizer") is True


def test_chaos_ranks_limit_the_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHALANX_CHAOS_RANKS", "1,3")
    assert Chaos("resume@0:hide", delay=0, rank=1).at("resume") is True
    assert Chaos("resume@0:hide", delay=0, rank=2).at("resume") is False
    assert parse_ranks("") is None and parse_ranks("0, 2") == {0, 2}
    with pytest.raises(ValueError, match="PHALANX_CHAOS_RANKS"):
        parse_ranks("1,x")


def test_chaos_relative_steps_count_attempts() -> None:
    chaos = Chaos("forward@+1:crash", delay=0)
    chaos.begin_step(40)
    chaos.at("forward")  # attempt 0: nothing
    chaos.begin_step(40)
    with pytest.raises(InjectedCrash):
        chaos.at("forward")


def test_a_delay_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    pace = tmp_path / "pace"
    pace.write_text("0.05\n")
    delay = Pace(f"@{pace}")
    assert delay.now() == 0.05 and parse_delay(f"@{pace}") == 0.05
    pace.write_text("0\n")
    os.utime(pace, ns=(0, os.stat(pace).st_mtime_ns + 1))  # a new mtime, however coarse the clock
    assert delay.now() == 0.0
    pace.write_text("soon")  # malformed: the last good delay stays
    os.utime(pace, ns=(0, os.stat(pace).st_mtime_ns + 2))
    assert delay.now() == 0.0
    assert Pace("0.25").now() == 0.25 and Pace(None).now() == 0.0
    with pytest.raises(ValueError, match=r"PHALANX_CHAOS_DELAY file .*missing.* cannot be read"):
        parse_delay(f"@{tmp_path / 'missing'}")
    with pytest.raises(ValueError, match="must be a number"):
        parse_delay("@x", "PHALANX_CHAOS_SLEEP")  # a file only for the delay


def test_split_layers_and_loop_placement() -> None:
    assert split_layers(5, 2) == [[0, 1, 2], [3, 4]]
    assert split_layers(4, 4) == [[0], [1], [2], [3]]
    assert stage_ids(1, pp=2, stages_per_rank=2) == [1, 3]


def test_buckets_respect_cap_and_dtype() -> None:
    ts = [torch.zeros(10), torch.zeros(10), torch.zeros(10, dtype=torch.float64), torch.zeros(30)]
    out = buckets(ts, cap_bytes=80)
    assert [len(b) for b in out] == [2, 1, 1]
    assert all(len({t.dtype for t in b}) == 1 for b in out)


def test_lr_schedule() -> None:
    cfg = TrainConfig(steps=100, lr=1.0, min_lr=0.1, warmup_steps=10)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(100, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 100))


def _state(seed: int = 0, eager: bool = True) -> TrainState:
    cfg = TrainerConfig()
    model = build_materialized(llama_workload(cfg), seed)
    params = dict(model.named_parameters())
    opt = build_optimizer(params, cfg.train)
    if eager:
        init_optimizer_state(opt)
    return TrainState(params, opt, build_scheduler(opt, cfg.train))


def test_eager_optimizer_state_trains_bit_identically() -> None:
    eager, lazy = _state(eager=True), _state(eager=False)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        grads = {n: torch.randn(p.shape, generator=gen) for n, p in eager.params.items()}
        for s in (eager, lazy):
            for n, p in s.params.items():
                p.grad = grads[n].clone()
            s.optimizer.step()
            s.scheduler.step()
    assert params_sha256(eager.params) == params_sha256(lazy.params)


TIMEOUT = timedelta(seconds=5)


@contextmanager
def serving(state_dict: object, step: int) -> Iterator[str]:
    """A peer's real checkpoint transport serving `state_dict` at `step`; yields its metadata."""
    sender = SafeHTTPTransport(
        timeout=TIMEOUT, num_chunks=0, host="127.0.0.1", bind_host="127.0.0.1"
    )
    try:
        sender.send_checkpoint(dst_ranks=[1], step=step, state_dict=state_dict, timeout=TIMEOUT)
        yield str(sender.metadata())
    finally:
        sender.shutdown(wait=True)


def receive(transport: HTTPTransport[object], metadata: str, step: int) -> object:
    try:
        return transport.recv_checkpoint(src_rank=0, metadata=metadata, step=step, timeout=TIMEOUT)
    finally:
        transport.shutdown(wait=True)


def test_healing_state_round_trips_through_the_weights_only_loader() -> None:
    src, dst = _state(seed=1), _state(seed=2)
    for p in src.params.values():  # give the optimizer state to carry
        p.grad = torch.ones_like(p)
    src.optimizer.step()
    src.scheduler.step()
    src.step, src.tokens = 7, 123
    with serving(src.healing_state_dict(), step=7) as metadata:
        receiver = SafeHTTPTransport(
            timeout=TIMEOUT, num_chunks=0, host="127.0.0.1", bind_host="127.0.0.1"
        )
        dst.load_healing_state_dict(receive(receiver, metadata, step=7))  # type: ignore[arg-type]
    assert params_sha256(dst.params) == params_sha256(src.params)
    assert (dst.step, dst.tokens) == (7, 123)
    assert dst.scheduler.state_dict()["last_epoch"] == 1
    assert dst.optimizer.param_groups[0]["lr"] == src.optimizer.param_groups[0]["lr"]
    a, b = src.optimizer.state_dict()["state"], dst.optimizer.state_dict()["state"]
    assert all(torch.equal(a[i][key], b[i][key]) for i in a for key in a[i])


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pwned",))


def test_transport_refuses_pickled_code() -> None:
    """A peer serving a pickled callable is refused by the weights-only loader; torchft's runs it."""
    with serving({"x": _Evil()}, step=1) as metadata:
        safe = SafeHTTPTransport(
            timeout=TIMEOUT, num_chunks=0, host="127.0.0.1", bind_host="127.0.0.1"
        )
        with pytest.raises(Exception, match=r"(?i)weights only|unsupported global"):
            receive(safe, metadata, step=1)
        # torchft's own loader unpickles the callable and calls it (print returns None).
        assert receive(HTTPTransport(timeout=TIMEOUT, num_chunks=0), metadata, step=1) == {
            "x": None
        }


def test_digest_changes_with_any_bit() -> None:
    state = _state()
    before = params_sha256(state.params)
    with torch.no_grad():
        p = next(iter(state.params.values()))
        p.view(-1)[0] = torch.nextafter(p.view(-1)[0], torch.tensor(1.0))
    assert params_sha256(state.params) != before


def test_membership_token_names_exactly_the_members() -> None:
    from trainer.ft.torchft_group import membership_token

    a = membership_token(["phalanx_group_00000:uuid-1", "phalanx_group_00001:uuid-2"], step=7)
    assert a == membership_token(
        ["phalanx_group_00001:uuid-2", "phalanx_group_00000:uuid-1"], step=7
    )
    assert a != membership_token(
        ["phalanx_group_00000:uuid-1", "phalanx_group_00001:uuid-3"], step=7
    )
    # The same members (a restart keeps its replica id) at another step: another name.
    assert a != membership_token(
        ["phalanx_group_00000:uuid-1", "phalanx_group_00001:uuid-2"], step=8
    )
