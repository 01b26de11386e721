"""rmsgrad: a client of the rmsgrad HTTP job API (cmd/gateway).

    import rmsgrad, torch
    c = rmsgrad.Client("http://127.0.0.1:8080", token=...)
    job = c.submit(x=x, w=w, dy=dy, eps=1e-6)
    res = job.wait()
    res.dx, res.dw          # torch tensors, as x was

The core needs only the standard library; numpy and torch are used when
the tensors given are theirs. docs/gateway.md in the repository is the guide.
"""

from .client import BatchError, Client, Job, JobFailed, Result, RmsgradError, WaitTimeout
from .safetensors import RawTensor

__all__ = ["Client", "Job", "Result", "RmsgradError", "JobFailed", "BatchError", "WaitTimeout", "RawTensor"]
__version__ = "0.1.0"
