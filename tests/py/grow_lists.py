"""Grows a list in a known function and line until its memory cgroup's
limit kills it. The growth tests look for `grow` at the line marked
GROW-LINE, called from `main` at CALL-LINE."""
import sys


def grow(x):
    while True:
        x.append([0] * 1000)  # GROW-LINE


def main():
    print("ready", flush=True)
    sys.stdin.readline()
    grow([])  # CALL-LINE


main()
