#!/usr/bin/env python3
"""What woken threads waited for: wake-up delays from a `perf sched record -a` trace.

For each thread named in --threads woken on --cpu, the time from its sched_waking to the
sched_switch that runs it; the quantiles of these delays; and, for the delays of at least
--min_ms, what ran on that CPU meanwhile (by thread name and kernel priority, 120 = nice
0, 139 = nice 19; SCHED_IDLE threads show 120). With --show=N, the N longest delays with
the CPU's timeline. bench/README.md, "What a woken thread waits", has the commands.

  perf script -i perf.data -F comm,tid,cpu,time,event,trace > sched.txt
  bench/sched_delays.py sched.txt --from=T0 --to=T1 \
      --threads=event_engine,default-executo,grpcpp_sync_ser,nexting_thread,writer
"""
import argparse
import bisect
import collections
import re
import sys

WAKING = re.compile(r'comm=(\S+) pid=(\d+) prio=\d+ target_cpu=(\d+)')
SWITCH = re.compile(r'prev_comm=\S+ prev_pid=\d+ prev_prio=\d+ prev_state=\S+ ==> '
                    r'next_comm=(\S+) next_pid=(\d+) next_prio=(\d+)')


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('trace', help='perf script output (fields comm,tid,cpu,time,event,trace)')
    ap.add_argument('--cpu', type=int, default=0)
    ap.add_argument('--from', dest='t0', type=float, default=0.0, help='first second (perf time)')
    ap.add_argument('--to', dest='t1', type=float, default=float('inf'))
    ap.add_argument('--threads', required=True, help='comma-separated thread names to follow')
    ap.add_argument('--min_ms', type=float, default=0.5)
    ap.add_argument('--show', type=int, default=0)
    a = ap.parse_args()
    follow = set(a.threads.split(','))
    cpu = '[%03d]' % a.cpu
    woken = {}  # tid -> (time, name)
    runs = []  # (start, end, name@prio) on the CPU
    current, since = None, None
    delays = []  # (delay, woken at, ran at, name)
    for line in open(a.trace):
        f = line.split()
        if len(f) < 5:
            continue
        try:
            t = float(f[3].rstrip(':'))
        except ValueError:
            continue
        if t < a.t0 or t > a.t1:
            continue
        if f[4] == 'sched:sched_waking:':
            m = WAKING.search(line)
            if m and m.group(1) in follow and int(m.group(3)) == a.cpu:
                woken[int(m.group(2))] = (t, m.group(1))
        elif f[4] == 'sched:sched_switch:' and f[2] == cpu:
            m = SWITCH.search(line)
            if not m:
                continue
            if current is not None:
                runs.append((since, t, current))
            current, since = '%s@%s' % (m.group(1), m.group(3)), t
            tid = int(m.group(2))
            if tid in woken:
                at, name = woken.pop(tid)
                delays.append((t - at, at, t, name))
    if not delays:
        sys.exit('no wake-up of %s on CPU %d in the window' % (a.threads, a.cpu))
    delays.sort()
    n = len(delays)
    print('%d wake-ups; delay p50 %.3f ms, p90 %.3f, p99 %.3f, p999 %.3f, max %.3f' % (
        n, *(delays[int(q * (n - 1))][0] * 1e3 for q in (0.5, 0.9, 0.99, 0.999)),
        delays[-1][0] * 1e3))
    starts = [r[0] for r in runs]

    def overlapping(at, until):
        i = max(0, bisect.bisect_right(starts, at) - 1)
        while i < len(runs) and runs[i][0] < until:
            yield runs[i]
            i += 1

    ran = collections.Counter()
    long_ones = [d for d in delays if d[0] * 1e3 >= a.min_ms]
    total = sum(d[0] for d in long_ones)
    for _, at, until, _ in long_ones:
        for start, end, name in overlapping(at, until):
            ran[name] += max(0.0, min(end, until) - max(start, at))
    print('%d delays of at least %.2f ms, %.1f ms in all; what ran on CPU %d meanwhile:' % (
        len(long_ones), a.min_ms, total * 1e3, a.cpu))
    for name, seconds in ran.most_common(15):
        print('  %-28s %8.1f ms  %5.1f%%' % (name, seconds * 1e3, 100 * seconds / max(total, 1e-12)))
    for delay, at, until, name in reversed(delays[-a.show:] if a.show else []):
        print('%s woken at %.6f waited %.2f ms:' % (name, at, delay * 1e3))
        for start, end, who in overlapping(at, until):
            print('  %.6f-%.6f %s' % (start, end, who))


if __name__ == '__main__':
    main()
