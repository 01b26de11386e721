"""The quick start: a few jobs through a gateway, checked against numpy.

    bin/worker --dev &            # embedded Redis, file store in ./rmsgrad-dev
    bin/gateway --dev &           # on 127.0.0.1:8080, uploads into the same store
    PYTHONPATH=clients/python python3 clients/python/examples/quickstart.py

Needs numpy. Set RMSGRAD_GATEWAY and RMSGRAD_TOKEN for another gateway.
"""

import numpy as np

import rmsgrad


def reference(x, w, dy, eps):
    """dx and dw in float64, from the definitions."""
    x, w, dy = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    d = x.shape[-1]
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    c = (dy * x * w).sum(-1, keepdims=True) * r * r / d
    dx = r * (dy * w - x * c)
    dw = (dy * x * r).reshape(-1, d).sum(0)
    return dx, dw


def main() -> None:
    rng = np.random.default_rng(0)
    with rmsgrad.Client() as c:
        specs = []
        for rows, d in [(8, 1024), (1, 257), (32, 768)]:
            x = rng.standard_normal((rows, d), dtype=np.float32)
            w = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
            dy = rng.standard_normal((rows, d), dtype=np.float32)
            specs.append(dict(x=x, w=w, dy=dy, eps=1e-6))
        jobs = c.submit_many(specs)
        for s, res in zip(specs, c.wait_many(jobs)):
            want_dx, want_dw = reference(s["x"], s["w"], s["dy"], s["eps"])
            err = max(np.abs(res.dx - want_dx).max() / np.abs(want_dx).max(),
                      np.abs(res.dw - want_dw).max() / np.abs(want_dw).max())
            print(f"job {res.id}: x {s['x'].shape} -> dx {res.dx.shape} {res.dx.dtype}, dw {res.dw.shape}; "
                  f"max relative error {err:.2e}; batch of {res.status['result']['batch_jobs']} on {res.status['result']['backend']}")
            assert err < 1e-4, err


if __name__ == "__main__":
    main()
