"""Grows a list in a known function and line until its memory cgroup's
limit kills it. The growth tests look for `grow` at the line marked
GROW-LINE, called from `main` at CALL-LINE, or, with the argument
`thread`, from a thread of its own that `main` waits for."""
import sys
import threading


def grow(x):
    while True:  # LOOP-LINE
        x.append([0] * 1000)  # GROW-LINE


def main():
    # A few MiB before the test starts the growth: the recorder finds the
    # interpreter at this process's first samples, as it would for any
    # process that ran a while before it grew.
    warm = [[0] * 1000 for _ in range(1000)]
    print("ready", flush=True)
    sys.stdin.readline()
    warm.clear()
    if sys.argv[1:] == ["thread"]:
        t = threading.Thread(target=grow, args=([],))
        t.start()
        t.join()
    grow([])  # CALL-LINE


main()
