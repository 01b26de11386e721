package cuda

import (
	"os"
	"os/exec"
	"testing"
)

// scripts/cuda_leads_combine.py, which scripts/cuda-leads-call.sh runs on
// the GPU machine to combine the geometry leads that beat the device's
// profile, on a fixture: per class the best variant that gained a point or
// more on average and lost no more than one at any dim (c0's geometry, not
// c0's faster variant with a FAIL line; c1's blocks of 256 four a SM, not
// the variant that lost 1.5 at 1536; RMS_NARROW8 over the half classes;
// not c8's variant under a point), and never the defaults against the
// profile.
func TestLeadsCombine(t *testing.T) {
	py := os.Getenv("RMSGRAD_PYTHON")
	if py == "" {
		py = "python3"
	}
	if _, err := exec.LookPath(py); err != nil {
		if os.Getenv("RMSGRAD_REQUIRE_SERVERS") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	out, err := exec.Command(py, "../scripts/cuda_leads_combine.py", "testdata/leads-variants.log").Output()
	if err != nil {
		t.Fatalf("cuda_leads_combine.py: %v", err)
	}
	want := "GEOM=0:1x256x3,1:2x256x4\nOPTS=-DRMS_NARROW8=1\nDIMS=1024,1536,2048,4096\nDTYPES=bf16,f32\n"
	if got := string(out); got != want {
		t.Fatalf("cuda_leads_combine.py printed\n%s\nwant\n%s", got, want)
	}
}
