"""Allocates device memory through a CUDA runtime loaded with ctypes (the
path is the first argument: the simulated one in tests), from known lines:
`weights` takes 2 x 64 MiB (WEIGHTS-LINE), `workspace` 32 MiB
(WORKSPACE-LINE), and `scratch` 64 KiB (SCRATCH-LINE, under the size from
which allocations always carry their stack). `init` picks device 0, `go`
allocates, `small N` allocates N x 16 KiB (SMALL-LINE), `free` frees the
workspace, `oom` asks for more than the device has (it prints the error),
`reset` calls cudaDeviceReset (every allocation freed), `exit` ends."""
import ctypes
import sys

rt = ctypes.CDLL(sys.argv[1])
held = {}


def check(rc):
    if rc != 0:
        raise SystemExit("cudaMalloc failed: %d" % rc)


def weights():
    for i in range(2):
        p = ctypes.c_void_p()
        check(rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(64 << 20)))  # WEIGHTS-LINE
        held["weights%d" % i] = p


def workspace():
    p = ctypes.c_void_p()
    check(rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(32 << 20)))  # WORKSPACE-LINE
    held["workspace"] = p


def small(n):
    for i in range(n):
        p = ctypes.c_void_p()
        check(rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(16 << 10)))  # SMALL-LINE
        held["small%d" % i] = p


def scratch():
    p = ctypes.c_void_p()
    check(rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(64 << 10)))  # SCRATCH-LINE
    held["scratch"] = p


print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "init":
        # As a program starts with CUDA: it picks its device first.
        check(rt.cudaSetDevice(0))
        print("done", flush=True)
    elif cmd == "go":
        weights()
        workspace()
        scratch()
        print("done", flush=True)
    elif cmd.startswith("small "):
        small(int(cmd.split()[1]))
        print("done", flush=True)
    elif cmd == "free":
        check(rt.cudaFree(held.pop("workspace")))
        print("done", flush=True)
    elif cmd == "oom":
        p = ctypes.c_void_p()
        print("err", rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(64 << 30)), flush=True)
    elif cmd == "reset":
        check(rt.cudaDeviceReset())
        held.clear()
        print("done", flush=True)
    elif cmd == "exit":
        break
