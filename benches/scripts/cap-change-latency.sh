#!/bin/bash
# What a blk-throttle cap change does to a neighbour's latency in the first seconds after it,
# cgroup v1, no agent: a 4 KiB QD1 random reader and a 1 MiB QD32 O_DIRECT writer, each in a
# blkio cgroup of its own, while the writer's cap alternates LO and HI MB/s every PERIOD s,
# N times. Prints the reader's p99 / p99.9 / max per half second after a raise and after a
# cut, pooled over the changes: a burst of queued writes released by a raise would show in
# the first half second. Runs PERIOD*N+10 s.
# Usage (root): DISK=vda LO=150 HI=300 PERIOD=6 N=30 benches/scripts/cap-change-latency.sh
#   Files go in /var/tmp/iso-capchange (12 GiB: r.dat 4 GiB, w.dat 8 GiB, written once here).
set -u
DISK=${DISK:-vda} LO=${LO:-150} HI=${HI:-300} PERIOD=${PERIOD:-6} N=${N:-30}
DEV=$(cat /sys/block/$DISK/dev)
D=/var/tmp/iso-capchange; B=/sys/fs/cgroup/blkio
mkdir -p $D $B/iso-cc-r $B/iso-cc-w
trap 'kill $(jobs -p) 2>/dev/null; wait; rmdir $B/iso-cc-r $B/iso-cc-w 2>/dev/null' EXIT
for f in r.dat:4G w.dat:8G; do
  [ -f $D/${f%:*} ] || fio --name=mk --filename=$D/${f%:*} --size=${f#*:} --rw=write --bs=1M --direct=1 --output=/dev/null
done
echo "$DEV $((LO * 1000000))" > $B/iso-cc-w/blkio.throttle.write_bps_device
rm -f $D/r_clat.1.log $D/changes
bash -c "echo \$\$ > $B/iso-cc-r/cgroup.procs; exec fio --name=r --filename=$D/r.dat --rw=randread --bs=4k --direct=1 --ioengine=psync --time_based --runtime=$((PERIOD * N + 10)) --output=/dev/null --write_lat_log=$D/r --log_avg_msec=0 --log_unix_epoch=1" &
sleep 3
bash -c "echo \$\$ > $B/iso-cc-w/cgroup.procs; exec fio --name=w --filename=$D/w.dat --rw=write --bs=1M --direct=1 --ioengine=libaio --iodepth=32 --time_based --runtime=$((PERIOD * N + 4)) --output=/dev/null" &
sleep 4
for i in $(seq 1 $N); do
  c=$([ $((i % 2)) = 1 ] && echo $HI || echo $LO)
  echo "$DEV $((c * 1000000))" > $B/iso-cc-w/blkio.throttle.write_bps_device
  echo "$(date +%s%3N) $c" >> $D/changes
  sleep $PERIOD
done
wait
python3 - $D $PERIOD <<'PY'
import sys, collections
d, period = sys.argv[1], int(sys.argv[2])
changes = [tuple(map(int, l.split())) for l in open(d + '/changes')]
lat = [(int(f[0]), int(f[1])) for f in (l.split(',') for l in open(d + '/r_clat.1.log'))]
bins = collections.defaultdict(list)
for i, (t, cap) in enumerate(changes):
    kind = 'raise' if i == 0 or cap > changes[i - 1][1] else 'cut'
    for ts, ns in lat:
        if t <= ts < t + period * 1000:
            bins[(kind, (ts - t) // 500)].append(ns)
def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))] / 1e6 if v else float('nan')
for kind in ('raise', 'cut'):
    print(f"after a {kind}:")
    for k in range(period * 2):
        v = bins[(kind, k)]
        print(f"  {k / 2:4.1f}-{k / 2 + 0.5:.1f} s  n={len(v):6d}  p99 {q(v, .99):6.2f}  p99.9 {q(v, .999):6.2f}  max {q(v, 1):6.2f} ms")
PY
