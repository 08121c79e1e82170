"""`make demo`'s digest wherever its kill lands, without one, and at another commit.

Runs `phalanx demo` from this checkout once per ``--kill-at`` value (0: no failure),
and with ``--base REV`` from a worktree of REV (``--patch FILE`` applied first, for a
fix the base lacks), ``--base-runs`` times with that commit's own kill. Prints each
run's kill step, result and node-a's digest, and whether every run ended on the same
digest. The demo's ranks are paced as the demo paces them (``PHALANX_CHAOS_DELAY`` 0.1
s a step, so the run can be watched); nothing else is set.

Used for issue 50's "make demo prints the same digest as before the change":

    python -m bench.demo_digest --kill-at 0 40 80 160 --base dac7977 \
        --patch bench/patches/fixed-cuts-dac7977.diff --out docs/bench/demo_digest-<commit>.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO_TIMEOUT_S = 400


def parse(out: str) -> dict[str, Any]:
    """The demo summary's figures: the kill's step (None: no failure), each node's
    digest, and the result."""
    summary = out[out.find("Phalanx demo summary") :]
    kill = re.search(r"failures injected\s+1 \(SIGKILL .* at step (\d+)\)", summary)
    digests = dict(re.findall(r"params_sha256\s+(node-[ab]) ([0-9a-f]{64})", summary))
    result = re.search(r"result\s+(\w+)", summary)
    return {
        "kill_step": int(kill.group(1)) if kill else None,
        "digests": digests,
        "result": result.group(1) if result else "none",
    }


def run_demo(tree: Path, args: list[str], label: str) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="phalanx-demo-digest-"))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, "-m", "daemon.cli", "demo", "--workdir", str(work), *args]
    try:
        proc = subprocess.run(
            argv, cwd=tree, env=env, capture_output=True, text=True, timeout=DEMO_TIMEOUT_S
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    row = {"run": label, "argv": args, "code": proc.returncode, **parse(proc.stdout)}
    print(
        f"{label:<24} kill at {row['kill_step'] if row['kill_step'] is not None else '-':>4}"
        f"  {row['result']:<6}  node-a {row['digests'].get('node-a', '-')}",
        flush=True,
    )
    return row


def base_tree(rev: str, patch: Path | None) -> Path:
    tree = Path(tempfile.mkdtemp(prefix="phalanx-demo-base-")) / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
        check=True,
        capture_output=True,
    )
    if patch is not None:
        subprocess.run(["git", "-C", str(tree), "apply", str(patch.resolve())], check=True)
    return tree


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=240, help="the demo's steps (its default)")
    p.add_argument(
        "--kill-at", type=int, nargs="+", default=[0, 80], help="kill steps (0: no failure)"
    )
    p.add_argument("--base", help="also run the demo at this commit")
    p.add_argument("--patch", type=Path, help="a diff applied to the base's tree first")
    p.add_argument("--base-runs", type=int, default=1)
    p.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    print("pacing: the demo's own (PHALANX_CHAOS_DELAY=0.1 a step)", flush=True)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    steps = ["--steps", str(args.steps)]
    rows = [
        run_demo(ROOT, [*steps, "--kill-at", str(k)], f"{commit} kill-at {k}") for k in args.kill_at
    ]
    if args.base:
        tree = base_tree(args.base, args.patch)
        label = args.base + (" + patch" if args.patch else "")
        try:
            rows += [run_demo(tree, steps, f"{label} #{i + 1}") for i in range(args.base_runs)]
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                check=False,
                capture_output=True,
            )
            shutil.rmtree(tree.parent, ignore_errors=True)
    digests = {r["digests"].get("node-a") for r in rows} | {
        r["digests"].get("node-b") for r in rows
    }
    same = len(digests) == 1 and None not in digests
    ok = same and all(r["result"] == "OK" for r in rows)
    print(f"every run ended on one digest: {'yes' if same else 'NO'}; every demo OK: {ok}")
    if args.out is not None:
        report = {"commit": commit, "steps": args.steps, "same_digest": same, "rows": rows}
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
