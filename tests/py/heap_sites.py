"""Holds heap blocks allocated at two known lines: `big` keeps 40 blocks
of 256 KiB (BIG-LINE), `small` 40 of 64 KiB (SMALL-LINE). Started before
the tracer attaches; `go` allocates, `exit` ends."""
import sys

keep = []


def big():
    for _ in range(40):
        keep.append(bytearray(256 * 1024))  # BIG-LINE


def small():
    for _ in range(40):
        keep.append(bytearray(64 * 1024))  # SMALL-LINE


print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "go":
        big()
        small()
        print("done", len(keep), flush=True)
    elif line.strip() == "exit":
        break
