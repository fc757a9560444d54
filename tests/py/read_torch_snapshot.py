"""Reads a memory snapshot with PyTorch's own reader, torch/cuda/_memory_viz.py
(its path is the first argument; `cargo xtask setup` takes it out of
PyTorch's wheel), as `python -m torch.cuda._memory_viz stats|memory|trace`
would, and prints what it made of it as JSON: the `stats` text (its
segment summary checks that every segment's blocks add up), the folded
stacks `memory` draws its flame graph from, and the `trace` text."""
import importlib.util
import json
import pickle
import sys

spec = importlib.util.spec_from_file_location("_memory_viz", sys.argv[1])
viz = importlib.util.module_from_spec(spec)
spec.loader.exec_module(viz)
with open(sys.argv[2], "rb") as f:
    data = pickle.load(f)
print(
    json.dumps(
        {
            "stats": viz.segsum(data),
            # The flame graph's input, not drawn: drawing needs flamegraph.pl.
            "memory": viz.memory(data, format_flamegraph=lambda lines: lines).splitlines(),
            "trace": viz.trace(data),
            "segments": [
                {
                    "address": s["address"],
                    "total_size": s["total_size"],
                    "frames": viz._frames_fmt(s["frames"]),
                    "device": s["device"],
                    "states": [b["state"] for b in s["blocks"]],
                    "active_sizes": [
                        b["size"] for b in s["blocks"] if b["state"] == "active_allocated"
                    ],
                    "active_frames": [
                        viz._frames_fmt(b["frames"])
                        for b in s["blocks"]
                        if b["state"] == "active_allocated"
                    ],
                }
                for s in data["segments"]
            ],
        }
    )
)
