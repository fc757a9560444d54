"""Faults in N MiB of fresh anonymous memory page by page from Python code
(the benchmark of Python frames in growth samples): `go` and `round`
touch the pages of a new mapping, unmap it, and print the ns per page;
`exit` ends."""
import mmap
import sys
import time


def touch_pages(n):
    m = mmap.mmap(-1, n)
    t = time.perf_counter_ns()
    for i in range(0, n, 4096):
        m[i] = 1
    dt = time.perf_counter_ns() - t
    m.close()
    return dt / (n // 4096)


mib = int(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd in ("go", "round"):
        print("ns/page %.1f" % touch_pages(mib << 20), flush=True)
    elif cmd == "exit":
        break
