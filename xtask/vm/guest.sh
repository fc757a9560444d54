#!/bin/bash
# Runs inside a `cargo xtask vm-test` guest, as root: sets up the memory
# controller as asked, runs `tracer doctor`, then each test binary of
# OUT/plan (one per line: path, then tab-separated name filters) with
# CI=true, writing BINARY.log into OUT for the host to read; then the
# benchmarks of OUT/bench, if any.
#
#   guest.sh v2|v1 OUT BINDIR
MODE=$1; OUT=$2; BIN=$3
exec > >(tee "$OUT/guest.log") 2>&1
setup_failed() { echo "$*" > "$OUT/setup-failed"; echo "guest setup failed: $*"; exit 1; }
echo "guest: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime) s, cgroup $MODE"
[ -r /sys/kernel/btf/vmlinux ] || setup_failed "no /sys/kernel/btf/vmlinux"
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug
unmount_cgroups() {
  for m in $(awk '$2 ~ "^/sys/fs/cgroup/" {print $2}' /proc/mounts | sort -r); do umount "$m"; done
  if mountpoint -q /sys/fs/cgroup; then umount /sys/fs/cgroup; fi
}
if [ "$MODE" = v2 ]; then
  if ! grep -q '^cgroup2 /sys/fs/cgroup cgroup2' /proc/mounts; then
    unmount_cgroups
    mount -t cgroup2 cgroup2 /sys/fs/cgroup || setup_failed "mount cgroup2"
  fi
  echo +memory > /sys/fs/cgroup/cgroup.subtree_control || setup_failed "enable +memory"
else # hybrid, as on a systemd host with the legacy memory controller
  unmount_cgroups
  mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup
  mkdir -p /sys/fs/cgroup/memory /sys/fs/cgroup/unified
  mount -t cgroup -o memory cgroup /sys/fs/cgroup/memory || setup_failed "mount cgroup v1 memory"
  mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified || true
fi
grep cgroup /proc/mounts
# The tests' temporary files (the host's file system is read-only here),
# on a disk as a node has them: an ext4 file system through a loop device.
# Page cache there can be reclaimed; tmpfs's cannot without swap, and the
# reclaim test needs some.
mountpoint -q /tmp || mount -t tmpfs tmpfs /tmp
modprobe -q loop 2>/dev/null; modprobe -q ext4 2>/dev/null
truncate -s 1G /tmp/disk.img && mkfs.ext4 -q -F /tmp/disk.img \
  || setup_failed "mkfs.ext4 of the scratch disk"
mkdir -p /tmp/disk
mount -o loop /tmp/disk.img /tmp/disk \
  || setup_failed "mount the scratch disk (loop, ext4): $(grep -E 'ext4|loop' /proc/filesystems /proc/devices | tr '\n' ' ')"
chmod 1777 /tmp/disk
# Software emulation runs the tests some twenty times slower: their waits
# stretch as much (tests/src/lib.rs, scaled).
export TMPDIR=/tmp/disk CI=true TRACER_VM_GUEST=1 RUST_BACKTRACE=1 TRACER_E2E_TIME_SCALE=${TRACER_E2E_TIME_SCALE:-20}
# The table on stdout; the debug log (with any verifier log) apart.
"$BIN/tracer" --log-level debug doctor > "$OUT/doctor.txt" 2> "$OUT/doctor.log"
echo "doctor exit $?"
# One run per filter, so that a failure's message is written when it
# happens, not after every other test of the binary.
while IFS=$'\t' read -r -a line; do
  exe=${line[0]}; name=$(basename "$exe"); filters=("${line[@]:1}")
  [ ${#filters[@]} -eq 0 ] && filters=("")
  i=0
  for f in "${filters[@]}"; do
    start=$(date +%s)
    "$exe" --test-threads=1 $f > "$OUT/$name.$i.log" 2>&1
    echo "$name ${f:-(all)} exit $? in $(( $(date +%s) - start )) s"
    i=$((i + 1))
  done
done < "$OUT/plan"
# Benchmarks (`vm-test --bench`): one command per line, tab-separated; the
# figures (stdout) to BENCH.N.md, the rest to BENCH.N.log, the exit code to
# BENCH.N.exit.
if [ -r "$OUT/bench" ]; then
  i=0
  while IFS=$'\t' read -r -a cmd; do
    start=$(date +%s)
    "${cmd[@]}" > "$OUT/bench.$i.md" 2> "$OUT/bench.$i.log"
    rc=$?
    echo "$rc" > "$OUT/bench.$i.exit"
    echo "bench ${cmd[*]:1} exit $rc in $(( $(date +%s) - start )) s"
    i=$((i + 1))
  done < "$OUT/bench"
fi
echo "guest: done"
