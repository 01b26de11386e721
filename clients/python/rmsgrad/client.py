"""The rmsgrad HTTP client: post RMSNorm-backward jobs to a gateway, wait
for them and read dx and dw back.

Only the standard library is needed to post jobs and read results
(:meth:`Client.submit_uris`, :meth:`Client.wait`); with numpy or torch,
:meth:`Client.submit` takes arrays or tensors, writes them as one safetensors
object, uploads it through a URL the gateway signs (a presigned S3 URL, or
the gateway's own file store in the zero-setup mode), and :meth:`Client.wait`
returns dx and dw as arrays or tensors of the same kind.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import arrays
from ._http import Pool, Response
from .safetensors import RawTensor, decode, encode

__all__ = ["Client", "Job", "Result", "RmsgradError", "JobFailed", "BatchError", "WaitTimeout"]

#: Most jobs (and ids, and URLs) one request carries; the gateway's
#: limits.max_batch defaults to 1000.
MAX_BATCH = 1000


class RmsgradError(Exception):
    """An error the gateway (or a store) answered, or one found here.

    ``code`` is the gateway's error code (``invalid_job``, ``id_conflict``,
    ``unauthorized``, ``not_allowed``, ``url_expired``, ``too_large``, ...,
    or the S3 error code of an upload), ``status`` the HTTP status; ``job``,
    ``tensor``, ``uri`` and ``field`` name what the error is about when the
    gateway said.
    """

    def __init__(self, message: str, *, status: Optional[int] = None, code: Optional[str] = None,
                 job: Optional[str] = None, tensor: Optional[str] = None, uri: Optional[str] = None,
                 field: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status, self.code, self.job, self.tensor, self.uri, self.field = status, code, job, tensor, uri, field


class JobFailed(RmsgradError):
    """The job ended failed; the message is the worker's (job, tensor, URI,
    the rule broken)."""


class WaitTimeout(RmsgradError, TimeoutError):
    """A wait ended before the job did."""


class BatchError(RmsgradError):
    """Some jobs of a batch submit were refused. ``jobs`` holds, in order, the
    Job of each job enqueued and None for each refused; ``errors`` maps the
    index of each refused job to its error."""

    def __init__(self, message: str, jobs: List[Optional["Job"]], errors: Dict[int, RmsgradError]) -> None:
        super().__init__(message, code="batch")
        self.jobs, self.errors = jobs, errors


@dataclass
class Job:
    """A posted job: :meth:`wait` for its result."""

    id: str
    out: str
    outputs: Tuple[str, ...]
    kind: str  # what wait() returns tensors as: "numpy", "torch", "raw", or "" (submit_uris: nothing fetched)
    client: "Client" = field(repr=False, compare=False)

    def wait(self, timeout: Optional[float] = None) -> "Result":
        """Wait for the job; see :meth:`Client.wait`."""
        return self.client.wait(self, timeout=timeout)

    def status(self) -> Dict[str, Any]:
        """The job's state now; see :meth:`Client.status`."""
        return self.client.status(self.id)


@dataclass
class Result:
    """A completed job: the gateway's status (``status["result"]`` is the
    worker's result: out, sha256, rows, dim, backend, batch, timings) and
    the outputs read back (output name -> array or tensor)."""

    id: str
    status: Dict[str, Any]
    tensors: Dict[str, Any]

    @property
    def out(self) -> str:
        """The output object's URI."""
        return self.status["result"]["out"]

    @property
    def dx(self) -> Any:
        """dL/dx, x's shape."""
        return self.tensors["dx"]

    @property
    def dw(self) -> Any:
        """dL/dw, shape [D]."""
        return self.tensors["dw"]

    @property
    def r(self) -> Any:
        """1/rms of each row, shape [rows] (when asked for)."""
        return self.tensors["r"]


TensorLike = Any  # a numpy array, a torch tensor or a RawTensor


class Client:
    """A client of one rmsgrad gateway.

    ``url`` defaults to ``$RMSGRAD_GATEWAY`` (else http://127.0.0.1:8080);
    the bearer token to ``token``, else ``$RMSGRAD_TOKEN``, else the first
    line of ``token_file`` (else none: a dev gateway on loopback needs
    none). ``ca_file`` trusts a private CA for an https gateway and its
    stores. ``parallel`` uploads and downloads run at once.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 token_file: Optional[str] = None, ca_file: Optional[str] = None,
                 timeout: float = 120.0, parallel: int = 8) -> None:
        self.url = (url or os.environ.get("RMSGRAD_GATEWAY") or "http://127.0.0.1:8080").rstrip("/")
        if token is None:
            token = os.environ.get("RMSGRAD_TOKEN") or None
        if token is None and token_file:
            with open(token_file, encoding="utf-8") as f:
                token = f.readline().strip()
        self._token = token
        ctx = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._pool = Pool(timeout, ctx)
        self._timeout = timeout
        self._exec = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="rmsgrad")

    def close(self) -> None:
        """Stop the transfer threads and close the connections."""
        self._exec.shutdown(wait=True)
        self._pool.close_all()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- jobs on tensors -------------------------------------------------

    def submit(self, *, x: TensorLike, w: TensorLike, dy: TensorLike, eps: float = 1e-6,
               outputs: Optional[Sequence[str]] = None, id: Optional[str] = None,
               grad_dtype: Optional[str] = None) -> Job:
        """Upload x [..., D], w [D] and dy (x's shape) as one safetensors
        object and post the job. Arrays keep their dtype (float32, float16
        and bfloat16 travel as F32, F16 and BF16). dx comes back in x's
        dtype and dw in w's, as autograd gives them, unless ``grad_dtype``
        ("F32", "BF16" or "F16") names one dtype for both (F32 for a dw
        summed over many microbatches). Returns the Job; ``wait()`` returns
        dx and dw of the same kind (numpy or torch) as x."""
        return self.submit_many([dict(x=x, w=w, dy=dy, eps=eps, outputs=outputs, id=id, grad_dtype=grad_dtype)])[0]

    def submit_many(self, jobs: Iterable[Mapping[str, Any]]) -> List[Job]:
        """Post many jobs, each a mapping of submit()'s arguments, with one
        uploads request, parallel uploads and one batch submit per
        MAX_BATCH jobs. Raises BatchError when some are refused (the others
        are enqueued)."""
        specs = list(jobs)
        out: List[Job] = []
        for i in range(0, len(specs), MAX_BATCH):
            out.extend(self._submit_chunk(specs[i : i + MAX_BATCH]))
        return out

    def _submit_chunk(self, specs: List[Mapping[str, Any]]) -> List[Job]:
        prepared = []
        for i, s in enumerate(specs):
            unknown = set(s) - {"x", "w", "dy", "eps", "outputs", "id", "grad_dtype"}
            if unknown:
                raise TypeError(f"job {i}: unknown arguments {sorted(unknown)}")
            kind = arrays.kind_of(s["x"])
            ts = {n: arrays.to_raw(s[n], n) for n in ("x", "w", "dy")}
            prepared.append((s.get("id") or _new_id(), kind, ts, s.get("eps", 1e-6), s.get("outputs"), s.get("grad_dtype")))
        ups = self._api("POST", "/v1/uploads", {"count": len(prepared)})["uploads"]

        def put(k: int) -> None:
            jid, _, ts, _, _, _ = prepared[k]
            self._put(ups[k], encode(ts), f"job {jid}: inputs")

        list(self._exec.map(put, range(len(prepared))))
        items = []
        for (jid, _, _, eps, outs, gd), up in zip(prepared, ups):
            obj = up["uri"]
            items.append((jid, _job(obj + "#x", obj + "#w", obj + "#dy", up["out"], eps, outs, gd)))
        return self._submit_batch(items, [p[1] for p in prepared])

    # ---- jobs on URIs (standard library only) ---------------------------

    def submit_uris(self, *, x: str, w: str, dy: str, out: str, eps: float = 1e-6,
                    outputs: Optional[Sequence[str]] = None, id: Optional[str] = None,
                    grad_dtype: Optional[str] = None, w_sha256: Optional[str] = None) -> Job:
        """Post a job on tensors already in the workers' storage (URIs such
        as s3://bucket/key#name). With ``id``, posting the same job again is
        a no-op, and another job under a taken id raises RmsgradError with
        code "id_conflict". ``grad_dtype`` as for submit(). ``w_sha256``,
        the hex SHA-256 of w's tensor data bytes, pins w: the worker checks
        it (the job fails when w does not match) and serves the later jobs
        that pin the same w from memory."""
        return self.submit_uris_many([dict(x=x, w=w, dy=dy, out=out, eps=eps, outputs=outputs, id=id, grad_dtype=grad_dtype,
                                           w_sha256=w_sha256)])[0]

    def submit_uris_many(self, jobs: Iterable[Mapping[str, Any]]) -> List[Job]:
        """Post many jobs on URIs (submit_uris's arguments each) in batch
        requests. Raises BatchError when some are refused."""
        items = []
        for s in jobs:
            items.append((s.get("id") or _new_id(), _job(s["x"], s["w"], s["dy"], s["out"], s.get("eps", 1e-6), s.get("outputs"), s.get("grad_dtype"),
                                                         s.get("w_sha256"))))
        out: List[Job] = []
        for i in range(0, len(items), MAX_BATCH):
            chunk = items[i : i + MAX_BATCH]
            out.extend(self._submit_batch(chunk, [""] * len(chunk)))
        return out

    def _submit_batch(self, items: List[Tuple[str, Dict[str, Any]]], kinds: List[str]) -> List[Job]:
        if len(items) == 1:
            jid, job = items[0]
            ans = self._api("POST", "/v1/jobs?id=" + urllib.parse.quote(jid, safe=""), job)
            return [Job(ans["id"], job["out"], tuple(job.get("outputs") or ("dx", "dw")), kinds[0], self)]
        ans = self._api("POST", "/v1/jobs/batch", {"jobs": [{"id": jid, "job": job} for jid, job in items]})
        jobs: List[Optional[Job]] = []
        errors: Dict[int, RmsgradError] = {}
        for (jid, job), kind, a in zip(items, kinds, ans["jobs"]):
            if a.get("error"):
                errors[a["index"]] = _error(a["status"], a["error"])
                jobs.append(None)
            else:
                jobs.append(Job(a["id"], job["out"], tuple(job.get("outputs") or ("dx", "dw")), kind, self))
        if errors:
            first = min(errors)
            raise BatchError(f"{len(errors)} of {len(items)} jobs refused; job {first}: {errors[first].message}", jobs, errors)
        return [j for j in jobs if j is not None]

    # ---- state and waits -------------------------------------------------

    def status(self, id: str) -> Dict[str, Any]:
        """The job's state now: id, queue, state (pending, active, completed,
        failed), retried, max_retry, last_error, result."""
        return self._api("GET", "/v1/jobs/" + urllib.parse.quote(id, safe=""))

    def wait(self, job: Union[Job, str], timeout: Optional[float] = None, fetch: Optional[bool] = None) -> Result:
        """Wait for one job (long polls of at most 30 s each) and return its
        Result, with its outputs read back when ``fetch`` (the default for
        jobs posted with tensors). Raises JobFailed with the worker's
        message, or WaitTimeout after ``timeout`` seconds."""
        j = job if isinstance(job, Job) else None
        jid = job.id if isinstance(job, Job) else job
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            t = 30.0 if deadline is None else max(0.0, min(30.0, deadline - time.monotonic()))
            st = self._api("GET", f"/v1/jobs/{urllib.parse.quote(jid, safe='')}/wait?timeout={t:g}", timeout=t + self._timeout)
            if st["state"] in ("completed", "failed"):
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {jid}: still {st['state']} after {timeout:g}s", job=jid, code="timeout")
        return self._results([(jid, j, st)], fetch, raise_failed=True)[0]  # type: ignore[return-value]

    def wait_many(self, jobs: Sequence[Union[Job, str]], timeout: Optional[float] = None,
                  fetch: Optional[bool] = None, return_exceptions: bool = False) -> List[Union[Result, JobFailed]]:
        """Wait for many jobs with batch waits, then read all their outputs
        back in parallel. A failed job raises JobFailed, or with
        ``return_exceptions`` stands in the list as its JobFailed."""
        ids = [j.id if isinstance(j, Job) else j for j in jobs]
        byid: Dict[str, Dict[str, Any]] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        for i in range(0, len(ids), MAX_BATCH):
            chunk = ids[i : i + MAX_BATCH]
            while True:
                open_ids = [x for x in chunk if x not in byid]
                t = 30.0 if deadline is None else max(0.0, min(30.0, deadline - time.monotonic()))
                ans = self._api("POST", "/v1/jobs/wait", {"ids": open_ids, "timeout": t}, timeout=t + self._timeout)
                for a in ans["jobs"]:
                    if a.get("error"):
                        raise _error(None, a["error"])
                    if a["state"] in ("completed", "failed"):
                        byid[a["id"]] = a
                if all(x in byid for x in chunk):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    left = [x for x in chunk if x not in byid]
                    raise WaitTimeout(f"{len(left)} jobs still open after {timeout:g}s (first: {left[0]})", code="timeout")
        entries = [(jid, j if isinstance(j, Job) else None, byid[jid]) for jid, j in zip(ids, jobs)]
        return self._results(entries, fetch, raise_failed=not return_exceptions)

    def _results(self, entries: List[Tuple[str, Optional[Job], Dict[str, Any]]], fetch: Optional[bool],
                 raise_failed: bool) -> List[Union[Result, JobFailed]]:
        out: List[Union[Result, JobFailed]] = []
        want: List[Tuple[int, str, str]] = []  # (index, out uri, kind)
        for k, (jid, j, st) in enumerate(entries):
            if st["state"] == "failed":
                e = JobFailed(st.get("last_error") or f"job {jid} failed", job=jid, code="job_failed")
                if raise_failed:
                    raise e
                out.append(e)
                continue
            out.append(Result(jid, st, {}))
            kind = j.kind if j is not None else ""
            do = fetch if fetch is not None else bool(kind)
            if do:
                want.append((k, st["result"]["out"], kind or _default_kind()))
        if want:
            got = self._download_many([u for _, u, _ in want])
            for (k, uri, kind), ts in zip(want, got):
                res = out[k]
                assert isinstance(res, Result)
                sums = res.status["result"].get("sha256") or {}
                for name, t in ts.items():
                    if name in sums and hashlib.sha256(t.data).hexdigest() != sums[name]:
                        raise RmsgradError(f"job {res.id}: output {name} read from {uri} does not match the sha256 the worker recorded", job=res.id, uri=uri)
                    res.tensors[name] = arrays.from_raw(t, kind)
        return out

    # ---- objects ----------------------------------------------------------

    def upload(self, tensors: Mapping[str, TensorLike], uri: Optional[str] = None) -> str:
        """Write tensors (name -> array, tensor or RawTensor) as one
        safetensors object at ``uri`` (or a new object under the gateway's
        upload prefix) and return its URI; name a tensor in a job as
        URI#name."""
        req: Dict[str, Any] = {"uris": [uri]} if uri else {"count": 1}
        up = self._api("POST", "/v1/uploads", req)["uploads"][0]
        self._put(up, encode({n: arrays.to_raw(v, n) for n, v in tensors.items()}), up["uri"])
        return up["uri"]

    def download(self, uri: str) -> Dict[str, RawTensor]:
        """Read a safetensors object (an output) back: name -> RawTensor."""
        return self._download_many([uri])[0]

    def _download_many(self, uris: List[str]) -> List[Dict[str, RawTensor]]:
        urls: List[Dict[str, Any]] = []
        for i in range(0, len(uris), MAX_BATCH):
            urls.extend(self._api("POST", "/v1/downloads", {"uris": uris[i : i + MAX_BATCH]})["downloads"])

        def get(d: Dict[str, Any]) -> Dict[str, RawTensor]:
            r = self._pool.request("GET", d["url"])
            if r.status != 200:
                raise _store_error(r, "GET", d["uri"])
            return decode(r.body)[0]

        return list(self._exec.map(get, urls))

    def _put(self, up: Mapping[str, Any], body: bytes, what: str) -> None:
        headers = {"Content-Type": "application/octet-stream"}
        r = self._pool.request(up.get("method", "PUT"), up["url"], body=body, headers=headers)
        if r.status not in (200, 201, 204):
            raise _store_error(r, "PUT", up["uri"], what)

    # ---- the API ----------------------------------------------------------

    def _api(self, method: str, path: str, body: Any = None, timeout: Optional[float] = None) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        r = self._pool.request(method, self.url + path, body=data, headers=headers, timeout=timeout)
        try:
            doc = json.loads(r.body) if r.body else None
        except ValueError:
            doc = None
        if r.status >= 400:
            if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
                raise _error(r.status, doc["error"])
            raise RmsgradError(f"{method} {path}: HTTP {r.status}: {r.body[:200]!r}", status=r.status)
        return doc


def _job(x: str, w: str, dy: str, out: str, eps: float, outputs: Optional[Sequence[str]],
         grad_dtype: Optional[str] = None, w_sha256: Optional[str] = None) -> Dict[str, Any]:
    j: Dict[str, Any] = {"v": 1, "x": x, "w": w, "dy": dy, "out": out, "eps": float(eps)}
    if outputs:
        j["outputs"] = list(outputs)
    if grad_dtype:
        # Spelt as safetensors spells dtypes; the gateway refuses others.
        j["grad_dtype"] = grad_dtype
    if w_sha256:
        j["w_sha256"] = w_sha256
    return j


def _new_id() -> str:
    # Every job gets an id here, so a post retried after a dropped
    # connection is a no-op rather than a second job.
    return "py-" + uuid.uuid4().hex


def _default_kind() -> str:
    try:
        import numpy  # noqa: F401
    except ImportError:
        return "raw"
    return "numpy"


def _error(status: Optional[int], e: Mapping[str, Any]) -> RmsgradError:
    return RmsgradError(e.get("message", "error"), status=status, code=e.get("code"), job=e.get("job"),
                        tensor=e.get("tensor"), uri=e.get("uri"), field=e.get("field"))


def _store_error(r: Response, method: str, uri: str, what: str = "") -> RmsgradError:
    """An upload or download refused: the gateway's JSON error, or an S3
    XML one (Code, Message)."""
    body = r.body.decode("utf-8", "replace")
    code, msg = None, body[:300]
    if r.headers.get("content-type", "").startswith("application/json"):
        try:
            e = json.loads(body)["error"]
            code, msg = e.get("code"), e.get("message", msg)
        except (ValueError, KeyError, TypeError):
            pass
    else:
        mc = re.search(r"<Code>(.*?)</Code>", body)
        mm = re.search(r"<Message>(.*?)</Message>", body)
        if mc:
            code = mc.group(1)
            msg = mm.group(1) if mm else code
    where = f"{what} " if what else ""
    return RmsgradError(f"{where}{method} {uri}: HTTP {r.status} {code or ''}: {msg}".replace("  ", " "),
                        status=r.status, code=code, uri=uri)
