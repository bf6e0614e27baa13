"""Per process kind (postgres, the tundra process) and system call: count, median and mean
microseconds and total milliseconds, from a `perf trace -a` text (plain or .xz)."""
import lzma
import re, sys, statistics, collections
d = collections.defaultdict(list)
opener = lzma.open if sys.argv[1].endswith(".xz") else open
for line in opener(sys.argv[1], "rt"):
    m = re.search(r"\(\s*([\d.]+) ms\):\s+(\S+?)/\d+\s+(?:\.\.\. \[continued\]: )?(\w+)\(", line)
    if not m: continue
    dur, comm, call = float(m.group(1)) * 1000, m.group(2), m.group(3)
    if dur > 1e6: continue
    kind = "postgres" if comm.startswith("postgres") else ("tundra" if comm.startswith("tundra") else comm)
    d[(kind, call)].append(dur)
for k, v in sorted(d.items()):
    if len(v) >= 20:
        print(k, len(v), "median us", round(statistics.median(v)), "mean us", round(statistics.mean(v)), "sum ms", round(sum(v)/1000))
