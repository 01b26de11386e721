"""RMSNorm gradients as one step of a pipeline (Airflow, Prefect, Dagster).

The step is a plain function: the orchestrator's task decorator wraps it.

Airflow::

    from airflow.decorators import task

    @task
    def grads(x_path: str, w_path: str, dy_path: str) -> dict:
        return rmsnorm_grads(x_path, w_path, dy_path, out_dir="/data/grads",
                             gateway="https://rmsgrad.internal:8443",
                             token_file="/run/secrets/rmsgrad-token")

Prefect::

    from prefect import task

    grads = task(rmsnorm_grads, retries=2)

The job id is a hash of the inputs' bytes and eps, so a retried task finds
the job its first run posted (the gateway answers id_conflict to the new
post, whose upload went to a new object) and waits for that result: a
retry never computes twice.
"""

from __future__ import annotations

import hashlib
import os
from typing import Dict, Optional

import numpy as np

import rmsgrad


def rmsnorm_grads(x_path: str, w_path: str, dy_path: str, out_dir: str, *, eps: float = 1e-6,
                  gateway: Optional[str] = None, token_file: Optional[str] = None,
                  ca_file: Optional[str] = None, timeout: float = 600.0) -> Dict[str, str]:
    """Read x, w and dy from .npy files, compute dx and dw on the rmsgrad
    workers, write them as dx.npy and dw.npy into out_dir, and return their
    paths and the job id (for the orchestrator's logs and lineage)."""
    x, w, dy = np.load(x_path), np.load(w_path), np.load(dy_path)
    h = hashlib.sha256(repr(eps).encode())
    for a in (x, w, dy):
        h.update(repr((a.dtype.str, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    job_id = "task-" + h.hexdigest()[:32]
    with rmsgrad.Client(gateway, token_file=token_file, ca_file=ca_file) as c:
        job: "rmsgrad.Job | str"
        try:
            job = c.submit(x=x, w=w, dy=dy, eps=eps, id=job_id)
        except rmsgrad.RmsgradError as e:
            if e.code != "id_conflict":
                raise
            job = job_id  # posted by an earlier run of this task, on the same bytes
        res = c.wait(job, timeout=timeout, fetch=True)
    os.makedirs(out_dir, exist_ok=True)
    paths = {"dx": os.path.join(out_dir, "dx.npy"), "dw": os.path.join(out_dir, "dw.npy")}
    np.save(paths["dx"], res.dx)
    np.save(paths["dw"], res.dw)
    return {"job": res.id, **paths}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=rmsnorm_grads.__doc__)
    for a in ("x", "w", "dy"):
        ap.add_argument(a, help=f"{a}.npy")
    ap.add_argument("out_dir")
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--gateway")
    ap.add_argument("--token-file")
    ap.add_argument("--ca-file")
    a = ap.parse_args()
    print(rmsnorm_grads(a.x, a.w, a.dy, a.out_dir, eps=a.eps, gateway=a.gateway, token_file=a.token_file, ca_file=a.ca_file))
