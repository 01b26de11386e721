package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/compute/computetest"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

type signed struct {
	URI, Out, Method, URL string
	ExpiresAt             time.Time `json:"expires_at"`
}

type status struct {
	ID, Queue, State string
	Retried          int
	LastError        string `json:"last_error"`
	Result           *struct {
		Out    string
		SHA256 map[string]string
		Rows   int
		Dim    int
	}
}

// TestAPI drives every route of the gateway against real servers, checks
// what each answers (jobs computed right, errors JSON with the worker's
// messages, nothing enqueued by a refused request), validates every
// request and answer against openapi.yaml, and requires every operation
// and status code the document lists to have been seen.
func TestAPI(t *testing.T) {
	e := newAPIEnv(t)
	hc := &http.Client{}

	// The document itself is served.
	if st, b, _ := e.do(call{method: "GET", path: "/openapi.yaml"}); st != 200 || !bytes.Contains(b, []byte("openapi: 3")) {
		t.Fatalf("/openapi.yaml: %d", st)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if st, _, _ := e.do(call{method: "GET", path: p}); st != 200 {
			t.Fatalf("%s: %d", p, st)
		}
	}

	// A job through S3: presigned PUT, submit, wait, presigned GET.
	var up struct{ Uploads []signed }
	st, b, _ := e.do(call{method: "POST", path: "/v1/uploads", body: map[string]any{"count": 2}})
	if st != 200 || json.Unmarshal(b, &up) != nil || len(up.Uploads) != 2 {
		t.Fatalf("uploads: %d %s", st, b)
	}
	u := up.Uploads[0]
	if !strings.HasPrefix(u.URI, "s3://rmsgrad/up/") || !strings.HasSuffix(u.Out, "/out.safetensors") || u.Method != "PUT" ||
		time.Until(u.ExpiresAt) > 5*time.Minute+time.Second || strings.Contains(string(b), "rmsgradtestsecret") {
		t.Fatalf("upload URL: %+v", u)
	}
	obj, x, w, dy := inputs(7, 4, 96)
	req, _ := http.NewRequest("PUT", u.URL, bytes.NewReader(obj))
	resp, err := hc.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("presigned PUT: %v %v", err, resp)
	}
	resp.Body.Close()
	job := map[string]any{"v": 1, "x": u.URI + "#x", "w": u.URI + "#w", "dy": u.URI + "#dy", "out": u.Out, "eps": 1e-6}
	n0 := e.queueLen()
	st, b, _ = e.do(call{method: "POST", path: "/v1/jobs?id=s3-job-1", body: job})
	if st != 202 || !strings.Contains(string(b), `"id":"s3-job-1"`) {
		t.Fatalf("submit: %d %s", st, b)
	}
	// The same job again under its id: a no-op.
	if st, b, _ = e.do(call{method: "POST", path: "/v1/jobs?id=s3-job-1", body: job}); st != 202 {
		t.Fatalf("resubmit: %d %s", st, b)
	}
	if n := e.queueLen(); n != n0+1 {
		t.Fatalf("queue grew by %d for one job posted twice", n-n0)
	}
	var js status
	for deadline := time.Now().Add(2 * time.Minute); js.State != "completed" && time.Now().Before(deadline); {
		st, b, _ = e.do(call{method: "GET", path: "/v1/jobs/s3-job-1/wait?timeout=5"})
		if st != 200 || json.Unmarshal(b, &js) != nil || (js.State != "pending" && js.State != "active" && js.State != "completed") {
			t.Fatalf("wait: %d %s", st, b)
		}
	}
	if js.State != "completed" || js.Result == nil {
		t.Fatalf("wait: job not completed within 2 minutes: %s", b)
	}
	e.checkOutput(t, js.Result.Out, "s3", x, w, dy, 4, 96)
	if st, b, _ = e.do(call{method: "GET", path: "/v1/jobs/s3-job-1"}); st != 200 || !strings.Contains(string(b), `"state":"completed"`) {
		t.Fatalf("status: %d %s", st, b)
	}
	// Another job under the taken id: 409, nothing enqueued.
	n0 = e.queueLen()
	other := map[string]any{"v": 1, "x": u.URI + "#x", "w": u.URI + "#w", "dy": u.URI + "#dy", "out": u.Out, "eps": 1e-3}
	st, b, _ = e.do(call{method: "POST", path: "/v1/jobs?id=s3-job-1", body: other})
	wantErr(t, "taken id", st, b, 409, "id_conflict", "job s3-job-1", "task id already used by a different job")

	// A job through the file store: /v1/files URLs of this gateway.
	rootURI := "file://" + e.root
	st, b, _ = e.do(call{method: "POST", path: "/v1/uploads", body: map[string]any{"uris": []string{rootURI + "/in/a.safetensors"}}})
	if st != 200 || json.Unmarshal(b, &up) != nil || !strings.HasPrefix(up.Uploads[0].URL, e.url+"/v1/files/in/a.safetensors?expires=") {
		t.Fatalf("file upload URL: %d %s", st, b)
	}
	fobj, fx, fw, fdy := inputs(11, 3, 40)
	path := strings.TrimPrefix(up.Uploads[0].URL, e.url)
	if st, b, _ = e.do(call{method: "PUT", path: path, body: fobj, token: str("")}); st != 201 || !strings.Contains(string(b), fmt.Sprintf(`"bytes":%d`, len(fobj))) {
		t.Fatalf("file PUT: %d %s", st, b)
	}
	fa := rootURI + "/in/a.safetensors"
	batch := map[string]any{"jobs": []any{
		map[string]any{"id": "file-job-1", "job": map[string]any{"v": 1, "x": fa + "#x", "w": fa + "#w", "dy": fa + "#dy", "out": rootURI + "/out/a.safetensors", "eps": 1e-6}},
		map[string]any{"id": "file-job-2", "job": map[string]any{"v": 1, "x": fa + "#x", "w": fa + "#w", "dy": fa + "#dy", "out": "file:///elsewhere/o", "eps": 1e-6}},
		map[string]any{"job": map[string]any{"v": 1, "x": fa + "#x", "w": fa + "#w", "dy": fa + "#dy", "out": rootURI + "/out/b", "eps": 0}},
	}}
	n0 = e.queueLen()
	var ba struct {
		Jobs []struct {
			Index, Status int
			ID            string
			Error         map[string]string
		}
	}
	st, b, _ = e.do(call{method: "POST", path: "/v1/jobs/batch", body: batch, invalidReq: true}) // eps 0 is a number the schema takes; the batch is fine
	if st != 200 || json.Unmarshal(b, &ba) != nil || len(ba.Jobs) != 3 {
		t.Fatalf("batch: %d %s", st, b)
	}
	if ba.Jobs[0].Status != 202 || ba.Jobs[0].ID != "file-job-1" || ba.Jobs[1].Status != 403 || ba.Jobs[1].Error["code"] != "not_allowed" ||
		!strings.Contains(ba.Jobs[1].Error["message"], "job file-job-2: tensor out (file:///elsewhere/o)") || ba.Jobs[2].Status != 400 ||
		ba.Jobs[2].Error["field"] != "eps" || !strings.HasPrefix(ba.Jobs[2].Error["message"], "invalid job: eps: must be finite and > 0") {
		t.Fatalf("batch answers: %s", b)
	}
	if n := e.queueLen(); n != n0+1 {
		t.Fatalf("a batch of one good and two bad jobs enqueued %d", n-n0)
	}
	var wa struct {
		Done bool
		Jobs []struct {
			status
			Error map[string]string
		}
	}
	for deadline := time.Now().Add(2 * time.Minute); !wa.Done && time.Now().Before(deadline); {
		st, b, _ = e.do(call{method: "POST", path: "/v1/jobs/wait", body: map[string]any{"ids": []string{"file-job-1", "s3-job-1", "never-was"}, "timeout": 5}})
		if st != 200 || json.Unmarshal(b, &wa) != nil {
			t.Fatalf("batch wait: %d %s", st, b)
		}
	}
	if !wa.Done || wa.Jobs[0].State != "completed" || wa.Jobs[1].State != "completed" || wa.Jobs[2].Error["code"] != "not_found" {
		t.Fatalf("batch wait: %d %s", st, b)
	}
	e.checkOutput(t, wa.Jobs[0].Result.Out, "file", fx, fw, fdy, 3, 40)

	// Bad requests: each a JSON error, nothing enqueued.
	n0 = e.queueLen()
	big := map[string]any{"v": 1, "x": strings.Repeat("a", 20000), "w": "b", "dy": "c", "out": "d", "eps": 1e-6}
	for _, c := range []struct {
		what   string
		c      call
		status int
		code   string
		parts  []string
	}{
		{"no token", call{method: "POST", path: "/v1/jobs", body: job, token: str("")}, 401, "unauthorized", []string{"missing bearer token"}},
		{"bad token", call{method: "POST", path: "/v1/jobs", body: job, token: str("rmsgrad_nope")}, 401, "unauthorized", []string{"not recognised"}},
		{"eps", call{method: "POST", path: "/v1/jobs?id=bad-eps", body: map[string]any{"v": 1, "x": u.URI + "#x", "w": u.URI + "#w", "dy": u.URI + "#dy", "out": u.Out, "eps": -1}},
			400, "invalid_job", []string{"job bad-eps: invalid job: eps: must be finite and > 0, got -1"}},
		{"unknown field", call{method: "POST", path: "/v1/jobs", body: []byte(`{"v":1,"x":"a","w":"b","dy":"c","out":"d","eps":1e-6,"Out":"e"}`), invalidReq: true},
			400, "invalid_job", []string{`unknown field "Out"`}},
		{"not JSON", call{method: "POST", path: "/v1/jobs", body: []byte(`{"v":1,`), invalidReq: true}, 400, "invalid_job", []string{"malformed JSON"}},
		{"foreign bucket", call{method: "POST", path: "/v1/jobs?id=foreign", body: map[string]any{"v": 1, "x": "s3://foreign/a#x", "w": u.URI + "#w", "dy": u.URI + "#dy", "out": u.Out, "eps": 1e-6}},
			403, "not_allowed", []string{"job foreign: tensor x (s3://foreign/a#x)", `bucket "foreign" is not in the allow-list`}},
		{"foreign w", call{method: "POST", path: "/v1/jobs?id=foreign-w", body: map[string]any{"v": 1, "x": u.URI + "#x", "w": "s3://foreign/a#w", "dy": u.URI + "#dy", "out": u.Out, "eps": 1e-6}},
			403, "not_allowed", []string{"job foreign-w: tensor w (s3://foreign/a#w)"}},
		{"empty tensor name", call{method: "POST", path: "/v1/jobs?id=empty-name", body: map[string]any{"v": 1, "x": u.URI + "#x", "w": u.URI + "#", "dy": u.URI + "#dy", "out": u.Out, "eps": 1e-6}},
			400, "invalid_job", []string{"job empty-name: tensor w", "empty tensor name after #"}},
		{"oversized", call{method: "POST", path: "/v1/jobs", body: big}, 413, "too_large", []string{"request body over 16384 bytes"}},
		{"bad id", call{method: "POST", path: "/v1/jobs?id=-x", body: job, invalidReq: true}, 400, "invalid_request", []string{`job id "-x"`}},
		{"empty batch", call{method: "POST", path: "/v1/jobs/batch", body: map[string]any{"jobs": []any{}}}, 400, "invalid_request", []string{"the batch is empty"}},
		{"batch no token", call{method: "POST", path: "/v1/jobs/batch", body: batch, token: str("")}, 401, "unauthorized", nil},
		{"batch too large", call{method: "POST", path: "/v1/jobs/batch", body: map[string]any{"jobs": make([]map[string]any, maxBatch+1)}, invalidReq: true},
			413, "too_large", []string{"batch of 21 jobs, limit 20"}},
		{"wait no ids", call{method: "POST", path: "/v1/jobs/wait", body: map[string]any{"ids": []string{}}}, 400, "invalid_request", []string{"no job ids"}},
		{"wait no token", call{method: "POST", path: "/v1/jobs/wait", body: map[string]any{"ids": []string{"a"}}, token: str("")}, 401, "unauthorized", nil},
		{"wait too many", call{method: "POST", path: "/v1/jobs/wait", body: map[string]any{"ids": strings.Fields(strings.Repeat("a ", maxBatch+1))}}, 413, "too_large", nil},
		{"status bad id", call{method: "GET", path: "/v1/jobs/-x", invalidReq: true}, 400, "invalid_request", nil},
		{"status no token", call{method: "GET", path: "/v1/jobs/a", token: str("")}, 401, "unauthorized", nil},
		{"status unknown", call{method: "GET", path: "/v1/jobs/never-was"}, 404, "not_found", []string{"job never-was", "job not found"}},
		{"wait bad timeout", call{method: "GET", path: "/v1/jobs/a/wait?timeout=soon", invalidReq: true}, 400, "invalid_request", []string{`timeout "soon"`}},
		{"wait no token", call{method: "GET", path: "/v1/jobs/a/wait", token: str("")}, 401, "unauthorized", nil},
		{"wait unknown", call{method: "GET", path: "/v1/jobs/never-was/wait?timeout=0.1"}, 404, "not_found", nil},
		{"uploads neither", call{method: "POST", path: "/v1/uploads", body: map[string]any{}}, 400, "invalid_request", []string{"give uris"}},
		{"uploads no token", call{method: "POST", path: "/v1/uploads", body: map[string]any{"count": 1}, token: str("")}, 401, "unauthorized", nil},
		{"uploads foreign", call{method: "POST", path: "/v1/uploads", body: map[string]any{"uris": []string{"s3://foreign/k"}}}, 403, "not_allowed", []string{`bucket "foreign" is not in the allow-list`}},
		{"uploads too many", call{method: "POST", path: "/v1/uploads", body: map[string]any{"count": maxBatch + 1}}, 413, "too_large", nil},
		{"downloads tensor", call{method: "POST", path: "/v1/downloads", body: map[string]any{"uris": []string{u.URI + "#x"}}}, 400, "invalid_request", []string{"names a tensor"}},
		{"downloads no token", call{method: "POST", path: "/v1/downloads", body: map[string]any{"uris": []string{u.URI}}, token: str("")}, 401, "unauthorized", nil},
		{"downloads foreign", call{method: "POST", path: "/v1/downloads", body: map[string]any{"uris": []string{"file:///etc/passwd"}}}, 403, "not_allowed", []string{"outside the file store root"}},
		{"file bad sig", call{method: "PUT", path: fileURL([]byte("other key"), "PUT", "in/b", time.Now().Add(time.Minute)), body: []byte("x")}, 403, "bad_signature", nil},
		{"file too large", call{method: "PUT", path: fileURL(e.urlKey, "PUT", "in/big", time.Now().Add(time.Minute)), body: make([]byte, maxFile+1)}, 413, "too_large", []string{"limit 1048576 (uploads.max_bytes)"}},
		{"file expired", call{method: "GET", path: fileURL(e.urlKey, "GET", "in/a.safetensors", time.Now().Add(-time.Second))}, 403, "url_expired", []string{"the URL expired at"}},
		{"file missing", call{method: "GET", path: fileURL(e.urlKey, "GET", "in/none", time.Now().Add(time.Minute))}, 404, "not_found", nil},
	} {
		st, b, h := e.do(c.c)
		wantErr(t, c.what, st, b, c.status, c.code, c.parts...)
		if st == 401 && h.Get("WWW-Authenticate") == "" {
			t.Fatalf("%s: 401 without WWW-Authenticate", c.what)
		}
	}
	// A PUT without Content-Length, and one whose body ends early.
	rel := fileURL(e.urlKey, "PUT", "in/raw", time.Now().Add(time.Minute))
	st, b, h := rawHTTP(t, e.url, "PUT "+rel+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", false)
	e.validate(mustReq("PUT", e.url+rel), nil, true, st, h, b)
	wantErr(t, "chunked upload", st, b, 411, "length_required", "send Content-Length")
	st, b, h = rawHTTP(t, e.url, "PUT "+rel+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\nabc", true)
	e.validate(mustReq("PUT", e.url+rel), nil, true, st, h, b)
	wantErr(t, "short upload", st, b, 400, "invalid_request", "upload to file://")
	if n := e.queueLen(); n != n0 {
		t.Fatalf("the refused requests enqueued %d jobs", n-n0)
	}
	// Unrouted: JSON 404 and 405.
	for _, c := range []struct{ method, path, code string }{{"GET", "/v2/x", "not_found"}, {"DELETE", "/v1/jobs", "method_not_allowed"}} {
		req, _ := http.NewRequest(c.method, e.url+c.path, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var eb struct{ Error map[string]string }
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		resp.Body.Close()
		if eb.Error["code"] != c.code {
			t.Fatalf("%s %s: %d %v", c.method, c.path, resp.StatusCode, eb)
		}
	}

	// Rate limits: the limited gateway's token has one request.
	for _, c := range []call{
		{method: "POST", path: "/v1/jobs", body: job}, {method: "POST", path: "/v1/jobs/batch", body: batch, invalidReq: true},
		{method: "POST", path: "/v1/jobs/wait", body: map[string]any{"ids": []string{"a"}}}, {method: "GET", path: "/v1/jobs/a"},
		{method: "GET", path: "/v1/jobs/a/wait"}, {method: "POST", path: "/v1/uploads", body: map[string]any{"count": 1}},
		{method: "POST", path: "/v1/downloads", body: map[string]any{"uris": []string{u.URI}}},
	} {
		c.base = e.limited
		if c.path == "/v1/jobs" { // the one request the bucket holds
			if st, b, _ := e.do(c); st != 202 {
				t.Fatalf("first request on the limited gateway: %d %s", st, b)
			}
		}
		st, b, h := e.do(c)
		wantErr(t, "rate "+c.path, st, b, 429, "rate_limited", `token "api" is over its rate limit`)
		if h.Get("Retry-After") == "" {
			t.Fatalf("429 without Retry-After")
		}
	}

	// The metrics count what happened.
	_, mb, _ := e.do(call{method: "GET", path: "/metrics"})
	for _, want := range []string{`rmsgrad_gateway_jobs_total{outcome="enqueued"} 3`, `rmsgrad_gateway_jobs_total{outcome="rejected"}`,
		`rmsgrad_gateway_auth_failures_total 8`, `rmsgrad_gateway_requests_total{code="202",route="POST /v1/jobs"} 2`,
		`rmsgrad_gateway_urls_total{method="PUT",scheme="s3"} 2`, `rmsgrad_gateway_file_upload_bytes_total`} {
		if !strings.Contains(string(mb), want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}

	// Redis down: 503 with the cause, and /readyz says why.
	e.redis.Stop()
	st, b, _ = e.do(call{method: "POST", path: "/v1/jobs?id=down", body: job})
	wantErr(t, "redis down: submit", st, b, 503, "unavailable", "enqueue to queue")
	st, b, _ = e.do(call{method: "GET", path: "/v1/jobs/s3-job-1"})
	wantErr(t, "redis down: status", st, b, 503, "unavailable", "job s3-job-1")
	if st, b, _ = e.do(call{method: "GET", path: "/readyz"}); st != 503 || !strings.Contains(string(b), "not ready: redis:") {
		t.Fatalf("readyz with redis down: %d %s", st, b)
	}

	if miss := e.uncovered(); len(miss) > 0 {
		t.Fatalf("operations and status codes of openapi.yaml no test exercised: %v", miss)
	}
}

func mustReq(method, u string) *http.Request {
	r, err := http.NewRequest(method, u, nil)
	if err != nil {
		panic(err)
	}
	return r
}

// checkOutput downloads out through /v1/downloads and compares dx and dw
// with the float64 oracle (scheme: the store the URL must point at).
func (e *apiEnv) checkOutput(t *testing.T, out, scheme string, x, w, dy []float32, rows, dim int) {
	t.Helper()
	var dl struct{ Downloads []signed }
	st, b, _ := e.do(call{method: "POST", path: "/v1/downloads", body: map[string]any{"uris": []string{out}}})
	if st != 200 || json.Unmarshal(b, &dl) != nil || len(dl.Downloads) != 1 || dl.Downloads[0].Method != "GET" {
		t.Fatalf("downloads: %d %s", st, b)
	}
	var body []byte
	if scheme == "file" {
		st, body, _ = e.do(call{method: "GET", path: strings.TrimPrefix(dl.Downloads[0].URL, e.url), token: str("")})
	} else {
		resp, err := http.Get(dl.Downloads[0].URL)
		if err != nil {
			t.Fatal(err)
		}
		st = resp.StatusCode
		body = readAll(resp)
	}
	if st != 200 {
		t.Fatalf("download %s: %d %s", out, st, body)
	}
	h, err := safetensors.ReadHeader(bytes.NewReader(body), int64(len(body)))
	if err != nil {
		t.Fatalf("output %s: %v", out, err)
	}
	_, wantDX, wantDW := computetest.Oracle(x, w, dy, rows, dim, 1e-6)
	for _, name := range []string{"dx", "dw"} {
		en, ok := h.Lookup(name)
		if !ok {
			t.Fatalf("output %s has no %s", out, name)
		}
		got := f32s(body[h.DataStart+en.Begin : h.DataStart+en.End])
		if name == "dx" {
			err = computetest.CompareDX(got, wantDX, x, w, dy, rows, dim, 1e-6)
		} else {
			err = computetest.Compare(name, got, wantDW, rows, dim)
		}
		if err != nil {
			t.Fatalf("output %s: %v", out, err)
		}
	}
}

func readAll(resp *http.Response) []byte {
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return b.Bytes()
}
