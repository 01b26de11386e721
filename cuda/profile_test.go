package cuda

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
)

// profileFor picks a profile by the device's name, and
// RMSGRAD_CUDA_PROFILE's value overrides it.
func TestProfileFor(t *testing.T) {
	for _, c := range []struct{ name, override, want string }{
		{"NVIDIA H200", "", "h200"},
		{"NVIDIA H200 NVL", "", "h200"},
		{"NVIDIA H100 80GB HBM3", "", ""},
		{"NVIDIA A100-SXM4-80GB", "", ""},
		{"NVIDIA H200", "default", ""},
		{"NVIDIA H100 80GB HBM3", "h200", "h200"},
	} {
		p, err := profileFor(c.name, c.override)
		if err != nil {
			t.Fatalf("profileFor(%q, %q): %v", c.name, c.override, err)
		}
		got := ""
		if p != nil {
			got = p.name
		}
		if got != c.want {
			t.Errorf("profileFor(%q, %q) = %q, want %q", c.name, c.override, got, c.want)
		}
	}
	if _, err := profileFor("NVIDIA H200", "h300"); !errors.Is(err, compute.ErrUnsupported) || !strings.Contains(err.Error(), "default, h200") {
		t.Errorf("an unknown profile: %v, want ErrUnsupported naming the profiles", err)
	}
}

// Every profile parses against the default table, keeps every class's
// widest row at least as wide as its block holds, and routes its class
// macros to the classes' programs alone.
func TestProfilesApply(t *testing.T) {
	for i := range deviceProfiles {
		p := &deviceProfiles[i]
		b := &Backend{arch: "sm_90"}
		if err := b.applyProfile(p); err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
		for _, o := range p.opts {
			k, ok := optClass(o)
			if !ok || !strings.Contains(o, "=") {
				t.Errorf("%s: option %q is not a class macro -DRMS_Cc_X=v", p.name, o)
				continue
			}
			for part := range kernelParts() {
				if got := slices.Contains(b.compileOpts(part), o); got != partHoldsClass(part, k) {
					t.Errorf("%s: part %d holds %q: %v, want %v", p.name, part, o, got, partHoldsClass(part, k))
				}
			}
		}
		for c, fc := range b.classTable() {
			if fc.maxNch > fc.k*fc.maxThreads || fc.maxNch < 1 {
				t.Errorf("%s: class %d holds %d chunks in blocks of %dx%d", p.name, c, fc.maxNch, fc.k, fc.maxThreads)
			}
		}
	}
}

// A profile changes the backend's table, not fusedClasses; its geometry
// reaches the programs of the classes it changes; a class macro that
// RMSGRAD_CUDA_NVRTC_OPTS defines too is the variant's.
func TestApplyProfile(t *testing.T) {
	t.Setenv("RMSGRAD_CUDA_NVRTC_OPTS", "-DRMS_C6_R=1")
	before := fusedClasses
	p := &deviceProfile{name: "test", geom: "4:4x320x2/1280s,5:4x384x2s", opts: []string{"-DRMS_C6_R=2", "-DRMS_C2_S=3"}}
	b := &Backend{arch: "sm_90"}
	if err := b.applyProfile(p); err != nil {
		t.Fatal(err)
	}
	if fusedClasses != before {
		t.Fatal("applyProfile changed fusedClasses")
	}
	tab := b.classTable()
	if tab[4].maxNch != 1280 || !tab[5].ws || tab[5].minBlocks != 2 {
		t.Errorf("table after the profile: c4 %+v, c5 %+v", tab[4], tab[5])
	}
	if c, th := classIn(tab, 5120, 4); c != 4 || th != 320 {
		t.Errorf("5120 f32 in class %d, %d threads; want c4, 320", c, th)
	}
	if c, _ := classIn(tab, 5248, 4); c != 5 {
		t.Errorf("5248 f32 in class %d; want c5", c)
	}
	if c, _ := classOf(5120, 4); c != 5 {
		t.Errorf("the default table moved: 5120 f32 in class %d", c)
	}
	for part := range kernelParts() {
		opts := b.compileOpts(part)
		if got := slices.Contains(opts, "-DRMS_C4_MAXT=320") && slices.Contains(opts, "-DRMS_C4_WS=2"); got != partHoldsClass(part, 4) {
			t.Errorf("part %d: c4's geometry in %v: %v", part, opts, got)
		}
		if got := slices.Contains(opts, "-DRMS_C5_MINB=2"); got != partHoldsClass(part, 5) {
			t.Errorf("part %d: c5's geometry in %v: %v", part, opts, got)
		}
		if got := slices.Contains(opts, "-DRMS_C2_S=3"); got != partHoldsClass(part, 2) {
			t.Errorf("part %d: c2's macro in %v: %v", part, opts, got)
		}
		if slices.Contains(opts, "-DRMS_C6_R=2") {
			t.Errorf("part %d: the profile's -DRMS_C6_R=2 beside the variant's: %v", part, opts)
		}
		if got := slices.Contains(opts, "-DRMS_C6_R=1"); got != partHoldsClass(part, 6) {
			t.Errorf("part %d: the variant's c6 macro in %v: %v", part, opts, got)
		}
	}
	// The defaults: no profile, the default table.
	if err := b.applyProfile(nil); err != nil || b.profile != nil || b.classTable()[4] != fusedClasses[4] {
		t.Errorf("applyProfile(nil): %v, profile %v, c4 %+v", err, b.profile, b.classTable()[4])
	}
}
