package main

import (
	"fmt"
	"strings"

	"github.com/rmsgrad/rmsgrad/compute"
)

// parseDType reads a dtype flag value: f32, bf16 or f16 in any case.
func parseDType(flagName, s string) (compute.DType, error) {
	dt := compute.DType(strings.ToUpper(strings.TrimSpace(s)))
	if !dt.Valid() {
		return "", fmt.Errorf("--%s: unsupported dtype %q (supported: f32, bf16, f16)", flagName, s)
	}
	return dt, nil
}

// inputDTypes is the dtypes of one synthetic job's x, w and dy.
type inputDTypes struct{ x, w, dy compute.DType }

func (d inputDTypes) String() string {
	return strings.ToLower(fmt.Sprintf("%s/%s/%s", d.x, d.w, d.dy))
}

// parseDTypes parses synth's --dtype: a comma-separated list cycled
// through the jobs, each entry one dtype for x, w and dy ("bf16") or one
// per tensor as x/w/dy ("bf16/f32/bf16").
func parseDTypes(s string) ([]inputDTypes, error) {
	var out []inputDTypes
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(strings.TrimSpace(part), "/")
		var dts [3]compute.DType
		switch len(f) {
		case 1, 3:
			for i := range dts {
				dt, err := parseDType("dtype", f[i%len(f)])
				if err != nil {
					return nil, err
				}
				dts[i] = dt
			}
		default:
			return nil, fmt.Errorf("--dtype: %q is neither one dtype nor x/w/dy (e.g. bf16, or bf16/f32/bf16)", part)
		}
		out = append(out, inputDTypes{dts[0], dts[1], dts[2]})
	}
	return out, nil
}
