package main

import (
	"os"
	"os/exec"
	"strings"
)

// cpuModel names the machine's CPU for the report's header: Linux's
// /proc/cpuinfo "model name" (x86) or, failing that, macOS's
// machdep.cpu.brand_string ("Apple M2").
func cpuModel() string {
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if m, _ := parseCPUInfo(string(b)); m != "" {
			return m
		}
	}
	if out, err := exec.Command("sysctl", "-n", "machdep.cpu.brand_string").Output(); err == nil {
		if m := strings.TrimSpace(string(out)); m != "" {
			return m
		}
	}
	return "unknown CPU"
}

// cpuLabel is cpuModel with the instruction-set features that decide which
// of rmsgrad's code paths run (the CPU kernels' AVX2 and AVX-512 BF16, the
// paired SHA-256's SHA-NI), as /proc/cpuinfo lists them: "Intel(R) Xeon(R)
// Processor; AVX2, AVX-512, AVX-512 BF16, AMX, SHA-NI".
func cpuLabel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return cpuModel()
	}
	m, feats := parseCPUInfo(string(b))
	if m == "" {
		m = cpuModel()
	}
	if len(feats) > 0 {
		return m + "; " + strings.Join(feats, ", ")
	}
	return m
}

// parseCPUInfo reads the first processor's model name and the features of
// cpuLabel from a /proc/cpuinfo text.
func parseCPUInfo(text string) (model string, feats []string) {
	var flags map[string]bool
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			if model == "" {
				model = strings.TrimSpace(v)
			}
		case "flags", "Features":
			if flags == nil {
				flags = map[string]bool{}
				for _, f := range strings.Fields(v) {
					flags[f] = true
				}
			}
		}
	}
	for _, f := range []struct{ flag, name string }{
		{"avx2", "AVX2"}, {"avx512f", "AVX-512"}, {"avx512_bf16", "AVX-512 BF16"},
		{"amx_tile", "AMX"}, {"sha_ni", "SHA-NI"}, {"asimd", "NEON"}, {"sha2", "SHA2"},
	} {
		if flags[f.flag] {
			feats = append(feats, f.name)
		}
	}
	return model, feats
}
