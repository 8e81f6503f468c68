"""What a cell keeps on disk and shares among its processes: the listening sockets, every
process's metric files (and a dead one's folded into the retired totals), and the scratch
folder (link socket, metric files, the supervisor's status) that a killed cell leaves
behind."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import mark_process_dead

from api.metrics import files_locked


def bind(host: str, port: int, count: int = 1) -> list[socket.socket]:
    """`count` listening sockets on one port, one per gateway (`SO_REUSEPORT`): the kernel
    spreads new connections over them, where K gateways accepting from one shared socket
    leave every connection to whichever wakes first. A port another server holds is refused
    (OSError), even one that listens with `SO_REUSEPORT` itself: a plain bind goes first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        port = probe.getsockname()[1]  # port 0: the kernel's pick, for every socket
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            sock.listen(4096)
            sock.set_inheritable(True)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def multiprocess_metrics(folder: Path) -> None:
    """Every process of the cell writes its metrics into `folder` (inherited by spawned
    children through the environment; this process switches its value class now)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    from prometheus_client import values

    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


RETIRED = "retired"  # stands for every dead process's pid in a metric file's name


def retire_metrics(pid: int, folder: Path) -> None:
    """Fold a dead process's metric files into the folder's retired totals.

    prometheus-client's `mark_process_dead` removes only the files of a dead process's live
    gauges: its counters' and histograms' files must keep counting in every scrape, so each
    restart would leave its files behind for good. Their values are added into one
    `<kind>_retired.db` per kind, which a scrape sums like any process's file. It runs in
    the supervisor, the scrape in the core: both hold the folder's lock (`files_locked`), so
    no scrape sees a value twice or misses one.
    """
    with files_locked(str(folder)):
        _retire(pid, folder)


def _retire(pid: int, folder: Path) -> None:
    mark_process_dead(pid, str(folder))  # type: ignore[no-untyped-call]
    for kind in ("counter", "histogram", "summary"):
        dead = folder / f"{kind}_{pid}.db"
        if not dead.exists():
            continue
        retired = MmapedDict(str(folder / f"{kind}_{RETIRED}.db"))  # type: ignore[no-untyped-call]
        try:
            values = MmapedDict.read_all_values_from_file(str(dead))  # type: ignore[no-untyped-call]
            for key, value, timestamp, _ in values:
                total, _ = retired.read_value(key)  # type: ignore[no-untyped-call]
                retired.write_value(key, total + value, timestamp)  # type: ignore[no-untyped-call]
        finally:
            retired.close()  # type: ignore[no-untyped-call]
        dead.unlink()


SCRATCH_PREFIX = "batchgate-cell-"


def sweep_scratch(root: Path) -> list[Path]:
    """Remove what cores killed outright left in `root`; returns the folders removed.

    A cell's scratch folder (its link socket, every process's metric files) is named for its
    core's pid. A core killed by SIGKILL or the OOM killer never reaches its own clean-up, and
    a server restarted after each crash would leave one folder per crash. A folder goes once
    its core's pid is gone and nothing listens on its link (the second check spares a live
    cell whose /tmp is shared across pid namespaces).
    """
    removed: list[Path] = []
    for folder in root.glob(f"{SCRATCH_PREFIX}*-*"):
        pid = folder.name.removeprefix(SCRATCH_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)) and not _listening(folder / "link.sock"):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


__all__ = ["RETIRED", "SCRATCH_PREFIX", "bind", "multiprocess_metrics", "retire_metrics",
           "sweep_scratch"]
