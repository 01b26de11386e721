package main

import (
	"reflect"
	"testing"
)

func TestParseCPUInfo(t *testing.T) {
	x86 := "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n" +
		"flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 amx_tile amx_bf16 sha_ni\n\n" +
		"processor\t: 1\nmodel name\t: Other\nflags\t\t: fpu\n"
	m, f := parseCPUInfo(x86)
	if m != "Intel(R) Xeon(R) Processor" {
		t.Errorf("model %q", m)
	}
	if want := []string{"AVX2", "AVX-512", "AVX-512 BF16", "AMX", "SHA-NI"}; !reflect.DeepEqual(f, want) {
		t.Errorf("features %q, want %q", f, want)
	}
	m, f = parseCPUInfo("processor\t: 0\nFeatures\t: fp asimd sha2 crc32\n")
	if m != "" || !reflect.DeepEqual(f, []string{"NEON", "SHA2"}) {
		t.Errorf("arm64: model %q features %q", m, f)
	}
	if m, f := parseCPUInfo("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2\n"); m != "AMD EPYC" || !reflect.DeepEqual(f, []string{"AVX2"}) {
		t.Errorf("epyc: model %q features %q", m, f)
	}
}
