#!/usr/bin/env python3
"""Used by scripts/cuda-leads-call.sh: per class, the variant of the leads
that beat the device's profile (N) by at least MIN points on average over
the class's dims and lost no more than one at any, all such winners
combined. Reads variants.log files (scripts/cuda-device-run.sh); prints
what it weighed to stderr and, on stdout, four lines: GEOM= (for
RMSGRAD_CUDA_CLASS_GEOM), OPTS= (RMSGRAD_CUDA_NVRTC_OPTS), DIMS= (the
changed classes' dims measured) and DTYPES=. A variant with a FAIL or
Error line (a wrong result, a refused geometry) is never taken."""
import re, sys
from collections import defaultdict
MIN = 1.0
line = re.compile(r"^\[(.*?)\] .*?(\d+)x(\d+)\s+(\w+)\s+class\s+(-?\d+).*->\s+([\d.]+)% of copy")
runs = defaultdict(lambda: defaultdict(list))  # variant -> (dim,dt) -> [pct]
cls = {}  # (dim,dt) -> class under N
bad = set()
for f in sys.argv[1:]:
    try:
        for l in open(f):
            m = line.match(l)
            if m:
                v, rows, dim, dt, c, pct = m.groups()
                runs[v][(int(dim), dt.lower())].append(float(pct))
                if v == "RMSGRAD_NOOP=1":
                    cls[(int(dim), dt.lower())] = int(c)
            elif l.startswith("[") and ("FAIL" in l or "Error" in l):
                bad.add(l[1:l.index("]")])
    except OSError:
        pass
N = "RMSGRAD_NOOP=1"
base = {k: sum(v) / len(v) for k, v in runs[N].items()}
def classes_of(v):
    cs = set()
    for kv in v.split("+"):
        k, _, val = kv.partition("=")
        if k == "RMSGRAD_CUDA_CLASS_GEOM":
            for it in val.split(","):
                cs.add(int(it.split(":")[0]))
        elif k == "RMSGRAD_CUDA_NVRTC_OPTS":
            for o in val.split():
                m = re.match(r"-DRMS_C(\d+)_", o)
                if m:
                    cs.add(int(m.group(1)))
                elif o.startswith("-DRMS_NARROW8"):
                    cs.add(100)  # every half class: a pseudo-class
        elif k == "RMSGRAD_CUDA_PROFILE":
            cs.update({4, 5, 6})
    return cs
best = {}  # class -> (gain, variant)
for v, res in runs.items():
    if v == N:
        continue
    for c in classes_of(v):
        keys = [k for k in res if (cls.get(k) == c or (c == 100 and cls.get(k, -1) >= 7)) and k in base]
        if v.startswith("RMSGRAD_CUDA_PROFILE"):
            keys = [k for k in res if k in base and cls.get(k) in (4, 6) and k[1] == "f32"]
        if not keys:
            continue
        d = [sum(res[k]) / len(res[k]) - base[k] for k in keys]
        gain, worst = sum(d) / len(d), min(d)
        ok = v not in bad and gain >= MIN and worst >= -1.0
        print(f"class {c:2d} {v}: mean {gain:+.1f} (worst {worst:+.1f}) over {sorted(keys)}{' BAD' if v in bad else ''}{' <-' if ok else ''}", file=sys.stderr)
        if ok and (c not in best or gain > best[c][0]):
            best[c] = (gain, v)
geom, opts, dims, dts = [], [], set(), set()
for c, (g, v) in sorted(best.items()):
    if v.startswith("RMSGRAD_CUDA_PROFILE"):
        print(f"class {c}: the defaults beat the profile by {g:+.1f}: not combined (revert by hand)", file=sys.stderr)
        continue
    for kv in v.split("+"):
        k, _, val = kv.partition("=")
        if k == "RMSGRAD_CUDA_CLASS_GEOM":
            geom += [it for it in val.split(",") if int(it.split(":")[0]) == c]
        elif k == "RMSGRAD_CUDA_NVRTC_OPTS":
            opts += [o for o in val.split() if o.startswith(f"-DRMS_C{c}_") or (c == 100 and o.startswith("-DRMS_NARROW8"))]
    for k, kc in cls.items():
        if kc == c or (c == 100 and kc >= 7):
            dims.add(k[0]); dts.add(k[1])
    print(f"class {c}: {v} ({g:+.1f})", file=sys.stderr)
print("GEOM=" + ",".join(geom))
print("OPTS=" + " ".join(opts))
print("DIMS=" + ",".join(str(d) for d in sorted(dims)))
print("DTYPES=" + ",".join(sorted(dts)))
