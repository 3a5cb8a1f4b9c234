#!/usr/bin/env bash
# A real aarch64 check, run by hand (not in CI): an arm64 Debian userland under
# qemu-user emulation installs the wheel built from this checkout with [infer]
# and [train] from the package index, then runs there
#   1. ursa doctor against the host's broker,
#   2. python -m ursa.bench.footprint --steps (import times and peak RSS, one
#      local training round, an ONNX inference in a torch-free process),
#   3. a selection-only device (`ursa device run`) in a federation whose
#      Mosquitto, coordinator (`ursa coordinator serve`) and two other
#      devices run on the host,
# and prints versions, times and RSS. Under emulation every figure is that of
# qemu-user on this host, not of a Raspberry Pi: read them as "it runs", and
# the RSS as an upper bound (it includes qemu's translated-code cache).
#
# Usage (as root, on a Debian/Ubuntu x86_64 host with network access to
# deb.debian.org and the Python package index):
#   sudo bash tools/platform/arm64_check.sh [--dir DIR] [--suite bookworm|trixie]
#        [--wheel PATH] [--key-bits N] [--rounds N]
# DIR (default /var/tmp/ursa-arm64) keeps the userland between runs: the first
# run debootstraps it (tens of minutes under emulation), later runs reuse it.
# Output goes to stdout and DIR/arm64-check.log.
set -euo pipefail

dir=/var/tmp/ursa-arm64
suite=bookworm
wheel=
key_bits=2048
rounds=2
mirror=${URSA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
while [ $# -gt 0 ]; do
    case $1 in
        --dir) dir=$2; shift 2 ;;
        --suite) suite=$2; shift 2 ;;
        --wheel) wheel=$2; shift 2 ;;
        --key-bits) key_bits=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "arm64_check: unknown argument $1" >&2; exit 2 ;;
    esac
done

if [ "$(id -u)" != 0 ]; then
    echo "arm64_check: run as root (debootstrap, chroot, binfmt_misc)" >&2
    exit 1
fi
repo=$(cd "$(dirname "$0")/../.." && pwd)
root=$dir/rootfs-$suite
fed=$dir/federation
mkdir -p "$dir"
exec > >(tee "$dir/arm64-check.log") 2>&1
started=$SECONDS
say() { printf '\n== %s (%d s)\n' "$*" "$((SECONDS - started))"; }

# -- host tools ---------------------------------------------------------------
say "host tools"
missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
[ -x /usr/bin/qemu-aarch64-static ] || missing+=(qemu-user-static)
command -v update-binfmts >/dev/null || missing+=(binfmt-support)
command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || missing+=(mosquitto)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
mosquitto_bin=$(command -v mosquitto || echo /usr/sbin/mosquitto)
# Emulation: the kernel runs aarch64 binaries through qemu once binfmt_misc
# knows the format (a container may need the mount first).
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
echo "host: $(uname -m), $(/usr/bin/qemu-aarch64-static --version | head -1)"

host_python=$repo/.venv/bin/python
[ -x "$host_python" ] || host_python=$(command -v python3)
host_ursa=("$host_python" -m ursa.tools.cli)
"$host_python" -c "import ursa" 2>/dev/null || {
    echo "arm64_check: the host needs ursa installed (bash .ci/setup)" >&2; exit 1; }

# -- the arm64 userland (idempotent: a marker says debootstrap finished) -------
say "arm64 Debian $suite userland in $root"
if [ ! -e "$root/.ursa-rootfs-ok" ]; then
    rm -rf "$root"
    debootstrap --arch=arm64 --variant=minbase \
        --include=python3,python3-venv,ca-certificates \
        "$suite" "$root" "$mirror" >"$dir/debootstrap.log" 2>&1 \
        || { tail -20 "$dir/debootstrap.log"; exit 1; }
    touch "$root/.ursa-rootfs-ok"
else
    echo "reusing it (remove $root to start over)"
fi
mounted=()
cleanup_mounts() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" || true; done
}
mount_once() {  # mount_once TARGET mount-args...
    local target=$1; shift
    mountpoint -q "$target" && return 0
    mount "$@" "$target"
    mounted+=("$target")
}
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    cleanup_mounts
}
trap cleanup EXIT
mount_once "$root/proc" -t proc proc
# No /sys: with the x86_64 host's CPU topology in /sys, onnxruntime's cpuinfo
# (aarch64) crashes the interpreter at import under qemu-user (SIGSEGV, seen
# with onnxruntime 1.32.0 and qemu 7.2); without it, cpuinfo warns and falls back.
mount_once "$root/dev" --bind /dev
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The host's CA bundle too, for networks that inspect TLS with their own CA.
mkdir -p "$root/opt/ursa"
cp /etc/ssl/certs/ca-certificates.crt "$root/opt/ursa/host-ca-bundle.crt"
in_arm64() {  # run a bash command line in the userland, clean environment
    chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
        PATH=/opt/ursa/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        PIP_CERT=/opt/ursa/host-ca-bundle.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
        /bin/bash -c "$1"
}
# shellcheck disable=SC2016  # expanded in the userland
in_arm64 'echo "arm64: $(uname -m), $(python3 --version), glibc $(ldd --version | head -1 | grep -o "[0-9.]*$")"'

# -- the wheel ----------------------------------------------------------------
say "wheel"
if [ -z "$wheel" ]; then
    rm -rf "$dir/dist"
    "$host_python" -m build --wheel --outdir "$dir/dist" "$repo" >"$dir/build.log" 2>&1 \
        || { tail -20 "$dir/build.log"; exit 1; }
    wheel=$(ls "$dir"/dist/ursa_fl-*.whl)
fi
wheel_name=$(basename "$wheel")
cp "$wheel" "$root/opt/ursa/$wheel_name"
echo "$wheel_name"

say "pip install '${wheel_name}[infer,train]' in a venv (arm64, from the package index)"
t0=$SECONDS
in_arm64 "set -e
[ -x /opt/ursa/venv/bin/python ] || python3 -m venv /opt/ursa/venv
pip install -q '/opt/ursa/${wheel_name}[infer,train]'
pip install -q --force-reinstall --no-deps '/opt/ursa/$wheel_name'"
echo "pip install took $((SECONDS - t0)) s (emulated)"
in_arm64 'python - <<EOF
from importlib import metadata
names = ["ursa-fl", "numpy", "torch", "onnx", "onnxruntime", "gmpy2", "phe", "paho-mqtt"]
print(", ".join(f"{n} {metadata.version(n)}" for n in names))
EOF
du -sm /opt/ursa/venv | cut -f1 | sed "s/$/ MB installed in the venv (with .pyc)/"'

# -- the host's broker, coordinator and two devices -----------------------------
say "host: Mosquitto, coordinator (key_bits $key_bits, $rounds rounds), dev002, dev003"
rm -rf "$fed" && mkdir -p "$fed"
port=$("$host_python" - "$fed" <<'EOF'
import sys
from pathlib import Path

import numpy as np

from ursa.tools.broker.mosquitto import free_port, write_mosquitto_config

out = Path(sys.argv[1])
port = free_port()
files = write_mosquitto_config(
    out / "broker", devices=["dev001", "dev002", "dev003"], port=port,
    persistence_dir=None, run_as_user="root", log_to_stderr=True,
)
for user, password in files.credentials.items():
    (out / f"{user}.password").write_text(password)
rng = np.random.default_rng(0)
for i, major in enumerate((0, 3, 7), start=1):  # skewed: one dominant class each
    labels = np.where(rng.random(200) < 0.8, major, rng.integers(0, 10, 200))
    np.save(out / f"dev00{i}-labels.npy", labels)
print(port)
EOF
)
url="mqtt://127.0.0.1:$port"
"$mosquitto_bin" -c "$fed/broker/mosquitto.conf" >"$fed/mosquitto.log" 2>&1 &
pids+=($!)
cat >"$fed/coordinator.toml" <<EOF
federation = "arm64check"
state_dir = "$fed/coordinator"
min_devices = 3
k = 2
tries = 2
rounds = $rounds
key_bits = $key_bits
[broker]
url = "$url"
username = "coordinator"
[enrolment]
mode = "tofu"
[deadlines]
key_epoch_s = 600
registration_s = 600
volunteer_s = 120
distributions_s = 120
agent_s = 300
[[methods]]
kind = "dubhe"
EOF
device_toml() {  # device_toml ID DIR
    cat <<EOF
device_id = "$1"
federation = "arm64check"
state_dir = "$2/$1"
labels_file = "$2/$1-labels.npy"
obfuscator_pool_size = 2
[broker]
url = "$url"
username = "$1"
[[methods]]
kind = "dubhe"
EOF
}
sleep 1
for dev in dev002 dev003; do
    device_toml "$dev" "$fed" >"$fed/$dev.toml"
    URSA_BROKER__PASSWORD=$(cat "$fed/$dev.password") \
        "${host_ursa[@]}" --log-level INFO device run --config "$fed/$dev.toml" \
        >"$fed/$dev.log" 2>&1 &
    pids+=($!)
done

# -- in the arm64 userland: doctor, footprint, the device ----------------------
say "arm64: ursa doctor --host 127.0.0.1 --port $port"
in_arm64 "ursa doctor --host 127.0.0.1 --port $port" || echo "(doctor exited $?)"

say "arm64: python -X faulthandler -c 'import onnxruntime' (its stderr, if it fails)"
in_arm64 'python -X faulthandler -c "import onnxruntime; print(\"onnxruntime\", onnxruntime.__version__, \"imports\")" 2>&1 | grep -v "^  File" | head -12' || true

say "arm64: python -m ursa.bench.footprint --repeats 3 --steps"
in_arm64 'cd /tmp && python -m ursa.bench.footprint --repeats 3 --steps' \
    || echo "(a footprint probe failed: see its FAILED line)"

say "arm64: ursa device run (dev001, selection-only) against the host's coordinator"
# A fresh device state each run: a kept one pins the previous run's coordinator.
rm -rf "$root/opt/ursa/fed" && mkdir -p "$root/opt/ursa/fed"
cp "$fed/dev001-labels.npy" "$root/opt/ursa/fed/"
device_toml dev001 /opt/ursa/fed >"$root/opt/ursa/fed/dev001.toml"
password=$(cat "$fed/dev001.password")
chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
    URSA_BROKER__PASSWORD="$password" \
    /opt/ursa/venv/bin/ursa --log-level INFO device run \
    --config /opt/ursa/fed/dev001.toml >"$fed/dev001-arm64.log" 2>&1 &
arm_pid=$!
pids+=("$arm_pid")
t0=$SECONDS
URSA_BROKER__PASSWORD=$(cat "$fed/coordinator.password") \
    timeout 3600 "${host_ursa[@]}" --log-level INFO coordinator serve \
    --config "$fed/coordinator.toml" >"$fed/coordinator.log" 2>&1 \
    && served=0 || served=$?
took=$((SECONDS - t0))
peak=$(grep VmHWM "/proc/$arm_pid/status" 2>/dev/null | awk '{print $2}') || peak=
alive=no
kill -0 "$arm_pid" 2>/dev/null && alive=yes
echo "coordinator serve exited $served after $took s ($rounds rounds, key_bits $key_bits)"
echo "arm64 device still running at the end: $alive; peak RSS (qemu + Python): ${peak:-?} kB"
echo "--- coordinator log (selection lines)"
grep -iE "select|round|epoch" "$fed/coordinator.log" | tail -20 || true
echo "--- arm64 device log (last lines)"
tail -15 "$fed/dev001-arm64.log"
# Passed: the coordinator finished every round (a SIGTERM also exits 0, so its
# log must say so), the arm64 device decrypted the key epoch's registry (it
# took part), is still running, and refused nothing.
complete=no
grep -q "all $rounds rounds complete" "$fed/coordinator.log" && complete=yes
joined=no
grep -q "dev001: registry of 3 devices decrypted" "$fed/dev001-arm64.log" && joined=yes
errors=$(grep -cE "Traceback|ERROR|refused" "$fed/dev001-arm64.log" || true)
say "done"
if [ "$served" != 0 ] || [ "$complete" != yes ] || [ "$joined" != yes ] \
    || [ "$alive" != yes ] || [ "$errors" != 0 ]; then
    echo "arm64 check FAILED: serve exit $served, all rounds complete $complete," \
        "device took part $joined, still running $alive, $errors error lines"
    exit 1
fi
echo "arm64 check passed: logs in $fed, this output in $dir/arm64-check.log"
