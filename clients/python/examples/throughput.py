"""Jobs per second through the gateway with the batch API, end to end.

Each job's x, w and dy (float32, ROWSxDIM) are uploaded through a signed URL,
the jobs posted in batch submits, waited for with batch waits, and dx and dw
read back (and checked against the worker's sha256). Chunks flow through a
pipeline: while one chunk is waited for and read back, the next is uploaded
and posted. Prints one JSON line: jobs, elapsed_s, jobs_per_s.

    python3 throughput.py --count 1000 --rows 8 --dim 1024

cmd/bench's gateway section runs it beside `enqueue synth` on the same jobs.
"""

import argparse
import json
import threading
import time

import numpy as np

import rmsgrad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=100, help="jobs per uploads request and batch submit")
    ap.add_argument("--parallel", type=int, default=8, help="uploads and downloads at once")
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    specs = []
    for _ in range(a.count):
        x = rng.standard_normal((a.rows, a.dim), dtype=np.float32)
        w = (1 + 0.1 * rng.standard_normal(a.dim)).astype(np.float32)
        dy = rng.standard_normal((a.rows, a.dim), dtype=np.float32)
        specs.append(dict(x=x, w=w, dy=dy, eps=1e-6))
    with rmsgrad.Client(parallel=a.parallel) as c:
        chunks = [specs[i : i + a.chunk] for i in range(0, len(specs), a.chunk)]
        posted = []
        cond = threading.Condition()
        done = []
        errors = []

        def waiter() -> None:
            try:
                for k in range(len(chunks)):
                    with cond:
                        cond.wait_for(lambda: len(posted) > k)
                        jobs = posted[k]
                    for res in c.wait_many(jobs):
                        assert res.dx.shape == (a.rows, a.dim) and res.dw.shape == (a.dim,)
                        done.append(res.id)
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        start = time.perf_counter()
        t = threading.Thread(target=waiter)
        t.start()
        for ch in chunks:
            jobs = c.submit_many(ch)
            with cond:
                posted.append(jobs)
                cond.notify_all()
        t.join()
        elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    print(json.dumps({"jobs": len(done), "elapsed_s": round(elapsed, 3), "jobs_per_s": round(len(done) / elapsed, 1)}))


if __name__ == "__main__":
    main()
