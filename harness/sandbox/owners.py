"""Who owns a sandbox, and cleaning up after owners that died.

Every container the harness starts carries labels (``dev.harness=1``, the run, the attempt,
the owning controller's pid and its host + pid namespace), so a sweep can remove leftovers
of a controller that is gone. A pid only means something inside its pid namespace: a
sandbox owned from another host or namespace is never judged dead by pid here.

Per-attempt input folders live under one root folder and are named after their owner the
same way, so a ``kill -9`` of the controller leaks nothing past the next start.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import threading
from pathlib import Path
from typing import Any, Callable

LABEL = "dev.harness"  # every container the harness starts carries dev.harness=1
LABEL_RUN = "dev.harness.run"
LABEL_ATTEMPT = "dev.harness.attempt"
LABEL_OWNER = "dev.harness.owner-pid"
LABEL_HOST = "dev.harness.owner-host"  # hostname:pid-namespace; with the pid it names the controller


def pid_namespace() -> str:
    """This process's pid namespace (the inode of /proc/self/ns/pid)."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # 'pid:[4026531836]'
        return link.split("[", 1)[1].rstrip("]") if "[" in link else link
    except OSError:
        return "?"


def controller_host() -> str:
    """hostname plus this pid namespace: pids are only comparable within it."""
    return f"{socket.gethostname()}:{pid_namespace()}"


def controller_id(pid: int | None = None) -> str:
    """host:pid-namespace:pid of a controller (this one by default)."""
    return f"{controller_host()}:{os.getpid() if pid is None else pid}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def owner_dead(controller: str) -> bool | None:
    """True/False when ``controller`` (host:ns:pid) is in this pid namespace on this host;
    None when it cannot be told from here (another host or namespace, or an old format)."""
    host, _, pid = controller.rpartition(":")
    if not pid.isdigit() or host != controller_host():
        return None
    return not pid_alive(int(pid))


class LiveRegistry:
    """The sandboxes this process holds. Every read takes a copy under the lock, so a
    sandbox starting or going away in another thread never breaks a cleanup pass."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, Any] = {}

    def add(self, name: str, item: Any) -> None:
        with self._lock:
            self._items[name] = item

    def discard(self, name: str) -> None:
        with self._lock:
            self._items.pop(name, None)

    def names(self) -> set[str]:
        with self._lock:
            return set(self._items)

    def snapshot(self) -> list[Any]:
        with self._lock:
            return list(self._items.values())

    def remove_all(self, remove: Callable[[Any], Any], timeout: float = 15) -> int:
        """Call ``remove`` on every held item, in parallel; returns how many there were."""
        items = self.snapshot()
        threads = [threading.Thread(target=remove, args=(x,), daemon=True) for x in items]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=timeout)
        return len(items)


# --------------------------------------------------------------------------- input folders


def _safe_root(root: Path) -> Path:
    """Create ``root`` (a folder of ours) if needed; refuse a symlink or someone else's folder."""
    root.mkdir(parents=True, exist_ok=True, mode=0o755)
    st = os.lstat(root)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{root} is not a plain directory")
    if st.st_uid != os.geteuid():
        raise OSError(f"{root} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})")
    return root


def input_folder(root: Path, name: str) -> Path:
    """A fresh folder for one sandbox's inputs, named after its owner (this process)."""
    d = _safe_root(root) / f"{pid_namespace()}-{os.getpid()}-{name}"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)  # a plain mkdir is filtered by the umask
    return d


# /etc/hosts of a sandbox without a network (a read-only file in its input folder): the engine
# writes none for it (NetworkDisabled), and an image's own may be empty, so `localhost` would
# not resolve
HOSTS = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def sweep_input_folders(root: Path) -> list[str]:
    """Remove input folders whose owner (a controller in this pid namespace) is dead."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    ns = pid_namespace()
    for e in entries:
        parts = e.name.split("-", 2)
        if len(parts) != 3 or parts[0] != ns or not parts[1].isdigit():
            continue
        if pid_alive(int(parts[1])) or not e.is_dir(follow_symlinks=False):
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        removed.append(e.name)
    return removed
