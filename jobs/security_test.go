package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSignedJobsOnly: with a signing key configured, the worker runs only
// payloads that carry a valid HMAC-SHA256 from the enqueue side. Unsigned,
// tampered and foreign-key payloads are archived at once (0 retries), named
// as signature failures before any storage is touched, and counted in
// rmsgrad_jobs_bad_signature_total; signed jobs beside them complete.
func TestSignedJobsOnly(t *testing.T) {
	key := []byte("shared-signing-key-for-the-test")
	e := newRealEnv(t, Limits{}, key)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	S := "s3://" + allowedBucket + "/"
	g := e.goods[0]
	// The job's x does not exist: had the worker looked at storage before
	// checking the signature, the message would say "not found".
	unsafeJob := func(p string) Job {
		return Job{V: Version, X: p + ".missing#x", W: g.uri + "#w", DY: g.uri + "#dy", Out: p + ".out", Eps: 1e-6}
	}
	signed := func(t *testing.T, j Job, k []byte) []byte {
		if err := j.Sign(k); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []badCase{
		{name: "unsigned", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return unsafeJob(p), nil
		}, want: []string{"bad job signature", "unsigned"}},
		{name: "tampered out", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := unsafeJob(p)
			return Job{}, mustReplace(t, signed(t, j, key), `.out"`, `.elsewhere"`)
		}, want: []string{"bad job signature", "does not match"}},
		{name: "tampered eps", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return Job{}, mustReplace(t, signed(t, unsafeJob(p), key), `"eps":0.000001`, `"eps":0.1`)
		}, want: []string{"bad job signature", "does not match"}},
		{name: "signature moved to another job", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			var a Job
			if err := json.Unmarshal(signed(t, unsafeJob(p+"a"), key), &a); err != nil {
				t.Fatal(err)
			}
			b := unsafeJob(p)
			b.Sig = a.Sig
			return b, nil
		}, want: []string{"bad job signature", "does not match"}},
		{name: "signed with another key", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return Job{}, signed(t, unsafeJob(p), []byte("not-the-shared-key"))
		}, want: []string{"bad job signature", "does not match"}},
		{name: "signature not hex", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := unsafeJob(p)
			j.Sig = "zz"
			return j, nil
		}, want: []string{"bad job signature", "not hex"}},
	}
	payloadOf := func(t *testing.T, j Job) []byte {
		j.V = Version
		b, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := fmt.Sprintf("%ssig%d", S, ci)
			runBadCase(t, ctx, e, c, p, ci, payloadOf)
			if strings.Contains(c.name, "tampered out") {
				if _, err := e.admin.Head(ctx, p+".elsewhere#dx"); err == nil {
					t.Fatal("the tampered output was written")
				}
			}
		})
	}
	// A signed job reaching storage: its real errors come back as usual.
	t.Run("signed job with a missing input is judged on its input", func(t *testing.T) {
		id, err := e.client.Enqueue(ctx, unsafeJob(S+"sig-signed"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.client.Wait(ctx, id)
		if err == nil || !strings.Contains(err.Error(), "not found") || strings.Contains(err.Error(), "signature") {
			t.Fatalf("signed job with a missing x: %v, want not found", err)
		}
	})
	got := counter(t, e.reg, "rmsgrad_jobs_bad_signature_total", nil)
	if got != float64(len(cases)) {
		t.Fatalf("rmsgrad_jobs_bad_signature_total = %v, want %d", got, len(cases))
	}
	if strings.Contains(e.logs.String(), string(key)) {
		t.Fatal("the signing key appears in the worker's logs")
	}
}

// TestJobCannotChooseEndpointOrCredentials: the S3 endpoint, region and
// credentials come from the worker's configuration only. A payload naming
// another host, credentials, a non-allow-listed bucket or another scheme is
// archived as permanent (0 retries) with a message saying why, and the
// worker never opens a connection to the host the job named: a listener
// standing in for it counts connections and must count none.
func TestJobCannotChooseEndpointOrCredentials(t *testing.T) {
	e := newRealEnv(t, Limits{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	evil, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	var dials atomic.Int64
	go func() {
		for {
			c, err := evil.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			c.Close()
		}
	}()
	host := evil.Addr().String()
	S := "s3://" + allowedBucket + "/"
	g := e.goods[1]
	with := func(mut func(j *Job)) func(t *testing.T, e *realEnv, p string) (Job, []byte) {
		return func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := Job{X: g.uri + "#x", W: g.uri + "#w", DY: g.uri + "#dy", Out: p + ".out", Eps: 1e-6}
			mut(&j)
			return j, nil
		}
	}
	field := func(name, value string) func(t *testing.T, e *realEnv, p string) (Job, []byte) {
		return func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			b, err := json.Marshal(Job{V: Version, X: g.uri + "#x", W: g.uri + "#w", DY: g.uri + "#dy", Out: p + ".out", Eps: 1e-6})
			if err != nil {
				t.Fatal(err)
			}
			return Job{}, append(b[:len(b)-1], fmt.Sprintf(`,%q:%q}`, name, value)...)
		}
	}
	cases := []badCase{
		{name: "endpoint in the bucket", make: with(func(j *Job) { j.X = "s3://" + host + "/" + allowedBucket + "/good/1.safetensors#x" }),
			want: []string{"tensor x", "credentials and endpoints come from configuration"}},
		{name: "credentials and endpoint in the URI", make: with(func(j *Job) { j.W = "s3://AKIAEVIL:evilsecret@" + host + "/" + allowedBucket + "/k#w" }),
			want: []string{"tensor w", "credentials and endpoints come from configuration"}},
		{name: "endpoint as the output bucket", make: with(func(j *Job) { j.Out = "s3://" + host + "/stolen" }),
			want: []string{"tensor out", "credentials and endpoints come from configuration"}},
		{name: "hostname-like bucket outside the allow-list", make: with(func(j *Job) { j.DY = "s3://evil.example.com/" + allowedBucket + "#dy" }),
			want: []string{"tensor dy", `bucket "evil.example.com" is not in the allow-list`}},
		{name: "metadata service as a bucket", make: with(func(j *Job) { j.X = "s3://169.254.169.254/latest/meta-data#x" }),
			want: []string{"tensor x", "cannot be an ip address"}},
		{name: "http URI", make: with(func(j *Job) { j.X = "http://" + host + "/x.safetensors#x" }),
			want: []string{"tensor x", `unknown scheme "http"`}},
		{name: "https output URI", make: with(func(j *Job) { j.Out = "https://" + host + "/out" }),
			want: []string{"tensor out", `unknown scheme "https"`}},
		{name: "file URI with a host", make: with(func(j *Job) { j.X = "file://" + host + "/etc/passwd#x" }),
			want: []string{"tensor x", "no host"}},
		{name: "percent-escaped path", make: with(func(j *Job) { j.X = S + "good%2F..%2F1.safetensors#x" }),
			want: []string{"tensor x", "percent escapes"}},
		{name: "endpoint field", make: field("endpoint", host), want: []string{"payload", `unknown field "endpoint"`}},
		{name: "access_key field", make: field("access_key", "AKIAEVIL"), want: []string{"payload", `unknown field "access_key"`}},
		{name: "secret_key field", make: field("secret_key", "evilsecret"), want: []string{"payload", `unknown field "secret_key"`}},
		{name: "region field", make: field("region", "evil-1"), want: []string{"payload", `unknown field "region"`}},
	}
	payloadOf := func(t *testing.T, j Job) []byte {
		j.V = Version
		b, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var mu sync.Mutex
	var msgs []string
	t.Run("cases", func(t *testing.T) {
		for ci, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				p := fmt.Sprintf("%sfor%d", S, ci)
				msg, _ := runBadCase(t, ctx, e, c, p, ci, payloadOf)
				mu.Lock()
				msgs = append(msgs, msg)
				mu.Unlock()
			})
		}
	})
	if n := dials.Load(); n != 0 {
		t.Fatalf("the worker opened %d connection(s) to the endpoint a job named", n)
	}
	// A credential a job smuggles in its URI is not echoed back.
	for _, m := range msgs {
		if strings.Contains(m, "evilsecret") {
			t.Errorf("a job's error message repeats the password from its URI: %s", m)
		}
	}
	// Nothing was written outside the allow-list.
	entries, err := os.ReadDir(filepath.Join(e.s3.Root, foreignBucket))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("the bucket outside the allow-list holds %d new objects", len(entries))
	}
	for _, secret := range []string{e.s3.SecretKey, e.s3.AccessKey} {
		if strings.Contains(e.logs.String(), secret) {
			t.Fatalf("the worker's S3 credentials appear in its logs")
		}
	}
}
