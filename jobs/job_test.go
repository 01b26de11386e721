package jobs

import (
	"errors"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
)

const goodPayload = `{"v":1,"x":"s3://b/in.safetensors#x","w":"s3://b/in.safetensors#w","dy":"s3://b/in.safetensors#dy","out":"s3://b/out.safetensors","eps":1e-6}`

// testPin is the SHA-256 of no bytes.
const testPin = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

func TestDecodeValid(t *testing.T) {
	j, err := Decode([]byte(goodPayload))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if j.Eps != 1e-6 || j.X != "s3://b/in.safetensors#x" {
		t.Fatalf("decoded %+v", j)
	}
	if got := j.WantOutputs(); strings.Join(got, ",") != "dx,dw" {
		t.Fatalf("default outputs = %v", got)
	}
	j2, err := Decode([]byte(strings.Replace(goodPayload, `"eps":1e-6`, `"eps":1e-5,"outputs":["r","dx"]`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := j2.WantOutputs(); strings.Join(got, ",") != "dx,r" {
		t.Fatalf("outputs canonical order = %v", got)
	}
	j3, err := Decode([]byte(strings.Replace(goodPayload, `"eps":1e-6`, `"eps":1e-6,"w_sha256":"`+testPin+`"`, 1)))
	if err != nil || j3.WSHA256 != testPin {
		t.Fatalf("w_sha256: %+v, %v", j3, err)
	}
	for _, c := range []struct {
		grad, x, w, wantDX, wantDW string
	}{{"", "BF16", "F32", "BF16", "F32"}, {"F32", "BF16", "F16", "F32", "F32"}, {"BF16", "F32", "F32", "BF16", "BF16"}} {
		p := strings.Replace(goodPayload, `"eps":1e-6`, `"eps":1e-6,"grad_dtype":"`+c.grad+`"`, 1)
		if c.grad == "" {
			p = goodPayload
		}
		j, err := Decode([]byte(p))
		if err != nil {
			t.Fatal(err)
		}
		if dx, dw := j.GradDTypes(compute.DType(c.x), compute.DType(c.w)); string(dx) != c.wantDX || string(dw) != c.wantDW {
			t.Fatalf("grad_dtype %q with x %s, w %s: dx %s, dw %s; want %s, %s", c.grad, c.x, c.w, dx, dw, c.wantDX, c.wantDW)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	cases := []struct {
		name, payload, field string
	}{
		{"malformed JSON", `{"v":1,`, "payload"},
		{"not an object", `[1,2]`, "payload"},
		{"unknown field", strings.Replace(goodPayload, `"eps"`, `"evil":1,"eps"`, 1), "payload"},
		{"trailing data", goodPayload + `{}`, "payload"},
		{"version 2", strings.Replace(goodPayload, `"v":1`, `"v":2`, 1), "v"},
		{"missing version", strings.Replace(goodPayload, `"v":1,`, ``, 1), "v"},
		{"eps zero", strings.Replace(goodPayload, `1e-6`, `0`, 1), "eps"},
		{"eps negative", strings.Replace(goodPayload, `1e-6`, `-1e-6`, 1), "eps"},
		{"eps NaN literal", strings.Replace(goodPayload, `1e-6`, `NaN`, 1), "payload"},
		{"eps underflows f32", strings.Replace(goodPayload, `1e-6`, `1e-300`, 1), "eps"},
		{"eps overflows f32", strings.Replace(goodPayload, `1e-6`, `1e300`, 1), "eps"},
		{"missing x", strings.Replace(goodPayload, `"x":"s3://b/in.safetensors#x",`, ``, 1), "x"},
		{"missing out", strings.Replace(goodPayload, `"out":"s3://b/out.safetensors",`, ``, 1), "out"},
		{"out equals input", strings.Replace(goodPayload, `s3://b/out.safetensors`, `s3://b/in.safetensors`, 1), "out"},
		{"unknown output", strings.Replace(goodPayload, `"eps":1e-6`, `"eps":1e-6,"outputs":["dz"]`, 1), "outputs"},
		{"duplicate output", strings.Replace(goodPayload, `"eps":1e-6`, `"eps":1e-6,"outputs":["dx","dx"]`, 1), "outputs"},
		{"grad_dtype lowercase", strings.Replace(goodPayload, `"eps":1e-6`, `"eps":1e-6,"grad_dtype":"f32"`, 1), "grad_dtype"},
		{"grad_dtype F64", strings.Replace(goodPayload, `"eps":1e-6`, `"eps":1e-6,"grad_dtype":"F64"`, 1), "grad_dtype"},
		{"grad_dtype not a string", strings.Replace(goodPayload, `"eps":1e-6`, `"eps":1e-6,"grad_dtype":16`, 1), "payload"},
		{"w_sha256 short", strings.Replace(goodPayload, `"eps":1e-6`, `"eps":1e-6,"w_sha256":"`+strings.Repeat("a", 63)+`"`, 1), "w_sha256"},
		{"w_sha256 upper case", strings.Replace(goodPayload, `"eps":1e-6`, `"eps":1e-6,"w_sha256":"`+strings.ToUpper(testPin)+`"`, 1), "w_sha256"},
		{"w_sha256 not hex", strings.Replace(goodPayload, `"eps":1e-6`, `"eps":1e-6,"w_sha256":"`+strings.Repeat("g", 64)+`"`, 1), "w_sha256"},
		{"w_sha256 not a string", strings.Replace(goodPayload, `"eps":1e-6`, `"eps":1e-6,"w_sha256":1`, 1), "payload"},
		{"too large", `{"v":1,"x":"` + strings.Repeat("a", MaxPayloadBytes) + `"}`, "payload"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode([]byte(c.payload))
			if !errors.Is(err, ErrInvalidJob) {
				t.Fatalf("Decode(%s) = %v, want ErrInvalidJob", c.name, err)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != c.field {
				t.Fatalf("Decode(%s) error %v names field %q, want %q", c.name, err, fieldOf(fe), c.field)
			}
		})
	}
}

func fieldOf(fe *FieldError) string {
	if fe == nil {
		return ""
	}
	return fe.Field
}

// The payload limit holds for a job's encoding too: a payload under the
// limit whose URIs carry characters that encoding/json escapes (here '<',
// six bytes encoded) is refused when its encoding is over it, and Payload
// refuses to produce such an encoding; one whose encoding fits round-trips.
func TestPayloadLimitAsEncoded(t *testing.T) {
	mk := func(n int) []byte {
		return []byte(`{"v":1,"x":"s3://b/` + strings.Repeat("<", n) + `#x","w":"s3://b/w#w","dy":"s3://b/dy#dy","out":"s3://b/o","eps":1e-5}`)
	}
	over := mk(3000) // about 3.1 KB as sent, 18 KB encoded
	if len(over) > MaxPayloadBytes {
		t.Fatalf("test payload is %d bytes; want it under the limit as sent", len(over))
	}
	_, err := Decode(over)
	if !errors.Is(err, ErrInvalidJob) || !strings.Contains(err.Error(), "as encoded") {
		t.Fatalf("Decode of a payload whose encoding is over the limit: %v; want an invalid-job error naming the encoded size", err)
	}
	j := Job{X: "s3://b/" + strings.Repeat("<", 3000) + "#x", W: "s3://b/w#w", DY: "s3://b/dy#dy", Out: "s3://b/o", Eps: 1e-5}
	if _, err := j.Payload(); !errors.Is(err, ErrInvalidJob) {
		t.Fatalf("Payload of a job encoding over the limit: %v; want ErrInvalidJob", err)
	}
	under := mk(2000) // 12 KB encoded
	j2, err := Decode(under)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	p, err := j2.Payload()
	if err != nil {
		t.Fatalf("Payload: %v", err)
	}
	if j3, err := Decode(p); err != nil || j3.X != j2.X {
		t.Fatalf("round trip: %v, x %q vs %q", err, j3.X, j2.X)
	}
}

func TestSignVerify(t *testing.T) {
	key := []byte("k3y")
	j, err := Decode([]byte(goodPayload))
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Verify(key); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("unsigned job verified: %v", err)
	}
	if err := j.Sign(key); err != nil {
		t.Fatal(err)
	}
	p, _ := j.Payload()
	j2, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := j2.Verify(key); err != nil {
		t.Fatalf("signed job rejected after a round trip: %v", err)
	}
	if err := j2.Verify([]byte("other")); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("wrong key accepted: %v", err)
	}
	j2.Out = "s3://b/elsewhere.safetensors"
	if err := j2.Verify(key); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("tampered job accepted: %v", err)
	}
}

// FuzzDecode: Decode never panics, and whatever it accepts re-encodes to a
// payload it accepts again with the same meaning.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(goodPayload))
	f.Add([]byte(`{"v":1,"x":"a","w":"b","dy":"c","out":"d","eps":1e-5,"outputs":["r"]}`))
	f.Add([]byte(`{"v":1,"x":"a#1","w":"a#2","dy":"a#3","out":"a#4","eps":1}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"v":1,"x":"a","w":"b","dy":"c","out":"d","eps":1e-5,"grad_dtype":"BF16"}`))
	f.Add([]byte(`{"v":1,"x":"a","w":"b","dy":"c","out":"d","eps":1e-5,"w_sha256":"` + testPin + `"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidJob) {
				t.Fatalf("error not ErrInvalidJob: %v", err)
			}
			return
		}
		p, err := j.Payload()
		if err != nil {
			t.Fatal(err)
		}
		j2, err := Decode(p)
		if err != nil {
			t.Fatalf("re-encoded payload rejected: %v", err)
		}
		if j2.X != j.X || j2.Eps != j.Eps || j2.Out != j.Out || j2.GradDType != j.GradDType || strings.Join(j2.WantOutputs(), ",") != strings.Join(j.WantOutputs(), ",") {
			t.Fatalf("round trip changed the job: %+v vs %+v", j, j2)
		}
	})
}
