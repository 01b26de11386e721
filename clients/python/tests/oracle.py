"""The float64 reference for the tests: torch autograd, and the tolerance
of compute/computetest (Tolerance, CompareDX)."""

import math

import torch


def autograd(x, w, dy, eps):
    """dx and dw of y = x * rsqrt(mean(x^2, -1) + eps) * w, by torch
    autograd in float64."""
    x64 = x.detach().double().requires_grad_(True)
    w64 = w.detach().double().requires_grad_(True)
    r = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    y = x64 * r * w64
    y.backward(dy.detach().double())
    return x64.grad, w64.grad, r.detach()


def tolerance(k):
    """computetest.Tolerance: relative tolerance of a float32 sum of k terms."""
    u = 2.0 ** -24
    return 8 * u * math.sqrt(k) + 16 * u


def check(tc, x, w, dy, eps, dx, dw, name=""):
    """Assert dx and dw (float32) match autograd at computetest's tolerance:
    dx normwise on the scale of its two terms, dw on max|dw|."""
    want_dx, want_dw, r = autograd(x, w, dy, eps)
    d = x.shape[-1]
    rows = x.numel() // d
    k = max(rows, d)
    x64, w64, dy64 = x.double().reshape(rows, d), w.double(), dy.double().reshape(rows, d)
    r = r.reshape(rows, 1)
    c = (dy64 * x64 * w64).sum(-1, keepdim=True) * r * r / d
    scale_dx = max((r * dy64 * w64).abs().max().item(), (r * x64 * c).abs().max().item())
    tc.assertEqual(tuple(dx.shape), tuple(x.shape), f"{name} dx shape")
    tc.assertEqual(tuple(dw.shape), (d,), f"{name} dw shape")
    err_dx = (dx.double() - want_dx).abs().max().item()
    err_dw = (dw.double() - want_dw).abs().max().item()
    tc.assertLessEqual(err_dx, tolerance(k) * scale_dx + 1e-37, f"{name} dx off by {err_dx:g}")
    tc.assertLessEqual(err_dw, tolerance(k) * want_dw.abs().max().item() + 1e-37, f"{name} dw off by {err_dw:g}")
