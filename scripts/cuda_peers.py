#!/usr/bin/env python3
"""Torch peers of the cuda backend's RMSNorm backward, and the table.

Run by scripts/bench-cuda.sh on the GPU machine after the Go benchmark
(cuda.TestBenchTable) wrote its JSON. For each shape it times, with CUDA
events (triton.testing.do_bench, median, L2 flushed between runs):
  copy      torch device copy moving the same bytes (read + write)
  eager     autograd backward of the eager RMSNorm (x * rsqrt(mean(x^2)+eps) * w)
  rms_norm  backward of torch.nn.functional.rms_norm
  compile   torch.compile of the closed form (dx, dw)
and prints one Markdown table with each as a share of copy bandwidth,
counting the minimal traffic: read x, dy, w; write dx, dw (12*rows*dim +
8*dim bytes in F32, 6*rows*dim + 4*dim in BF16: the "bytes" of the Go
JSON). A row of dtype BF16 runs every peer on bfloat16 tensors: the eager
RMSNorm and F.rms_norm as torch runs them in bf16, and the compiled closed
form computing in float32 with bf16 inputs and outputs (what our kernels do).
"""
import json
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

EPS = 1e-5


def closed_form(x, w, dy):
    # float32 arithmetic whatever the inputs' dtype, outputs in the inputs'
    # dtypes (no-ops for float32 tensors).
    xf, wf, dyf = x.float(), w.float(), dy.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    s = (dyf * xf * wf).sum(-1, keepdim=True)
    dx = r * (dyf * wf - xf * (s * r * r / x.shape[-1]))
    dw = (dyf * xf * r).sum(0)
    return dx.to(x.dtype), dw.to(w.dtype)


# dynamic=False: one specialised kernel per shape, as a user benchmarking one
# shape gets (with automatic dynamic shapes the later shapes reuse a generic one).
compiled = torch.compile(closed_form, dynamic=False)


def bench(fn):
    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1000.0  # us


DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def peers(rows, dim, dtype, nbytes):
    g = torch.Generator(device="cuda").manual_seed(rows * 7919 + dim)
    dt = DTYPES[dtype]
    x = (torch.rand(rows, dim, device="cuda", generator=g) * 2 - 1).to(dt)
    dy = (torch.rand(rows, dim, device="cuda", generator=g) - 0.5).to(dt)
    w = (torch.rand(dim, device="cuda", generator=g) * 0.2 + 0.9).to(dt)
    src = torch.empty(nbytes // 8, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    out = {"copy_us": bench(lambda: dst.copy_(src))}

    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = xe * torch.rsqrt(xe.pow(2).mean(-1, keepdim=True) + EPS) * we
    out["eager_us"] = bench(lambda: torch.autograd.grad(y, (xe, we), dy, retain_graph=True))
    ref_dx, ref_dw = torch.autograd.grad(y, (xe, we), dy, retain_graph=True)
    del y

    y = F.rms_norm(xe, (dim,), we, EPS)
    out["rms_norm_us"] = bench(lambda: torch.autograd.grad(y, (xe, we), dy, retain_graph=True))
    del y

    t0 = time.time()
    dx, dw = compiled(x, w, dy)
    torch.cuda.synchronize()
    out["compile_s"] = time.time() - t0
    out["compile_us"] = bench(lambda: compiled(x, w, dy))
    # The compiled closed form must agree with autograd, or its time means nothing.
    e = ((dx.double() - ref_dx.double()).norm() / ref_dx.double().norm()).item()
    out["compile_rel_err"] = e
    del xe, we, dx, dw, ref_dx, ref_dw, src, dst
    torch.cuda.empty_cache()
    return out


def main():
    ours = json.load(open(sys.argv[1]))
    print(f"# device: {ours['device']} / torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    rows = []
    for r in ours["results"]:
        p = {}
        if r["jobs"] == 1:
            p = peers(r["rows"], r["dim"], r.get("dtype", "F32"), r["bytes"])
            print(f"# peers {r['name']}: " + json.dumps({k: float(f"{v:.4g}") for k, v in p.items()}), flush=True)
        rows.append((r, p))

    def pct(bytes_, us, copy_us):
        return 100.0 * copy_us / us if us else float("nan")

    print()
    print("| shape | dtype | copy GB/s (cuMemcpy) | ours (us) | ours % of copy | c=a+b % | torch eager (us, %) | F.rms_norm bwd (us, %) | torch.compile (us, %) | ours vs best peer |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r, p in rows:
        if r["jobs"] != 1:
            continue
        b, c = r["bytes"], r["copy_us"]
        gbs = b / c / 1e3
        line = f"| {r['rows']}x{r['dim']} | {r.get('dtype', 'F32').lower()} | {gbs:.0f} | {r['ours_us']:.1f} | {pct(b, r['ours_us'], c):.1f}% | {pct(b, r['add_us'], c):.1f}% |"
        best = min(p["eager_us"], p["rms_norm_us"], p["compile_us"])
        for k in ("eager_us", "rms_norm_us", "compile_us"):
            line += f" {p[k]:.1f} ({pct(b, p[k], c):.0f}%) |"
        line += f" {best / r['ours_us']:.2f}x |"
        print(line)
    for r, _ in rows:
        if r["jobs"] == 1:
            continue
        print()
        print(f"| {r['name']} in one command buffer | GPU time, device-resident (us) | per job (us) | one command buffer per job (us/job) |")
        print("|---|---|---|---|")
        one = f"{r['one_launch_per_job_us']:.2f}" if r.get("one_launch_per_job_us") else "-"
        print(f"| ours | {r['ours_us']:.1f} | {r['perjob_us']:.3f} | {one} |")
        if r.get("host_us"):
            print()
            print(f"| {r['name']}, one Execute | host side to the synchronize (us) | whole Execute (us) | device time with transfers (us) | driver copies | launches |")
            print("|---|---|---|---|---|---|")
            print(f"| small buffers mapped (the default) | {r['host_us']:.0f} | {r['wall_us']:.0f} | {r['total_us']:.0f} | {r['copies']} | {r['launches']} |")
            print(f"| every buffer copied (RMSGRAD_CUDA_MAP_BYTES=0) | {r['host_copies_us']:.0f} | {r['wall_copies_us']:.0f} | {r['total_copies_us']:.0f} | {r['copies_copies']} | {r['launches']} |")
            print(f"mapped and copied runs bit-identical: {r.get('mapped_equals_copied', False)}")
    ok = all(r["correct"] for r, _ in rows)
    print()
    print(f"oracle check of every shape: {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
