"""The `phalanx` command: `run` (the service), `status`, `demo`.

Exit codes are ``daemon.exits``: 0 done, 1 failed (restart me), 2 bad input only.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import replace

from daemon.config import DaemonConfig, load_daemon_config
from daemon.config.etcd_settings import read_password
from daemon.coordination.coordinator import CoordinationError, Coordinator, EtcdSettings
from daemon.coordination.etcd_client import EtcdAccessDenied
from daemon.coordination.identity import take_identity
from daemon.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from trainer import logs
from trainer.config import ConfigError, add_override_option

ENDPOINT_FILE = "etcd.endpoint"


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="job file (TOML)")
    parser.add_argument("--node-id", help="this node's id (default: node.id, else the hostname)")
    add_override_option(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="phalanx",
        description="Fault-tolerant, elastic training daemon: one per node, coordinated through etcd and torchft.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run this node's daemon (the service)",
        description="Join the job, run this node's replica group, heal and restart it until training completes.",
    )
    _common(run)
    status = sub.add_parser(
        "status",
        help="show the job's nodes, groups, leader and step from etcd",
        description="Read the job's state from etcd and print it.",
    )
    _common(status)
    status.add_argument(
        "--json", action="store_true", help="print one JSON object instead of a table"
    )
    status.add_argument(
        "--incidents",
        action="store_true",
        help="print the job's incident record: every failure it lived through",
    )
    demo = sub.add_parser(
        "demo",
        help="two nodes on this machine, a failure injected and healed",
        description="Start an embedded etcd and two daemons, kill one node's ranks mid-run, and show it heal.",
    )
    demo.add_argument("--steps", type=int, default=240, help="training steps (default 240)")
    demo.add_argument(
        "--workdir", help="keep the run's files here (default: a temporary directory)"
    )
    demo.add_argument(
        "--kill-at",
        type=int,
        help="kill node-b's ranks once node-a reaches this step (default: a third of the "
        "steps; 0: no failure, for the digest a run without one ends on)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from daemon.demo import run_demo

        if args.kill_at is not None and not 0 <= args.kill_at < args.steps:
            print(
                f"error: --kill-at must be 0 (no failure) or below --steps ({args.steps})",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        return run_demo(steps=args.steps, workdir=args.workdir, kill_at=args.kill_at)
    try:
        cfg = load_daemon_config(args.config, args.overrides, args.node_id)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.command == "status":
        return status(cfg, as_json=args.json, incidents=args.incidents)
    return run(cfg)


def etcd_settings(cfg: DaemonConfig, endpoints: list[str]) -> EtcdSettings:
    e = cfg.etcd
    return EtcdSettings(
        endpoints=endpoints,
        ca_file=e.ca_file,
        cert_file=e.cert_file,
        key_file=e.key_file,
        user=e.user,
        password=read_password(cfg),
        timeout_s=e.timeout_s,
        allow_insecure_password=e.allow_insecure_password,
    )


def run(cfg: DaemonConfig) -> int:
    from daemon.config.advertise import EtcdUnresolved, choose_advertise_host
    from daemon.config.preflight import preflight
    from daemon.coordination.etcd_server import EmbeddedEtcd, EtcdStartError
    from daemon.supervision.assembly import build_supervisor
    from daemon.surfaces.metrics import DaemonMetrics
    from daemon.surfaces.server import StatusServer

    try:  # once: a name that resolves differently later must not move the listeners
        advertise_choice = choose_advertise_host(cfg)
        if advertise_choice is not None:
            cfg = cfg.advertising(advertise_choice.address)
        cfg = cfg.pin_bind_host()
    except ConfigError as e:  # a loopback address while etcd is on another machine
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except EtcdUnresolved as e:  # DNS may not be up yet
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as e:  # DNS may not be up yet: not bad input, so systemd retries
        print(
            f"error: node.advertise_host {cfg.advertise_host!r} does not resolve ({e}); "
            "fix its DNS entry or set node.bind_host.",
            file=sys.stderr,
        )
        return EXIT_FAILED
    try:  # before anything starts; the lock on run_dir is held until the daemon exits
        lock = preflight(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logs.configure()
    logs.bind(job=cfg.job.name, node=cfg.node_id)
    log = logs.get()
    if advertise_choice is not None:
        log.info(
            "advertise_host_chosen", address=advertise_choice.address, why=advertise_choice.reason
        )
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    embedded: EmbeddedEtcd | None = None
    endpoints = list(cfg.etcd.endpoints)
    if not endpoints:
        try:
            embedded = EmbeddedEtcd(run_dir / "etcd").start()
        except (EtcdStartError, FileNotFoundError) as e:
            log.error("etcd_embedded_failed", error=str(e))
            lock.release()
            return EXIT_FAILED
        endpoints = [embedded.endpoint]
        (run_dir / ENDPOINT_FILE).write_text(embedded.endpoint + "\n")
        log.info(
            "etcd_embedded",
            endpoint=embedded.endpoint,
            pid=embedded.pid,
            data_dir=str(run_dir / "etcd"),
        )
    server = None
    try:
        try:
            coord = Coordinator(
                etcd_settings(cfg, endpoints),
                cfg.job.name,
                cfg.node_id,
                cfg.etcd.lease_ttl_s,
                take_identity(cfg.node_id, run_dir),
                leader_ttl_s=cfg.etcd.leader_ttl_s,
            )
        except CoordinationError as e:  # the settings themselves: bad input
            print(f"error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        sup = build_supervisor(cfg, coord)
        published = lambda: sup.published  # noqa: E731  # the last tick's status, swapped whole
        metrics = DaemonMetrics(published, cfg.metrics_dir if cfg.metrics.enabled else None)
        try:
            server = StatusServer(
                published, cfg.http_host, cfg.node.http_port, metrics.render
            ).start()
        except OSError as e:
            print(
                f"error: node.http_port {cfg.node.http_port} cannot be bound ({e.strerror}); pick a free port.",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        log.info(
            "http_listening",
            port=server.port,
            endpoints=["/metrics", "/healthz", "/readyz", "/status"],
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: sup.request_drain())
        return sup.run(http_port=server.port)
    except Exception as e:  # a bug or an unforeseen failure: never 2, so the node is restarted
        log.exception("node_failed", error=f"{type(e).__name__}: {e}", code=EXIT_FAILED)
        return EXIT_FAILED
    finally:
        if server is not None:
            server.stop()
        if embedded is not None:
            embedded.stop()
            (run_dir / ENDPOINT_FILE).unlink(missing_ok=True)
        lock.release()


def status(cfg: DaemonConfig, as_json: bool, incidents: bool = False) -> int:
    """Print the job as etcd sees it (`incidents`: its incident record only). Exit 0
    printed, 1 etcd unreachable (or anything unforeseen), 2 bad input (no etcd to ask, a
    credential etcd refuses); stdout holds only the table or the JSON, warnings go to
    stderr."""
    from daemon.coordination.progress import with_steps
    from daemon.surfaces.status import dumps, incidents_table, status_json, status_table

    logs.configure()  # stderr: with --json, stdout stays one JSON document
    endpoints = list(cfg.etcd.endpoints)
    if not endpoints:
        path = cfg.run_dir / ENDPOINT_FILE
        if not path.exists():
            print(
                f"error: etcd.endpoints is empty and no embedded etcd runs under {cfg.run_dir}; "
                "start `phalanx run` with this job file, or set etcd.endpoints.",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        endpoints = [path.read_text().strip()]
    try:
        settings = etcd_settings(cfg, endpoints)
    except ConfigError as e:  # the password file
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        coord = Coordinator(settings, cfg.job.name, f"status-{os.getpid()}", cfg.etcd.lease_ttl_s)
        view = coord.snapshot()
        steps = with_steps(view.nodes, coord.read_progress())  # outside the job's prefix
        record = coord.incidents.read()  # outside it too
        coord.close(revoke=False)
        doc = status_json(cfg.job.name, replace(view, nodes=steps), record)
        if incidents:
            doc = {"job": doc["job"], "incidents": doc["incidents"]}
        show = incidents_table if incidents else status_table
        text = dumps(doc) if as_json else show(doc)
    except EtcdAccessDenied as e:  # a wrong password or certificate: bad input
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CoordinationError as e:  # unreachable: transient
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as e:  # never a traceback for what etcd holds
        print(
            f"error: reading the job from etcd failed ({type(e).__name__}: {e}).", file=sys.stderr
        )
        return EXIT_FAILED
    print(text)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
