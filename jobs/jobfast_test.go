package jobs

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzDecodeFast checks decodeFast against the reference decoder: whatever
// the fast one accepts, decodeSlow accepts as the same Job, so Decode is
// as strict as decodeSlow alone.
func FuzzDecodeFast(f *testing.F) {
	for _, s := range []string{
		goodPayload,
		`{"v":1,"x":"s3://b/x.safetensors","w":"s3://b/w.safetensors","dy":"s3://b/dy.safetensors","out":"s3://b/o/1.safetensors","eps":1e-06,"enqueued_ns":1764760000000000000}`,
		`{"v":1,"x":"a","w":"b","dy":"c","out":"d","eps":1e-5,"outputs":["r"],"sig":"00ff"}`,
		`{"v":1,"x":"a","w":"b","dy":"c","out":"d","eps":1e-5,"grad_dtype":"F32"}`,
		`{"v":1,"x":"a","w":"b","dy":"c","out":"d","eps":1e-5,"grad_dtype":"bf16"}`,
		`{"v":1,"grad_dtype":"BF16","grad_dtype":"F16"}`,
		`{"v":1,"x":"a","w":"b","dy":"c","out":"d","eps":1e-5,"w_sha256":"` + testPin + `"}`,
		`{"v":1,"w_sha256":"00","w_sha256":"11"}`,
		`{"v":1,"w_sha256":null}`,
		`{"v":1,"grad_dtype":null}`,
		`{"v":1,"outputs":[]}`,
		`{"v":1,"outputs":null}`,
		`{"V":1}`,
		`{"v":1,"v":2}`,
		`{"v":1.0}`,
		`{"v":-0,"eps":-0.0}`,
		`{"eps":1e400}`,
		`{"x":"\u0061"}`,
		`{"x":"é"}`,
		` { "v" : 1 , "x" : "a" } ` + "\n",
		`{"v":1}x`,
		`{"v":1,}`,
		`{}`,
		`{"enqueued_ns":9223372036854775808}`,
		`{"eps":01}`,
		`{"eps":1.}`,
		`{"eps":.5}`,
		`{"eps":1E+2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		fj, ok := decodeFast(payload)
		sj, err := decodeSlow(payload)
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("decodeFast accepted %q, decodeSlow rejects it: %v", payload, err)
		}
		if !reflect.DeepEqual(fj, sj) {
			t.Fatalf("decoders disagree on %q:\nfast %#v\nslow %#v", payload, fj, sj)
		}
	})
}

// TestDecodeFastTakesClientPayloads: what Client enqueues takes the fast
// path, signed or not.
func TestDecodeFastTakesClientPayloads(t *testing.T) {
	j := Job{X: "s3://b/x.safetensors#x", W: "s3://b/w.safetensors", DY: "s3://b/dy.safetensors", Out: "s3://b/out/1.safetensors",
		Eps: 1e-6, Outputs: []string{OutDX, OutR}, EnqueuedNS: 1764760000123456789}
	if err := j.Sign([]byte("k")); err != nil {
		t.Fatal(err)
	}
	p, err := j.Payload()
	if err != nil {
		t.Fatal(err)
	}
	got, ok := decodeFast(p)
	if !ok || !reflect.DeepEqual(got, j) {
		t.Fatalf("decodeFast(%s) = %+v, %v; want %+v", p, got, ok, j)
	}
}

// FuzzResultJSON: Result.marshal writes what json.Marshal writes.
func FuzzResultJSON(f *testing.F) {
	f.Add("s3://b/o.safetensors", "dx", "ab01", "worker-1", "b-17", 8, 1024, 5, 0.123, 1e-7, 3.0, 1e21, -0.0, 12.5)
	f.Add("a<b", "", "", "é", "\x00", 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
	f.Fuzz(func(t *testing.T, out, name, sum, worker, batch string, rows, dim, jobs int, t1, t2, t3, t4, t5, t6 float64) {
		r := Result{Out: out, SHA256: map[string]string{name: sum, "dw": "ff"}, DTypes: map[string]string{name: batch, "dw": "F32", "r": "F32"}, Rows: rows, Dim: dim, Backend: "cpu", Device: worker,
			Worker: worker, BatchID: batch, BatchJobs: jobs, Timings: Timings{t1, t2, t3, t4, t5, t6}}
		for _, r := range []Result{r, {Out: out, Worker: worker}} {
			got, gerr := r.marshal()
			want, werr := json.Marshal(&r)
			if (gerr == nil) != (werr == nil) || string(got) != string(want) {
				t.Fatalf("marshal = %s, %v; json.Marshal = %s, %v", got, gerr, want, werr)
			}
		}
	})
}
