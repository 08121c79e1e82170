"""bench/scale_measures.py (etcd's counters into rates per node, and projections) and how
bench/scale_fleet.py spreads nodes over workers (pure logic)."""

from __future__ import annotations

import pytest

from bench.scale_fleet import spread
from bench.scale_measures import (
    Snapshot,
    UnitCosts,
    etcd_cores,
    exponent,
    fit_line,
    machine_busy,
    parse_prometheus,
    proc_ticks,
    project,
    projection,
    rates,
    total,
)

TEXT = """\
# HELP grpc_server_handled_total Total number of RPCs completed on the server.
# TYPE grpc_server_handled_total counter
grpc_server_handled_total{grpc_code="OK",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 100
grpc_server_handled_total{grpc_code="Unavailable",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 2
grpc_server_handled_total{grpc_code="OK",grpc_method="Txn",grpc_service="etcdserverpb.KV",grpc_type="unary"} 40
grpc_server_handled_total{grpc_code="OK",grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"} 7
grpc_server_msg_received_total{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"} 30
grpc_server_msg_received_total{grpc_method="Watch",grpc_service="etcdserverpb.Watch",grpc_type="bidi_stream"} 4
grpc_server_started_total{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"} 30
grpc_server_started_total{grpc_method="Watch",grpc_service="etcdserverpb.Watch",grpc_type="bidi_stream"} 2
etcd_debugging_mvcc_events_total 500
etcd_network_client_grpc_sent_bytes_total 1e+06
etcd_network_client_grpc_received_bytes_total 2000
etcd_debugging_mvcc_total_put_size_in_bytes 36000
etcd_debugging_mvcc_current_revision 1000
"""


def later(text: str, scale: float) -> str:
    """The same exposition with every value multiplied by `scale`."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            out.append(line)
            continue
        head, _, value = line.rpartition(" ")
        out.append(f"{head} {float(value) * scale:g}")
    return "\n".join(out)


def test_the_exposition_is_read_into_series_that_sum_over_the_labels_not_asked_for() -> None:
    sample = parse_prometheus(TEXT)
    assert total(sample, "grpc_server_handled_total", grpc_method="Range") == 102
    assert total(sample, "grpc_server_handled_total", grpc_type="unary") == 142
    assert total(sample, "etcd_network_client_grpc_sent_bytes_total") == 1e6
    assert total(sample, "no_such_metric") == 0


def test_rates_are_per_node_per_second_by_kind_and_cpu_is_a_share_of_one_core() -> None:
    before = Snapshot(100.0, parse_prometheus(TEXT), 1000, 500, extra={"ticks": 0})
    after = Snapshot(
        110.0,
        parse_prometheus(later(TEXT, 3.0)),  # every counter tripled over 10 s
        1000 + 50,  # 0.5 s of etcd CPU at 100 ticks/s
        500 + 200,
        extra={"ticks": 400, "busy_s": 2.0, "late_s": 0.4},
    )
    r = rates(before, after, nodes=4, hz=100.0)
    assert "other cpu %" not in r  # no machine counters in these snapshots
    assert r["unary Range"] == pytest.approx(204 / 10 / 4)
    assert r["unary Txn"] == pytest.approx(80 / 10 / 4)
    assert r["msgs LeaseKeepAlive"] == pytest.approx(60 / 10 / 4)
    assert r["streams Watch"] == pytest.approx(4 / 10 / 4)
    assert r["requests"] == pytest.approx((204 + 80 + 60 + 8) / 10 / 4)
    assert r["watch events"] == pytest.approx(1000 / 10 / 4)
    assert r["sent kB/s total"] == pytest.approx(200.0)
    assert r["etcd cpu %"] == pytest.approx(5.0)
    assert r["coord cpu % per node"] == pytest.approx(100 * 2.0 / 10 / 4)
    assert r["history MB/h total"] == pytest.approx(72000 / 10 * 3600 / 1e6)
    assert r["revisions/s"] == pytest.approx(200.0)
    assert r["rounds/s per node"] == pytest.approx(10.0)
    assert r["round ms"] == pytest.approx(5.0)
    with pytest.raises(ValueError):
        rates(before, before, nodes=4, hz=100.0)


def test_what_other_processes_used_is_the_machine_less_etcd_and_the_workers() -> None:
    # 10 s on 2 cores at 100 ticks/s: 2000 ticks, 500 idle -> 75 % busy = 150 % of a core.
    before = Snapshot(0.0, {}, 0, 0, machine=(0, 0, 0, 0, 0, 0, 0, 0))
    after = Snapshot(10.0, {}, 300, 700, machine=(1200, 0, 300, 500, 0, 0, 0, 0))
    r = rates(before, after, nodes=7, hz=100.0, cores=2)
    assert r["machine busy %"] == pytest.approx(75.0)
    assert r["etcd cpu %"] == pytest.approx(30.0)
    assert r["coord cpu % per node"] * 7 == pytest.approx(70.0)
    assert r["other cpu %"] == pytest.approx(50.0)


def test_cpu_reads_skip_a_process_name_with_spaces_and_the_machine_counts_iowait_as_idle() -> None:
    stat = "42 (etcd (x) y) S 1 42 42 0 -1 4194560 10 0 0 0 70 30 0 0 20 0 9 0 5 0 0"
    assert proc_ticks(stat) == 100
    assert machine_busy((10, 0, 10, 70, 10, 0, 0, 0), (40, 0, 20, 120, 20, 0, 0, 0)) == 0.4


def test_a_rate_that_grows_with_n_is_projected_along_its_power_law() -> None:
    assert exponent([(10, 2.0), (100, 20.0)]) == pytest.approx(1.0)
    assert project([(10, 2.0), (100, 20.0)], 1000) == pytest.approx(200.0)
    # The two largest sizes decide; zeros and a single size mean "constant per node".
    assert exponent([(10, 5.0), (100, 2.0), (300, 2.0)]) == pytest.approx(0.0)
    assert exponent([(10, 0.0), (100, 3.0)]) == 0.0
    assert project([(100, 3.0)], 1000) == 3.0
    assert project([], 1000) == 0.0


COSTS = UnitCosts(
    write_s=500e-6,
    keepalive_s=200e-6,
    keepalive_msg_s=20e-6,
    read_s=100e-6,
    read_per_record_s=5e-6,
    event_s=10e-6,
    idle_cores=0.01,
)


def test_a_line_is_fitted_through_the_read_costs() -> None:
    a, b = fit_line([(10.0, 150e-6), (100.0, 600e-6), (1000.0, 5100e-6)])
    assert a == pytest.approx(100e-6)
    assert b == pytest.approx(5e-6)
    assert fit_line([(10.0, 2.0)]) == (2.0, 0.0)
    assert fit_line([]) == (0.0, 0.0)


def test_etcd_cores_add_each_kind_at_its_unit_cost_and_reads_grow_with_the_job() -> None:
    per_node = {
        "unary Txn": 1.0,
        "unary Range": 2.0,
        "unary LeaseGrant": 0.1,
        "unary LeaseTimeToLive": 1.0,
        "msgs LeaseKeepAlive": 1.5,
        "streams LeaseKeepAlive": 0.5,  # one refresh in three opened its stream
        "msgs Watch": 0.0,
        "watch events": 50.0,
        "requests": 99.0,  # a total: not counted again
    }
    read = 100e-6 + 5e-6 * 100
    one = 1.1 * 500e-6 + 2.0 * read + 1.0 * 100e-6 + 0.5 * 200e-6 + 1.0 * 20e-6 + 50 * 10e-6
    assert etcd_cores(per_node, 100, COSTS) == pytest.approx(0.01 + 100 * one)


def test_a_projection_scales_every_per_node_rate_and_multiplies_by_n() -> None:
    measured = [
        (10, {"unary Range": 2.0, "sent B/s per node": 1e3, "history kB/h per node": 500.0}),
        (
            100,
            {
                "unary Range": 2.0,
                "sent B/s per node": 1e4,
                "join requests per node": 30.0,
                "join Txn per node": 20.0,
                "join Range per node": 5.0,
            },
        ),
    ]
    p = projection(measured, 1000, COSTS)
    assert p.rates["unary Range"] == pytest.approx(2.0)
    assert p.rates["sent B/s per node"] == pytest.approx(1e5)  # grows with N (b = 1)
    assert p.egress_mb_s == pytest.approx(100.0)
    assert p.etcd_cores == pytest.approx(0.01 + 1000 * 2.0 * (100e-6 + 5e-6 * 1000))
    assert p.history_mb_h == pytest.approx(500.0)  # measured at one size: constant per node
    join = 1000 * (20 * 500e-6 + 5 * (100e-6 + 5e-6 * 1000) + 5 * 100e-6)
    assert p.join_etcd_s == pytest.approx(join)
    assert projection(measured[:1], 1000, COSTS).join_etcd_s is None


def test_node_0_gets_a_worker_of_its_own_and_the_rest_are_spread_evenly() -> None:
    assert spread(10, 3) == [(0, 1), (1, 3), (4, 3), (7, 3)]
    assert spread(4, 8) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert spread(2, 2) == [(0, 1), (1, 1)]
    assert sum(c for _, c in spread(1000, 8)) == 1000
