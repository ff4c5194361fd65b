"""One node of bench/probes/tbf_gso.py: raw TCP to and from its neighbours; prints one JSON line.

    python tbf_gso_worker.py K N SUBNET BYTES REPS PAIRS

PAIRS is ``a-b,c-d`` (node a sends BYTES to node b) or ``ring`` (k sends to k + 1 mod N). Every repetition each node
sends to its targets and receives from its sources at once, then each receiver acknowledges with one byte; a
repetition's time is the node's own, from its start to its last acknowledgement. ``cpu_s``: the process's CPU time,
user + system (the kernel's receive work done in softirq while the process runs is charged to it).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

PORT = 29711


def main() -> None:
    k, n, subnet, nbytes, reps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    pairs = [(i, (i + 1) % n) for i in range(n)] if sys.argv[6] == "ring" else [
        (int(a), int(b)) for a, b in (p.split("-") for p in sys.argv[6].split(","))]
    targets, sources = [b for a, b in pairs if a == k], [a for a, b in pairs if b == k]
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((f"{subnet}.{k + 1}", PORT))
    srv.listen(8)
    ins: list[socket.socket] = []
    acceptor = threading.Thread(target=lambda: ins.extend(srv.accept()[0] for _ in sources))
    acceptor.start()
    outs = []
    deadline = time.monotonic() + 30
    for b in targets:
        while True:
            try:
                outs.append(socket.create_connection((f"{subnet}.{b + 1}", PORT), timeout=60))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    acceptor.join(60)
    payload = memoryview(bytes(nbytes))
    buf = memoryview(bytearray(4 << 20))

    def receive(c: socket.socket) -> None:
        got = 0
        while got < nbytes:
            r = c.recv_into(buf, min(len(buf), nbytes - got))
            if r == 0:
                raise SystemExit(f"node {k}: a peer closed early")
            got += r
        c.sendall(b"k")

    times = []
    for _ in range(reps):
        time.sleep(0.3)  # every node idle before the repetition, the links drained
        t0 = time.perf_counter()
        threads = [threading.Thread(target=s.sendall, args=(payload,)) for s in outs] + [
            threading.Thread(target=receive, args=(c,)) for c in ins]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in outs:
            if s.recv(1) != b"k":
                raise SystemExit(f"node {k}: no acknowledgement")
        times.append(time.perf_counter() - t0)
    cpu = os.times()
    print(json.dumps({"node": k, "times_s": times, "cpu_s": cpu.user + cpu.system}))


if __name__ == "__main__":
    main()
