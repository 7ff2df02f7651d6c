"""Replay an object-id stream through libCacheSim's policies, one request at a time.

Run it with a Python that has ``libcachesim`` (PyPI 0.3.5 was used) installed, never
prefixlab's own environment:

    python libcachesim_run.py STREAM.txt POLICY[,POLICY...] CAPACITY[,CAPACITY...]

STREAM.txt: object ids (integers >= 0), whitespace separated. ``POLICY+bloomfilter`` puts
libCacheSim's ``BloomFilterAdmissioner`` in front of the policy (it admits an object from its
second miss on, counting exactly). Prints one JSON line per
(policy, capacity): ``{"policy", "capacity", "hits": [0/1 per access]}``. Every request has
size 1, so a cache of C bytes holds C objects; Belady gets each request's next access time
(the index of the next request for the same id), from one reverse pass. Each (policy,
capacity) runs in a fresh process: libCacheSim's LeCaR draws from a process-wide generator.
"""

from __future__ import annotations

import json
import subprocess
import sys

NEVER = 2**63 - 1


def run_one(ids: list[int], policy: str, capacity: int) -> list[int]:
    import libcachesim as lcs

    policy, _, admission = policy.partition("+")
    cls = {
        "lru": lcs.LRU,
        "fifo": lcs.FIFO,
        "lfu": lcs.LFU,
        "arc": lcs.ARC,
        "sieve": lcs.Sieve,
        "s3fifo": lcs.S3FIFO,
        "lecar": lcs.LeCaR,
        "opt": lcs.Belady,
    }[policy]
    if admission == "bloomfilter":
        cache = cls(capacity, admissioner=lcs.BloomFilterAdmissioner())
    else:
        cache = cls(capacity)
    req = lcs.Request(obj_size=1, clock_time=0)
    nxt = [NEVER] * len(ids)
    last: dict[int, int] = {}
    for i in range(len(ids) - 1, -1, -1):
        nxt[i] = last.get(ids[i], NEVER)
        last[ids[i]] = i
    hits = []
    for i, x in enumerate(ids):
        req.obj_id = x
        req.next_access_vtime = nxt[i]
        hits.append(int(cache.get(req)))
    return hits


def main(argv: list[str]) -> int:
    if argv[1] == "--one":  # a single run, in its own process
        with open(argv[2]) as fh:
            ids = [int(x) for x in fh.read().split()]
        print(json.dumps(run_one(ids, argv[3], int(argv[4]))))
        return 0
    path, policies, capacities = argv[1], argv[2].split(","), argv[3].split(",")
    for policy in policies:
        for cap in capacities:
            out = subprocess.run(
                [sys.executable, __file__, "--one", path, policy, cap],
                capture_output=True,
                text=True,
                check=True,
            )
            hits = json.loads(out.stdout)
            print(json.dumps({"policy": policy, "capacity": int(cap), "hits": hits}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
