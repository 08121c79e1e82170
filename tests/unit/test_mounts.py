"""daemon.config.mounts: the file system a path is on, from a mount table."""

from __future__ import annotations

from pathlib import Path

from daemon.config import mounts

TABLE = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
27 1 252:1 / / rw,relatime - ext4 /dev/vda rw
30 27 0:25 / /mnt/my\\040disk rw - xfs /dev/vdb rw
31 30 0:26 / /mnt/my\\040disk/inner rw - tmpfs tmpfs rw
32 27 0:27 / /mnt/my\\040disk rw - nfs4 server:/x rw
"""


def test_the_longest_mount_point_above_the_path_names_the_type() -> None:
    assert mounts.fs_type("/proc/phalanx", TABLE) == "proc"
    assert mounts.fs_type("/proc", TABLE) == "proc"
    assert mounts.fs_type("/processes/x", TABLE) == "ext4"  # a prefix, not a parent
    assert mounts.fs_type("/var/lib/phalanx", TABLE) == "ext4"
    assert mounts.fs_type("/mnt/my disk/inner/ckpt", TABLE) == "tmpfs"  # escaped space


def test_the_last_of_two_mounts_on_one_point_is_the_one_seen() -> None:
    assert mounts.fs_type("/mnt/my disk/ckpt", TABLE) == "nfs4"


def test_a_table_without_a_match_or_with_malformed_lines_names_nothing() -> None:
    assert mounts.fs_type("/x", "garbage\n1 2 3\n") is None


def test_this_machines_proc_is_pseudo_and_its_temp_directory_is_not(tmp_path: Path) -> None:
    assert mounts.pseudo_fs(Path("/proc")) == "proc"
    assert mounts.pseudo_fs(tmp_path) is None
