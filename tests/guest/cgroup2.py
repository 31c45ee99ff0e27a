"""`make test-cgroup2`: the project's cgroup v2 checks on a real v2 kernel.

This machine (and CI) boots cgroup v1 (hybrid); most users run v2. This script boots a Debian
bookworm guest under QEMU with ``systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all``, with
Debian's docker.io on the systemd cgroup driver, and runs there (tests/guest/inside.sh):
``harness doctor``, the live cgroup tests, the real-container sandbox tests that measure
counters, and a small ``harness run`` of refunds whose attempts must carry v2 counters; then
the engine restarts on the cgroupfs driver and the locating tests run again. The JUnit reports
come back to ``.harness/cgroup2/`` (junit.xml, junit-cgroupfs.xml, with the guest's log and
console); the exit status is the tests', trusted only with this boot's nonce beside it and
reports that ran tests and skipped none.

Offline: the guest image is made with mmdebstrap from apt's configured sources (kernel,
systemd, docker.io, python3) plus the host venv's packages as wheels, and cached by its
inputs under $HARNESS_GUEST_CACHE (default ~/.cache/harness/cgroup2); a second run reuses it.
The checkout comes in read-only over 9p; the harness images that need a package mirror to
build (the offline base first of all) are saved from the host's engine and loaded in the
guest as the same images, with the same inputs labels, so the guest builds only what is
cheap (the sandbox and suite images FROM it) and never runs mmdebstrap under emulation. They
are loaded once, by a first boot into a copy-on-write overlay of the root disk kept beside the
image (keyed by their ids); test boots run on a throw-away snapshot of it. The guest has no
network interface.

KVM is used when it boots the guest; otherwise (this machine: a nested guest whose /dev/kvm
cannot run a stock kernel) QEMU emulates (TCG), about 14x slower. Needs root (mmdebstrap, a
9p share of root-owned files).

Usage:  python tests/guest/cgroup2.py [run|build|check] [--force] [--accel auto|kvm|tcg]
Environment: HARNESS_GUEST_CACHE, HARNESS_GUEST_TIMEOUT (seconds, default 2700),
HARNESS_GUEST_PYTEST (extra pytest arguments inside the guest, e.g. "-k oom").
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
OUT = ROOT / ".harness" / "cgroup2"
sys.path.insert(0, str(ROOT))  # the checkout's harness: what images it wants, the host's engine

# Debian packages of the guest (minbase plus these; no Recommends)
PACKAGES = [
    "systemd", "systemd-sysv", "udev", "dbus", "kmod", "linux-image-amd64", "initramfs-tools", "zstd",
    "docker.io", "python3", "python3-venv", "ca-certificates", "iproute2", "procps",
]
# packages of the host venv the guest does not need (large; no guest test imports them). Never
# a runtime dependency of harness: requirements() refuses that (numpy once was, and every
# guest `harness run` failed on its import).
NOT_IN_GUEST = {"ray", "scipy"}
RECIPE = "harness cgroup2 guest v1"
CMDLINE = ("console=ttyS0,115200 root=LABEL=guestroot rw rootfstype=ext4 fsck.mode=skip "
           "systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all apparmor=0 psi=1 "
           "mitigations=off panic=-1 systemd.show_status=false")
DISK_SIZE = "12G"
HOST_TOOLS = {"qemu-system-x86_64": "qemu-system-x86", "qemu-img": "qemu-utils", "mmdebstrap": "mmdebstrap", "mke2fs": "e2fsprogs"}


class GuestError(Exception):
    """A one-line reason the target cannot run (exit 2)."""


def say(msg: str) -> None:
    print(f"test-cgroup2: {msg}", flush=True)


def cache_root() -> Path:
    root = Path(os.environ.get("HARNESS_GUEST_CACHE") or Path.home() / ".cache" / "harness" / "cgroup2").resolve()
    if root == ROOT or ROOT in root.parents:
        # the checkout is copied into the guest, and the cache holds the host's CA store
        raise GuestError(f"HARNESS_GUEST_CACHE={root} lies inside the checkout; put it elsewhere")
    return root


# --------------------------------------------------------------------------- host checks


def check_host() -> None:
    if os.geteuid() != 0:
        raise GuestError("needs root (mmdebstrap builds the guest's root filesystem, 9p shares root-owned files); "
                         "run it as root: sudo make test-cgroup2")
    if os.uname().machine != "x86_64":
        raise GuestError(f"the guest is x86_64; this host is {os.uname().machine}")
    if sys.version_info[:2] != (3, 11):
        raise GuestError(f"the guest's Python is Debian bookworm's 3.11 and gets the host venv's wheels; this venv is "
                         f"{sys.version.split()[0]}: run it with a 3.11 venv")
    missing = [pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None]
    if missing:
        say(f"installing {', '.join(missing)} (apt-get)...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
        if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                raise GuestError(f"apt-get install {' '.join(missing)} failed: {p.stderr.strip().splitlines()[-1:]}")


def check_space(cold: bool) -> None:
    """Room on the cache's filesystem (the image, the overlay, the saved images and the test
    boot's scratch file all live there): a full disk would pause QEMU and look like a hang."""
    need = 7 if cold else 3
    cache_root().mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache_root()).free / 2**30
    if free < need:
        raise GuestError(f"{free:.1f} GiB free on {cache_root()}; the guest needs about {need} GiB "
                         f"({'first run' if cold else 'cached image'}): free some, or set HARNESS_GUEST_CACHE elsewhere")


def kvm_usable() -> bool:
    """/dev/kvm opens (whether it runs a stock kernel is only known by booting one)."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError:
        return False
    os.close(fd)
    return True


# --------------------------------------------------------------------------- the guest image


def runtime_dependencies() -> set[str]:
    """The normalized names of pyproject's [project] dependencies (what `harness` imports)."""
    import re
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}


def requirements() -> str:
    """The host venv's packages (pinned), minus what the guest does not need."""
    needed = sorted(NOT_IN_GUEST & runtime_dependencies())
    if needed:
        raise GuestError(f"NOT_IN_GUEST leaves out {', '.join(needed)}, a runtime dependency of harness (pyproject.toml)")
    p = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True)
    keep = [ln for ln in p.stdout.splitlines() if ln.strip() and not ln.startswith("#")
            and ln.split("==")[0].strip().lower() not in NOT_IN_GUEST]
    return "\n".join(sorted(keep, key=str.lower)) + "\n"


def image_inputs(reqs: str) -> str:
    from harness.sandbox.images import apt_sources_digest

    h = hashlib.sha256(RECIPE.encode())
    h.update(" ".join(PACKAGES).encode())
    h.update((HERE / "customize.sh").read_bytes())
    h.update(reqs.encode())
    h.update(apt_sources_digest().encode())
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    h.update(ca.read_bytes() if ca.is_file() else b"")
    return h.hexdigest()[:16]


def build_image(force: bool = False) -> Path:
    """The cached guest image (root disk, kernel, initramfs) for these inputs; built if absent."""
    reqs = requirements()
    inputs = image_inputs(reqs)
    d = cache_root() / f"guest-{inputs}"
    if not force and (d / "done.json").is_file():
        say(f"guest image {d.name} cached ({du(d)})")
        return d
    if shutil.which("mmdebstrap") is None:
        check_host()
    d.mkdir(parents=True, exist_ok=True)
    for stale in [*d.glob("images-*.qcow2"), *d.glob("images-*.done"), d / "done.json"]:
        stale.unlink(missing_ok=True)  # overlays of a root disk about to be rebuilt
    t0 = time.monotonic()
    prune(d)
    with tempfile.TemporaryDirectory(prefix="harness-guest-", dir=cache_root(), ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        wheels = work / "wheels"
        (work / "requirements.txt").write_text(reqs)
        say(f"fetching {len(reqs.splitlines())} Python packages as wheels ...")
        p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), "-r", str(work / "requirements.txt")],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise GuestError(f"pip wheel failed: {p.stderr.strip()[-400:]}")
        rootfs = work / "root"
        say(f"building the guest root filesystem with mmdebstrap (bookworm minbase + {len(PACKAGES)} packages) ...")
        env = {**os.environ, "GUEST_WHEELS": str(wheels), "GUEST_REQUIREMENTS": str(work / "requirements.txt")}
        # in a private mount namespace: whatever stops it, its /proc, /sys and /dev mounts go with it
        # (and never leave the host's /dev/shm bound under a directory about to be removed)
        hook = f"--customize-hook={shlex.quote(str(HERE / 'customize.sh'))} \"$1\""
        rc, err = interruptible(["unshare", "--mount", "--propagation", "private", "mmdebstrap", "--variant=minbase",
                                 "--mode=root", f"--include={','.join(PACKAGES)}", hook, "bookworm", str(rootfs)], env)
        if rc != 0:
            tail = "\n".join(err.strip().splitlines()[-15:])
            raise GuestError(f"mmdebstrap failed (exit {rc}); is apt configured (apt-get update)?\n{tail}")
        kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
        initrds = sorted((rootfs / "boot").glob("initrd.img-*"))
        if not kernels or not initrds:
            raise GuestError("the guest root filesystem has no kernel or initramfs in /boot")
        shutil.copy2(kernels[-1], d / "vmlinuz")
        shutil.copy2(initrds[-1], d / "initrd.img")
        disk = d / "root.img"
        disk.unlink(missing_ok=True)
        say(f"making the {DISK_SIZE} root disk (ext4, sparse) ...")
        p = subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-L", "guestroot", "-d", str(rootfs), str(disk), DISK_SIZE],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise GuestError(f"mke2fs failed: {p.stderr.strip()[-300:]}")
    meta = {"inputs": inputs, "kernel": kernels[-1].name, "built_s": round(time.monotonic() - t0, 1), "packages": PACKAGES,
            "python": reqs.splitlines()}
    (d / "done.json").write_text(json.dumps(meta, indent=1) + "\n")
    say(f"guest image {d.name} built in {meta['built_s']:.0f} s ({du(d)})")
    prune(d)
    return d


def interruptible(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``cmd`` in its own session; on Ctrl-C / SIGTERM it gets SIGTERM and up to 60 s to
    clean up (mmdebstrap unmounts and stops apt) before the interrupt goes on."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = p.communicate()
        return p.returncode, err
    except BaseException:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        raise


def mounted_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        return [ln.split()[4] for ln in f if ln.split()[4].startswith(prefix)]


def prune(keep: Path | None) -> None:
    """Older guest images (other inputs) and build directories an interrupted run left are
    removed (never one with something still mounted in it): one image per cache."""
    for old in [*cache_root().glob("guest-*"), *cache_root().glob("harness-guest-*")]:
        if old != keep and old.is_dir() and not mounted_under(old):
            shutil.rmtree(old, ignore_errors=True)


def du(path: Path) -> str:
    """Disk actually used (sparse files count their blocks)."""
    total = 0
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        try:
            total += p.lstat().st_blocks * 512
        except OSError:
            pass
    return f"{total / 2**20:.0f} MiB on disk"


# --------------------------------------------------------------------------- the host's images


def host_images() -> list[str]:
    """What doctor wants present, minus what the guest builds itself (cheap, no package mirror:
    the sandbox and the native suites' images FROM it): the offline base and the images whose
    builds need a mirror (apt / pip), saved from the host's engine."""
    from harness.engine.doctor import wanted_images
    from harness.engine.suites import builtin_suites, load_suite
    from harness.sandbox.images import SANDBOX_IMAGE

    built_here = {SANDBOX_IMAGE}
    for name in builtin_suites():
        s = load_suite(name)
        if s.dockerfile and s.image and any(t.build is None for t in s.tasks):
            built_here.add(s.image)
    return [w for w in wanted_images() if w not in built_here]


def save_images(dest: Path) -> tuple[Path, list[str]]:
    """One `docker save` tarball of host_images() (shared layers once), cached by image ids."""
    from harness.model.errors import EngineError
    from harness.sandbox.docker_sandbox import connect

    try:
        client = connect(timeout=60)
    except EngineError as e:
        raise GuestError(f"the host's Docker engine is needed to save the images the guest loads: {e}") from None
    names = host_images()
    ids = []
    for n in names:
        try:
            ids.append(client.images.get(n).id)
        except Exception:
            raise GuestError(f"image {n} is not built on the host; run `make images` first") from None
    key = hashlib.sha256(json.dumps(sorted(zip(names, ids))).encode()).hexdigest()[:16]
    tar = dest / f"images-{key}.tar"
    if tar.is_file():
        say(f"host images cached ({len(names)}, {tar.stat().st_size / 2**20:.0f} MiB)")
        return tar, names
    for old in [*dest.glob("images-*.tar"), *dest.glob("images-*.part")]:
        old.unlink()
    t0 = time.monotonic()
    part = tar.with_suffix(".part")
    try:
        resp = client.api.get(client.api._url("/images/get"), params={"names": names}, stream=True)
        resp.raise_for_status()
        with open(part, "wb") as f:
            for chunk in resp.iter_content(1 << 20):
                f.write(chunk)
        tags = saved_tags(part)
    except Exception as e:  # requests errors, a full disk, a truncated stream
        part.unlink(missing_ok=True)
        raise GuestError(f"saving the host's images failed: {type(e).__name__}: {str(e)[:200]}") from None
    if not set(names) <= tags:
        part.unlink(missing_ok=True)
        raise GuestError(f"the saved images lack {sorted(set(names) - tags)}: the engine's export was incomplete")
    part.rename(tar)
    say(f"saved {len(names)} host images in {time.monotonic() - t0:.0f} s ({tar.stat().st_size / 2**20:.0f} MiB)")
    return tar, names


def saved_tags(tar: Path) -> set[str]:
    """The tags a `docker save` tarball's manifest.json names (raises if it has none)."""
    import tarfile

    with tarfile.open(tar) as t:
        f = t.extractfile("manifest.json")
        if f is None:
            raise ValueError("no manifest.json")
        return {tag for entry in json.load(f) for tag in entry.get("RepoTags") or []}


# --------------------------------------------------------------------------- boot


def qemu_command(image: Path, disk: Path, snapshot: bool, accel: str, images: Path, share_in: Path, share_out: Path,
                 smp: int, mem_mb: int) -> list[str]:
    cpu = "host" if accel == "kvm" else "max"
    fmt = "qcow2" if disk.suffix == ".qcow2" else "raw"
    return [
        "qemu-system-x86_64", "-machine", f"q35,accel={accel}", "-cpu", cpu, "-smp", str(smp), "-m", str(mem_mb),
        "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"), "-append", CMDLINE,
        # a full disk is an I/O error in the guest (werror=report), not a VM paused until the timeout
        "-drive", f"file={disk},format={fmt},if=virtio,snapshot={'on' if snapshot else 'off'},cache=unsafe,"
                  "werror=report,rerror=report",
        "-virtfs", f"local,path={ROOT},mount_tag=project,security_model=none,readonly=on",
        "-virtfs", f"local,path={share_in},mount_tag=in,security_model=none,readonly=on",
        # the saved images as a read-only disk (the guest loads them from /dev/disk/by-id)
        "-drive", f"file={images},format=raw,if=none,id=images,readonly=on",
        "-device", "virtio-blk-pci,drive=images,serial=host-images",
        "-virtfs", f"local,path={share_out},mount_tag=out,security_model=none",
        "-nic", "none", "-display", "none", "-monitor", "none", "-serial", f"file:{share_out / 'console.log'}",
        "-no-reboot", "-pidfile", str(share_out / "qemu.pid"),
    ]


class Guest:
    """One QEMU process, stopped by its pid whatever happens."""

    def __init__(self, cmd: list[str], log: Path, tmpdir: Path):
        self.log = log
        with open(log, "wb") as out:
            # its own session (a Ctrl-C reaches the driver, which stops it), killed by the kernel
            # if the driver dies first (SIGKILL, a CI job's end); the snapshot's scratch file in tmpdir
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=die_with_parent,
                                         env={**os.environ, "TMPDIR": str(tmpdir)})

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def die_with_parent() -> None:
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def stop_leftover(pidfile: Path) -> None:
    """A QEMU an earlier run left (its driver killed before PDEATHSIG existed, say) is stopped
    by its pid before anything reads the shares it writes to."""
    try:
        pid = int(pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return
    if b"qemu-system" in cmdline and str(pidfile).encode() in cmdline:
        say(f"stopping a guest an earlier run left (pid {pid})")
        os.kill(pid, signal.SIGKILL)
        for _ in range(50):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.1)
    pidfile.unlink(missing_ok=True)


def follow(log: Path, pos: int) -> int:
    """Print what the guest appended to its log since ``pos``; the new position."""
    try:
        with open(log, "rb") as f:
            f.seek(pos)
            data = f.read()
    except FileNotFoundError:
        return pos
    if b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]
        for line in data.decode(errors="replace").splitlines():
            print(f"  guest | {line}", flush=True)
        return pos + len(data)
    return pos


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


class Booter:
    """Boots the guest for one phase (provision or test) and follows it; picks the accelerator
    on the first boot (KVM when its kernel prints within 20 s, else emulation) and keeps it."""

    def __init__(self, image: Path, images: Path, share_in: Path, env: dict[str, str], accel: str, deadline_s: float):
        self.image, self.images, self.share_in, self.env = image, images, share_in, env
        self.accel, self.deadline_s = accel, deadline_s
        if self.accel == "auto":
            self.accel = "kvm?" if kvm_usable() else "tcg"

    def __call__(self, mode: str, disk: Path, snapshot: bool) -> str:
        if self.accel == "kvm?":
            say(f"{mode}: trying KVM (emulation if its kernel prints nothing within 20 s) ...")
            result = self._boot(mode, disk, snapshot, "kvm", probe_s=20)
            if result != "no-boot":
                self.accel = "kvm"
                return result
            say("KVM did not boot the guest (a nested host?): emulating (TCG) instead")
            self.accel = "tcg"
        say(f"{mode}: booting the guest ({self.accel}{', emulated: slow' if self.accel == 'tcg' else ''}) ...")
        return self._boot(mode, disk, snapshot, self.accel)

    def _boot(self, mode: str, disk: Path, snapshot: bool, accel: str, probe_s: float | None = None) -> str:
        """'done', 'timeout', or 'no-boot' when QEMU exits at once or (``probe_s``) its kernel
        printed nothing within that many seconds, 'no-status' when it ended without writing
        this boot's nonce back."""
        nonce = os.urandom(8).hex()
        env = {**self.env, "HARNESS_GUEST_MODE": mode, "HARNESS_GUEST_ACCEL": accel, "HARNESS_GUEST_NONCE": nonce}
        (self.share_in / "env").write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()))
        clear_out()
        smp = max(1, min(2, os.cpu_count() or 1))
        g = Guest(qemu_command(self.image, disk, snapshot, accel, self.images, self.share_in, OUT, smp, 3072),
                  OUT / "qemu.log", cache_root())
        t0, pos = time.monotonic(), 0
        try:
            while g.proc.poll() is None:
                time.sleep(1)
                pos = follow(OUT / "inside.log", pos)
                now = time.monotonic() - t0
                if probe_s is not None and now > probe_s and b"Linux version" not in read_bytes(OUT / "console.log"):
                    return "no-boot"
                if now > self.deadline_s:
                    say(f"the guest did not finish within {self.deadline_s:.0f} s; stopping it (pid {g.proc.pid})")
                    return "timeout"
            follow(OUT / "inside.log", pos)
            if g.proc.returncode not in (0, None):
                say(f"qemu exited {g.proc.returncode}: {g.output().strip()[-400:]}")
            if b"Linux version" not in read_bytes(OUT / "console.log"):
                return "no-boot"
            # the status is this boot's only if the guest echoed this boot's nonce
            return "done" if read_bytes(OUT / "nonce").strip() == nonce.encode() else "no-status"
        finally:
            g.stop()


OUT_FILES = ("inside.log", "status", "nonce", "console.log", "qemu.log", "junit.xml", "junit-cgroupfs.xml")


def clear_out() -> None:
    """No file of an earlier run is ever read (or uploaded by CI) as this one's."""
    stop_leftover(OUT / "qemu.pid")
    for f in OUT_FILES:
        (OUT / f).unlink(missing_ok=True)


def exclusive() -> object:
    """One run per cache at a time (two guests would share the shares and both cores)."""
    import fcntl

    cache_root().mkdir(parents=True, exist_ok=True)
    f = open(cache_root() / "lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        raise GuestError(f"another test-cgroup2 is running (pid {f.read().strip() or '?'}) on {cache_root()}") from None
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    return f


def provisioned(image: Path, tar: Path, boot: Booter) -> Path:
    """A copy-on-write overlay of the root disk with the host's images loaded into the guest's
    engine, cached beside the image by the images' ids (loading ~1 GiB takes minutes emulated)."""
    overlay = image / f"{tar.stem}.qcow2"
    if (image / f"{tar.stem}.done").is_file() and overlay.is_file():
        say(f"host images already loaded in {overlay.name}")
        return overlay
    for old in [*image.glob("images-*.qcow2"), *image.glob("images-*.done")]:
        old.unlink()
    p = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(image / "root.img"), str(overlay)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise GuestError(f"qemu-img create failed: {p.stderr.strip()[-300:]}")
    t0 = time.monotonic()
    result = boot("provision", overlay, snapshot=False)
    status = read_bytes(OUT / "status").strip()
    if result != "done" or status != b"0":
        overlay.unlink(missing_ok=True)
        tar.unlink(missing_ok=True)  # saved anew next time (seconds), in case it was the tar
        raise GuestError(f"loading the host's images into the guest failed ({result}, status {status.decode() or '-'}); "
                         f"see {OUT / 'inside.log'} and {OUT / 'console.log'}")
    (image / f"{tar.stem}.done").write_text(f"{time.monotonic() - t0:.0f}\n")
    say(f"host images loaded into the guest in {time.monotonic() - t0:.0f} s ({du(overlay)})")
    return overlay


def run(args: argparse.Namespace) -> int:
    check_host()
    _lock = exclusive()  # noqa: F841 (held until the process exits)
    t_all = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    clear_out()
    check_space(cold=args.force or not any(cache_root().glob("guest-*/done.json")))
    image = build_image(args.force)
    cache = cache_root()
    share_in = cache / "in"
    share_in.mkdir(parents=True, exist_ok=True)
    tar, names = save_images(cache)
    env = {"HARNESS_GUEST_PYTEST": os.environ.get("HARNESS_GUEST_PYTEST", ""), "HARNESS_GUEST_IMAGES": " ".join(names),
           # the checkout's path in the guest is the host's: per-task image tags carry a digest of
           # the suite's path
           "HARNESS_GUEST_ROOT": str(ROOT)}
    OUT.mkdir(parents=True, exist_ok=True)
    boot = Booter(image, tar, share_in, env, args.accel, float(os.environ.get("HARNESS_GUEST_TIMEOUT", "2700")))
    disk = provisioned(image, tar, boot)
    t_test = time.monotonic()
    result = boot("test", disk, snapshot=True)
    return finish(result, boot.accel, t_all, t_test)


def finish(result: str, accel: str, t_all: float, t_test: float) -> int:
    """The tests' status, trusted only with its evidence: this boot's status file and JUnit
    reports that ran tests, skipped none, and agree with it."""
    took = time.monotonic() - t_test
    if result != "done":
        tail = "\n".join(read_bytes(OUT / "console.log").decode(errors="replace").splitlines()[-25:])
        what = {"timeout": "timed out", "no-status": "ended without this boot's status"}.get(result, "did not boot")
        say(f"the guest {what} ({accel}, {took:.0f} s); console tail:\n{tail}")
        return 1
    raw = read_bytes(OUT / "status").strip()
    status = int(raw) if raw.isdigit() else 1
    counts = {}
    for r in (OUT / "junit.xml", OUT / "junit-cgroupfs.xml"):
        try:
            counts[r.name] = junit_counts(r)
        except (OSError, ValueError) as e:
            say(f"{r.name}: unreadable or missing ({type(e).__name__}); the tests did not all run")
            status = status or 1
    summary = "; ".join(f"{name}: {c['tests']} tests, {c['failures']} failed, {c['errors']} errors, {c['skipped']} skipped"
                        for name, c in counts.items())
    bad = [n for n, c in counts.items() if c["tests"] == 0 or c["skipped"] or c["failures"] or c["errors"]]
    if bad and status == 0:
        say(f"{', '.join(bad)}: no tests, a skip or a failure, though the guest exited 0")
        status = 1
    say(f"guest ({accel}) tests took {took:.0f} s (all: {time.monotonic() - t_all:.0f} s): {summary or 'no JUnit report'}; exit {status}")
    say(f"JUnit: {OUT}/junit*.xml  log: {OUT / 'inside.log'}  console: {OUT / 'console.log'}")
    return status


def junit_counts(path: Path) -> dict[str, int]:
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise ValueError(str(e)) from None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    return {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Example: sudo make test-cgroup2")
    ap.add_argument("what", nargs="?", default="run", choices=["run", "build", "check"],
                    help="run (default: build if needed, boot, test), build (the image only) or check (root, tools, cache)")
    ap.add_argument("--force", action="store_true", help="rebuild the guest image even when its inputs are unchanged")
    ap.add_argument("--accel", default="auto", choices=["auto", "kvm", "tcg"],
                    help="KVM, emulation, or auto (KVM when it boots the guest)")
    args = ap.parse_args(argv)

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    # a CI timeout or kill stops the guest too (Guest.stop in boot's finally)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        if args.what == "check":
            check_host()
            cache_root()
            return 0
        if args.what == "build":
            check_host()
            _lock = exclusive()  # noqa: F841
            build_image(args.force)
            return 0
        return run(args)
    except GuestError as e:
        print(f"test-cgroup2: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("test-cgroup2: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
