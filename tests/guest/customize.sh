#!/bin/sh
# mmdebstrap customize hook of the cgroup v2 guest (tests/guest/cgroup2.py): $1 is the root
# directory being built, on the host. Everything the guest needs at run time comes in over
# 9p when it boots; what is baked in here is what must not be fetched there (Python wheels,
# the host's CA store and apt sources, so image inputs computed in the guest match the host's).
set -eu
root="$1"
chrooted() { env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 chroot "$root" "$@"; }

# The project's Python dependencies at the versions of the host's venv, from wheels the host
# fetched; no index is reachable from the guest.
mkdir -p "$root/tmp/wheels"
cp "$GUEST_WHEELS"/*.whl "$root/tmp/wheels/"
cp "$GUEST_REQUIREMENTS" "$root/tmp/wheels/requirements.txt"
chrooted python3 -m venv /opt/harness-venv
chrooted /opt/harness-venv/bin/pip install -q --disable-pip-version-check --no-index \
  --find-links /tmp/wheels -r /tmp/wheels/requirements.txt
rm -rf "$root/tmp/wheels"
printf '#!/bin/sh\nexec /opt/harness-venv/bin/python -m harness "$@"\n' > "$root/usr/local/bin/harness"
chmod 0755 "$root/usr/local/bin/harness"

# The host's CA store (what a build's pip / apt trust: harness passes it into image builds,
# and it is part of their inputs) and apt sources (part of the offline base's inputs).
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
rm -f "$root/etc/apt/sources.list" "$root/etc/apt/sources.list.d/"*
[ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$root/etc/apt/sources.list"
for f in /etc/apt/sources.list.d/*; do [ -f "$f" ] && cp "$f" "$root/etc/apt/sources.list.d/"; done

# A fixed machine id (every boot of the read-only image would otherwise be a first boot that
# re-applies unit presets), no timers, no login prompt on the console.
echo 8f3c2a51d6e04b7c9a1e5f2b3c4d5e6f > "$root/etc/machine-id"
echo harness-guest > "$root/etc/hostname"
for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer serial-getty@ttyS0.service \
         getty@tty1.service systemd-timesyncd.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$u"
done
printf 'LABEL=guestroot / ext4 rw,noatime 0 0\n' > "$root/etc/fstab"
mkdir -p "$root/etc/docker"
printf '{"exec-opts": ["native.cgroupdriver=systemd"], "log-level": "warn"}\n' > "$root/etc/docker/daemon.json"

# At boot: mount the shares and run the checkout's tests/guest/inside.sh, then power off
# (whatever it exits with: the host reads the status file; the unit's actions are a fallback).
cat > "$root/usr/local/sbin/harness-guest" <<'SH'
#!/bin/sh
set -u
modprobe -a 9pnet_virtio 9p 2>/dev/null
for tag in project in out; do
  mkdir -p "/mnt/$tag"
  opts=trans=virtio,version=9p2000.L,msize=524288
  [ "$tag" = out ] || opts="$opts,ro"
  mount -t 9p -o "$opts" "$tag" "/mnt/$tag" || { echo "harness-guest: cannot mount the $tag share" > /dev/console; exit 1; }
done
echo "harness-guest: up $(cat /proc/uptime | cut -d' ' -f1)s after boot" >> /mnt/out/inside.log
bash /mnt/project/tests/guest/inside.sh >> /mnt/out/inside.log 2>&1
echo $? > /mnt/out/status
sync -f /mnt/out/status
# off at once: the root disk is a throw-away snapshot, the shares are written through
echo o > /proc/sysrq-trigger
SH
chmod 0755 "$root/usr/local/sbin/harness-guest"
cat > "$root/etc/systemd/system/harness-guest.service" <<'UNIT'
[Unit]
Description=harness cgroup v2 checks (tests/guest/inside.sh from the 9p share)
Wants=docker.service
After=docker.service containerd.service
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/harness-guest
TimeoutStartSec=infinity
StandardOutput=journal+console
SuccessAction=poweroff-force
FailureAction=poweroff-force
[Install]
WantedBy=multi-user.target
UNIT
ln -sf ../harness-guest.service "$root/etc/systemd/system/multi-user.target.wants/harness-guest.service"
