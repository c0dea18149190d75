#!/bin/bash
# BFQ weights against a blk-throttle cap on cgroup v1, scenario 1's pair without the agent:
# a 4 KiB QD1 random reader alone for 4 s, then a 1 MiB QD32 O_DIRECT writer for 18 s, each
# in a blkio cgroup of its own. Switches DISK's scheduler for the run and puts it back.
# Usage (root): DISK=vda benches/scripts/bfq-vs-cap.sh LABEL SCHEDULER READER_WEIGHT \
#   WRITER_WEIGHT WRITER_CAP_BPS   (cap 0: none). Files go in /var/tmp/iso-bfq (5 GiB),
#   which must hold r.dat (1 GiB) and w.dat (4 GiB), written once beforehand.
set -u
DISK=${DISK:-vda}
DEV=$(cat /sys/block/$DISK/dev)
D=/var/tmp/iso-bfq; B=/sys/fs/cgroup/blkio
label=$1 sched=$2 rw=$3 ww=$4 cap=$5
old=$(sed 's/.*\[\(.*\)\].*/\1/' /sys/block/$DISK/queue/scheduler)
trap 'echo $old > /sys/block/$DISK/queue/scheduler; echo "$DEV 0" > $B/iso-bfq-w/blkio.throttle.write_bps_device 2>/dev/null; rmdir $B/iso-bfq-r $B/iso-bfq-w 2>/dev/null' EXIT
echo $sched > /sys/block/$DISK/queue/scheduler
mkdir -p $B/iso-bfq-r $B/iso-bfq-w
if [ $sched = bfq ]; then echo $rw > $B/iso-bfq-r/blkio.bfq.weight; echo $ww > $B/iso-bfq-w/blkio.bfq.weight; fi
echo "$DEV $cap" > $B/iso-bfq-w/blkio.throttle.write_bps_device
bash -c "echo \$\$ > $B/iso-bfq-r/cgroup.procs; exec fio --name=r --filename=$D/r.dat --size=1G --rw=randread --bs=4k --direct=1 --ioengine=psync --time_based --runtime=24 --output-format=json --output=$D/r.json" &
sleep 4
bash -c "echo \$\$ > $B/iso-bfq-w/cgroup.procs; exec fio --name=w --filename=$D/w.dat --size=4G --rw=write --bs=1M --direct=1 --ioengine=libaio --iodepth=32 --time_based --runtime=18 --output-format=json --output=$D/w.json"
wait
python3 - "$label" <<'PY'
import json,sys
r=json.load(open('/var/tmp/iso-bfq/r.json'))['jobs'][0]['read']
w=json.load(open('/var/tmp/iso-bfq/w.json'))['jobs'][0]['write']
p=r['clat_ns']['percentile']
print("%-28s reader p99.9 %7.2f ms (whole run, incl. 4 s solo) iops %6.0f | writer %5.0f MB/s" % (sys.argv[1], p['99.900000']/1e6, r['iops'], w['bw_bytes']/1e6))
PY
