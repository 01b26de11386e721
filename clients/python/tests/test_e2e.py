"""End-to-end tests against a running gateway, worker, Redis and store.

The Go test cmd/gateway TestPythonClient starts them (redis-server,
versitygw, the built worker and gateways) and runs this module with:

  RMSGRAD_GATEWAY, RMSGRAD_TOKEN   the gateway and a token it holds
  RMSGRAD_TOKEN_OLD                another token under the same name (rotation)
  RMSGRAD_CA_FILE                  the CA of an https gateway
  RMSGRAD_TEST_MODE                s3 (presigned S3 URLs) or dev (the gateway's file store)
  RMSGRAD_TEST_PREFIX              a writable object prefix (s3://bucket/dir/ or file:///dir/)
  RMSGRAD_TEST_FOREIGN             an object URI outside the allow-list
  RMSGRAD_TEST_SHORT_GATEWAY       a gateway whose URLs expire after 1 s
  RMSGRAD_TEST_MAX_UPLOAD          (dev) the gateway's uploads.max_bytes
  RMSGRAD_TEST_IDS_FILE            every job id enqueued is appended here; the
                                   Go test then checks the queue holds exactly these

Without RMSGRAD_GATEWAY the module is skipped.
"""

import hashlib
import json
import os
import sys
import tempfile
import time
import unittest
import uuid

import numpy as np
import torch

import rmsgrad
from rmsgrad.safetensors import RawTensor

from .oracle import autograd, check

ENV = os.environ
GATEWAY = ENV.get("RMSGRAD_GATEWAY")
MODE = ENV.get("RMSGRAD_TEST_MODE", "s3")


def enqueued(*ids):
    """Record ids the test enqueued, for the Go side's queue check."""
    with open(ENV["RMSGRAD_TEST_IDS_FILE"], "a", encoding="utf-8") as f:
        for i in ids:
            f.write(i + "\n")


def client(token=None, url=None, **kw):
    return rmsgrad.Client(url or GATEWAY, token=ENV.get("RMSGRAD_TOKEN", "") if token is None else token,
                          ca_file=ENV.get("RMSGRAD_CA_FILE") or None, **kw)


def inputs(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(dtype)
    dy = (0.5 * torch.randn(*shape, generator=g)).to(dtype)
    return x, w, dy


@unittest.skipIf(not GATEWAY, "RMSGRAD_GATEWAY not set: run through go test ./cmd/gateway")
class GatewayTest(unittest.TestCase):
    def setUp(self):
        self.c = client()

    def tearDown(self):
        self.c.close()

    def assertError(self, cm, code, status, *parts):
        e = cm.exception
        self.assertEqual(e.code, code, str(e))
        if status is not None:
            self.assertEqual(e.status, status, str(e))
        for p in parts:
            self.assertIn(p, str(e))

    def test_torch_batch_matches_autograd(self):
        shapes = [(8, 1024), (1, 257), (2, 3, 64), (32, 768), (5, 96), (16, 4096)]
        specs = []
        for i, sh in enumerate(shapes):
            x, w, dy = inputs(sh, seed=i)
            specs.append(dict(x=x.requires_grad_(True), w=w, dy=dy, eps=1e-5))
        jobs = self.c.submit_many(specs)
        enqueued(*[j.id for j in jobs])
        results = self.c.wait_many(jobs, timeout=300)
        for s, res in zip(specs, results):
            self.assertIsInstance(res.dx, torch.Tensor)
            self.assertEqual(res.dx.dtype, torch.float32)
            self.assertEqual(res.status["state"], "completed")
            check(self, s["x"], s["w"], s["dy"], s["eps"], res.dx, res.dw, name=f"{tuple(s['x'].shape)}")

    def test_numpy_single_with_r(self):
        x, w, dy = (t.numpy() for t in inputs((4, 512), seed=9))
        job = self.c.submit(x=x, w=w, dy=dy, eps=1e-6, outputs=["dx", "dw", "r"])
        enqueued(job.id)
        res = job.wait(timeout=300)
        self.assertIsInstance(res.dx, np.ndarray)
        self.assertEqual(res.dx.dtype, np.float32)
        check(self, torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(dy), 1e-6,
              torch.from_numpy(res.dx), torch.from_numpy(res.dw))
        _, _, r = autograd(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(dy), 1e-6)
        np.testing.assert_allclose(res.r, r.reshape(-1).numpy(), rtol=1e-5)
        self.assertEqual(self.c.status(job.id)["state"], "completed")

    def test_half_precision_dtypes_travel_as_themselves(self):
        # BF16 and F16 tensors reach the worker as themselves, come back in
        # the same dtype (dx like x, dw like w, as autograd gives them) and
        # match float64 autograd on the same values within a few units of
        # the dtype's last place.
        for dt, name in [(torch.bfloat16, "BF16"), (torch.float16, "F16")]:
            x, w, dy = inputs((4, 64), dtype=dt, seed=3)
            job = self.c.submit(x=x, w=w, dy=dy, eps=1e-5)
            enqueued(job.id)
            res = job.wait(timeout=300)
            self.assertEqual(res.dx.dtype, dt, f"{name} dx comes back as {name}")
            self.assertEqual(res.dw.dtype, dt, f"{name} dw comes back as {name}")
            want_dx, want_dw, _ = autograd(x.double(), w.double(), dy.double(), 1e-5)
            tol = 2.0 ** -7 if dt == torch.bfloat16 else 2.0 ** -10
            self.assertLessEqual((res.dx.double() - want_dx).abs().max().item(), 8 * tol * want_dx.abs().max().item())
            self.assertLessEqual((res.dw.double() - want_dw).abs().max().item(), 8 * tol * want_dw.abs().max().item())

    def test_grad_dtype_f32_for_half_inputs(self):
        # BF16 inputs with grad_dtype F32: both gradients come back F32, the
        # float32 results before any rounding to BF16, so closer to float64
        # autograd than the BF16 ones; a dtype spelt otherwise is refused
        # before anything is enqueued, naming the field.
        x, w, dy = inputs((4, 64), dtype=torch.bfloat16, seed=7)
        job = self.c.submit(x=x, w=w, dy=dy, eps=1e-5, grad_dtype="F32")
        enqueued(job.id)
        res = job.wait(timeout=300)
        self.assertEqual(res.dx.dtype, torch.float32, "grad_dtype F32: dx comes back F32")
        self.assertEqual(res.dw.dtype, torch.float32, "grad_dtype F32: dw comes back F32")
        # Within 8 * 2^-16 of the largest gradient: float32 arithmetic is
        # far inside it, values rounded to BF16 (relative error up to 2^-9)
        # are not.
        want_dx, want_dw, _ = autograd(x.double(), w.double(), dy.double(), 1e-5)
        tol = 2.0 ** -16
        self.assertLessEqual((res.dx.double() - want_dx).abs().max().item(), 8 * tol * want_dx.abs().max().item())
        self.assertLessEqual((res.dw.double() - want_dw).abs().max().item(), 8 * tol * want_dw.abs().max().item())
        with self.assertRaises(rmsgrad.RmsgradError) as cm:
            self.c.submit(x=x, w=w, dy=dy, eps=1e-5, grad_dtype="f32")
        self.assertError(cm, "invalid_job", 400, "grad_dtype")

    def test_submit_uris_idempotent_and_taken_id(self):
        prefix = ENV["RMSGRAD_TEST_PREFIX"]
        x, w, dy = inputs((2, 128), seed=5)
        obj = self.c.upload({"x": x, "w": w, "dy": dy}, uri=prefix + f"uris-{uuid.uuid4().hex}.safetensors")
        out = obj.replace(".safetensors", ".out.safetensors")
        jid = "uris-" + uuid.uuid4().hex
        a = self.c.submit_uris(x=obj + "#x", w=obj + "#w", dy=obj + "#dy", out=out, eps=1e-6, id=jid)
        b = self.c.submit_uris(x=obj + "#x", w=obj + "#w", dy=obj + "#dy", out=out, eps=1e-6, id=jid)
        self.assertEqual((a.id, b.id), (jid, jid), "the same job again under its id is a no-op")
        enqueued(jid)
        with self.assertRaises(rmsgrad.RmsgradError) as cm:
            self.c.submit_uris(x=obj + "#x", w=obj + "#w", dy=obj + "#dy", out=out, eps=1e-3, id=jid)
        self.assertError(cm, "id_conflict", 409, f"job {jid}", "already used by a different job")
        res = self.c.wait(a, timeout=300)
        self.assertEqual(res.tensors, {}, "submit_uris jobs read nothing back unless asked")
        self.assertEqual(res.out, out)
        got = self.c.download(out)
        self.assertEqual(sorted(got), ["dw", "dx"])
        self.assertEqual(got["dx"].dtype, "F32")
        fetched = self.c.wait(jid, fetch=True)
        check(self, x, w, dy, 1e-6, torch.from_numpy(fetched.dx), torch.from_numpy(fetched.dw))

    def test_pinned_w(self):
        prefix = ENV["RMSGRAD_TEST_PREFIX"]
        x, w, dy = inputs((3, 64), seed=9)
        obj = self.c.upload({"x": x, "w": w, "dy": dy}, uri=prefix + f"pin-{uuid.uuid4().hex}.safetensors")
        pin = hashlib.sha256(np.ascontiguousarray(w.numpy(), dtype="<f4").tobytes()).hexdigest()
        for n in range(2):
            out = obj.replace(".safetensors", f".out{n}.safetensors")
            job = self.c.submit_uris(x=obj + "#x", w=obj + "#w", dy=obj + "#dy", out=out, eps=1e-6, w_sha256=pin)
            enqueued(job.id)
            res = self.c.wait(job, timeout=300, fetch=True)
            check(self, x, w, dy, 1e-6, torch.from_numpy(res.dx), torch.from_numpy(res.dw))
        wrong = "0" * 64
        job = self.c.submit_uris(x=obj + "#x", w=obj + "#w", dy=obj + "#dy", out=obj.replace(".safetensors", ".bad.safetensors"), eps=1e-6, w_sha256=wrong)
        enqueued(job.id)
        with self.assertRaises(rmsgrad.JobFailed) as cm:
            job.wait(timeout=300)
        self.assertIn("does not match the job's w_sha256", str(cm.exception))
        self.assertIn(pin, str(cm.exception))
        with self.assertRaises(rmsgrad.RmsgradError) as cm:
            self.c.submit_uris(x=obj + "#x", w=obj + "#w", dy=obj + "#dy", out=obj + ".o", eps=1e-6, w_sha256="ABC")
        self.assertError(cm, "invalid_job", 400, "w_sha256")

    def test_malformed_jobs_are_json_errors(self):
        prefix = ENV["RMSGRAD_TEST_PREFIX"]
        ok = dict(x=prefix + "m.safetensors#x", w=prefix + "m.safetensors#w", dy=prefix + "m.safetensors#dy",
                  out=prefix + "m.out.safetensors")
        with self.assertRaises(rmsgrad.RmsgradError) as cm:
            self.c.submit_uris(**ok, eps=0.0, id="bad-eps")
        self.assertError(cm, "invalid_job", 400, "job bad-eps", "eps: must be finite and > 0")
        self.assertEqual(cm.exception.field, "eps")
        with self.assertRaises(rmsgrad.RmsgradError) as cm:
            self.c._api("POST", "/v1/jobs", {"v": 1, **ok, "eps": 1e-6, "OUT": "x"})
        self.assertError(cm, "invalid_job", 400, "unknown field \"OUT\"")
        with self.assertRaises(rmsgrad.RmsgradError) as cm:
            self.c._api("POST", "/v1/jobs", {"v": 2, **ok, "eps": 1e-6})
        self.assertError(cm, "invalid_job", 400, "version 2 not supported")
        foreign = ENV["RMSGRAD_TEST_FOREIGN"]
        with self.assertRaises(rmsgrad.RmsgradError) as cm:
            self.c.submit_uris(**{**ok, "out": foreign}, eps=1e-6, id="bad-out")
        self.assertError(cm, "not_allowed", 403, "job bad-out", "tensor out", foreign)
        self.assertEqual((cm.exception.tensor, cm.exception.uri), ("out", foreign))
        # A batch: the good job goes in, the bad ones are answered each.
        gid = "batch-good-" + uuid.uuid4().hex
        with self.assertRaises(rmsgrad.BatchError) as cm:
            self.c.submit_uris_many([dict(**ok, eps=1e-6, id=gid), dict(**ok, eps=-1.0, id="batch-bad")])
        enqueued(gid)
        self.assertEqual([j.id if j else None for j in cm.exception.jobs], [gid, None])
        self.assertEqual(cm.exception.errors[1].code, "invalid_job")

    def test_failed_job_raises_the_workers_message(self):
        prefix = ENV["RMSGRAD_TEST_PREFIX"]
        missing = prefix + f"missing-{uuid.uuid4().hex}.safetensors"
        job = self.c.submit_uris(x=missing + "#x", w=missing + "#w", dy=missing + "#dy", out=missing + ".out", eps=1e-6)
        enqueued(job.id)
        with self.assertRaises(rmsgrad.JobFailed) as cm:
            job.wait(timeout=300)
        self.assertIn(f"job {job.id}", str(cm.exception))
        self.assertIn(missing, str(cm.exception))
        self.assertIn("not found", str(cm.exception))
        got = self.c.wait_many([job], return_exceptions=True)
        self.assertIsInstance(got[0], rmsgrad.JobFailed)

    def test_tokens(self):
        if MODE == "dev":
            self.skipTest("the dev gateway runs without tokens on loopback")
        for tok, why in [("", "missing bearer token"), ("rmsgrad_" + "A" * 43, "bearer token not recognised")]:
            with client(token=tok) as c, self.assertRaises(rmsgrad.RmsgradError) as cm:
                c.status("anything")
            self.assertError(cm, "unauthorized", 401, why)
        with client(token=ENV["RMSGRAD_TOKEN_OLD"]) as c, self.assertRaises(rmsgrad.RmsgradError) as cm:
            c.status("no-such-job")
        self.assertError(cm, "not_found", 404, "job no-such-job", "job not found")

    def test_oversized_bodies(self):
        prefix = ENV["RMSGRAD_TEST_PREFIX"]
        with self.assertRaises(rmsgrad.RmsgradError) as cm:
            self.c.submit_uris(x=prefix + "a" * 20000 + "#x", w=prefix + "w#w", dy=prefix + "d#dy", out=prefix + "o", eps=1e-6)
        self.assertError(cm, "too_large", 413, "request body over 16384 bytes")
        if MODE == "dev":
            limit = int(ENV["RMSGRAD_TEST_MAX_UPLOAD"])
            n = limit // 4 + 1024
            big = RawTensor("F32", (n,), bytes(4 * n))
            with self.assertRaises(rmsgrad.RmsgradError) as cm:
                self.c.upload({"x": big})
            self.assertError(cm, "too_large", 413, f"limit {limit} (uploads.max_bytes)")

    def test_expired_url(self):
        with client(url=ENV["RMSGRAD_TEST_SHORT_GATEWAY"]) as c:
            up = c._api("POST", "/v1/uploads", {"count": 1})["uploads"][0]
            time.sleep(2.2)
            with self.assertRaises(rmsgrad.RmsgradError) as cm:
                c._put(up, b"\0" * 64, "test upload")
            e = cm.exception
            self.assertEqual(e.status, 403, str(e))
            self.assertIn(up["uri"], str(e))
            if MODE == "dev":
                self.assertError(cm, "url_expired", 403, "the URL expired at")
            else:
                self.assertError(cm, "AccessDenied", 403, "expired")

    def test_orchestrator_example(self):
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
        try:
            from orchestrator_task import rmsnorm_grads
        finally:
            sys.path.pop(0)
        x, w, dy = (t.numpy() for t in inputs((6, 320), seed=11))
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for name, a in (("x", x), ("w", w), ("dy", dy)):
                paths.append(os.path.join(d, name + ".npy"))
                np.save(paths[-1], a)
            kw = dict(eps=1e-6, gateway=GATEWAY, ca_file=ENV.get("RMSGRAD_CA_FILE") or None)
            os.environ["RMSGRAD_TOKEN"] = ENV.get("RMSGRAD_TOKEN", "")
            first = rmsnorm_grads(*paths, os.path.join(d, "out"), **kw)
            again = rmsnorm_grads(*paths, os.path.join(d, "out2"), **kw)  # a retried task
            self.assertEqual(first["job"], again["job"])
            enqueued(first["job"])
            for p in (first, again):
                check(self, torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(dy), 1e-6,
                      torch.from_numpy(np.load(p["dx"])), torch.from_numpy(np.load(p["dw"])))


if __name__ == "__main__":
    unittest.main()
