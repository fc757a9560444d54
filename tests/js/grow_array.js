// Grows in a known function until its memory cgroup's limit kills it: a
// MiB at a time, in buffers outside V8's heap (whose own limit would
// otherwise end it first). Run with `node --perf-basic-prof
// --interpreted-frames-native-stack` so that V8 writes a perf map naming
// every function it runs, interpreted or compiled. The growth test looks
// for growArray.
"use strict";

const kept = [];

function growArray() {
  for (;;) {
    kept.push(new Uint8Array(1 << 20).fill(kept.length & 255));
  }
}

// A few MiB first, as a program that ran a while before it grew: the
// recorder has read its maps and named its code by the time it grows.
for (let i = 0; i < 8; i++) {
  kept.push(new Uint8Array(1 << 20).fill(1));
}
process.stdout.write("ready\n");
process.stdin.once("data", () => growArray());
