package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/hibiken/asynq"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/rmsgrad/rmsgrad/compute/computetest"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
	"github.com/rmsgrad/rmsgrad/gateway"
	"github.com/rmsgrad/rmsgrad/internal/jobstore"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
	"github.com/rmsgrad/rmsgrad/storage/s3"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

const (
	bucket   = "rmsgrad"
	maxBatch = 20
	maxBody  = 64 << 10
	maxFile  = 1 << 20
)

// apiEnv is a real redis-server and versitygw, a worker in this process
// (the jobs handler on the cpu backend, requiring signed jobs), and
// gateways on httptest servers: one with a token and the limits above, one
// whose token has a rate of one request.
type apiEnv struct {
	t        *testing.T
	redis    *testenv.Server
	insp     *asynq.Inspector
	root     string // the file store's root
	store    *storage.Router
	urlKey   []byte
	token    string
	url      string // the main gateway
	limited  string // the rate-limited gateway
	spec     *openapi3.T
	router   routers.Router
	mu       sync.Mutex
	covered  map[string]bool // "operationId status"
	hc       *http.Client
	queueLen func() int
}

func newAPIEnv(t *testing.T) *apiEnv {
	t.Helper()
	e := &apiEnv{t: t, redis: testenv.Redis(t), covered: map[string]bool{}, hc: &http.Client{}}
	vg := testenv.Versitygw(t, bucket, "foreign")
	e.root = t.TempDir()
	ctx := context.Background()
	fs, err := file.New(e.root)
	if err != nil {
		t.Fatal(err)
	}
	st, err := s3.New(ctx, s3.Config{Endpoint: vg.Endpoint(), AccessKey: vg.AccessKey, SecretKey: vg.SecretKey,
		Allow: []s3.AllowRule{{Bucket: bucket}}})
	if err != nil {
		t.Fatal(err)
	}
	e.store = storage.NewRouter()
	e.store.Register("file", fs)
	e.store.Register("s3", st)
	mc, err := minio.New(vg.Endpoint(), &minio.Options{Creds: credentials.NewStaticV4(vg.AccessKey, vg.SecretKey, ""), Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	ropt := asynq.RedisClientOpt{Addr: e.redis.Addr}
	sign := []byte("api-test-signing-key")
	client := jobs.NewClient(ropt, jobs.WithSigningKey(sign), jobs.WithMaxRetry(2))
	t.Cleanup(func() { client.Close() })
	e.insp = asynq.NewInspector(ropt)
	t.Cleanup(func() { e.insp.Close() })
	e.queueLen = func() int {
		qi, err := e.insp.GetQueueInfo(jobs.DefaultQueue)
		if err != nil {
			return 0
		}
		return qi.Size + qi.Completed
	}

	// The worker, requiring the signature the gateway adds.
	be := cpu.New()
	b := jobs.NewBatcher(be, jobs.BatchConfig{MaxJobs: 8, MaxWait: 2 * time.Millisecond}, nil, nil)
	h, err := jobs.NewHandler(jobs.HandlerConfig{Backend: be, Batcher: b, Store: pingless{jobstore.Store{R: e.store}},
		Budget: jobs.NewBudget(64 << 20), SigningKey: sign, Worker: "api-test"})
	if err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServer(ropt, asynq.Config{Concurrency: 8, Queues: map[string]int{jobs.DefaultQueue: 1},
		LogLevel: asynq.ErrorLevel, TaskCheckInterval: 20 * time.Millisecond})
	mux := asynq.NewServeMux()
	h.Register(mux)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); _ = b.Close(context.Background()) })

	e.token, _ = gateway.NewToken()
	line, _ := gateway.TokenLine("api", e.token)
	tokFile := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokFile, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := gateway.LoadTokens(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	e.urlKey = []byte("api-test-url-key")
	mk := func(rate float64, burst int) string {
		g, err := gateway.New(gateway.Config{Client: client, Store: e.store, Presigner: gateway.NewS3Presigner(mc),
			Files:        &gateway.FileObjects{Store: fs, Key: e.urlKey, MaxBytes: maxFile},
			UploadPrefix: "s3://" + bucket + "/up/", Tokens: tokens, RatePerS: rate, Burst: burst,
			MaxBodyBytes: maxBody, MaxBatch: maxBatch, MaxWait: 5 * time.Second, DefaultWait: 2 * time.Second,
			Ready: []gateway.Check{{Name: "redis", Check: client.Ping}}})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(g)
		t.Cleanup(ts.Close)
		return ts.URL
	}
	e.url, e.limited = mk(0, 0), mk(1e-6, 1)

	e.spec, err = openapi3.NewLoader().LoadFromData(gateway.OpenAPI)
	if err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	if err := e.spec.Validate(ctx); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI 3 document: %v", err)
	}
	e.spec.Servers = openapi3.Servers{{URL: e.url}, {URL: e.limited}}
	if e.router, err = gorillamux.NewRouter(e.spec); err != nil {
		t.Fatal(err)
	}
	return e
}

// call is one request.
type call struct {
	method, path string
	body         any // []byte as is, else JSON
	token        *string
	base         string
	invalidReq   bool // the request breaks the document on purpose: do not validate it
}

// do sends c, validates the request (unless invalidReq) and the answer
// against openapi.yaml, records the operation and status as covered, and
// returns the status and body.
func (e *apiEnv) do(c call) (int, []byte, http.Header) {
	e.t.Helper()
	base := c.base
	if base == "" {
		base = e.url
	}
	var body []byte
	switch b := c.body.(type) {
	case nil:
	case []byte:
		body = b
	default:
		body, _ = json.Marshal(b)
	}
	req, err := http.NewRequest(c.method, base+c.path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if body != nil {
		if strings.HasPrefix(c.path, "/v1/files/") {
			req.Header.Set("Content-Type", "application/octet-stream")
		} else {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	tok := e.token
	if c.token != nil {
		tok = *c.token
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	e.validate(req, body, c.invalidReq, resp.StatusCode, resp.Header, rb)
	return resp.StatusCode, rb, resp.Header
}

// validate checks one exchange against the document.
func (e *apiEnv) validate(req *http.Request, body []byte, skipReq bool, status int, h http.Header, rb []byte) {
	e.t.Helper()
	// OpenAPI path parameters hold no slash: route a file path as one
	// segment (the document says the path may hold slashes).
	rreq := req.Clone(context.Background())
	if p, ok := strings.CutPrefix(req.URL.Path, "/v1/files/"); ok {
		rreq.URL.Path = "/v1/files/" + strings.ReplaceAll(p, "/", "_")
		rreq.URL.RawPath = ""
	}
	route, params, err := e.router.FindRoute(rreq)
	if err != nil {
		e.t.Fatalf("%s %s: no route in openapi.yaml: %v", req.Method, req.URL.Path, err)
	}
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true,
		AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}
	in := &openapi3filter.RequestValidationInput{Request: rreq, PathParams: params, Route: route, Options: opts}
	if !skipReq {
		rreq.Body = io.NopCloser(bytes.NewReader(body))
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			e.t.Fatalf("%s %s: the request breaks openapi.yaml: %v", req.Method, req.URL, err)
		}
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: status, Header: h,
		Body: io.NopCloser(bytes.NewReader(rb)), Options: opts}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		e.t.Fatalf("%s %s: answer %d %s breaks openapi.yaml: %v", req.Method, req.URL.Path, status, rb, err)
	}
	e.mu.Lock()
	e.covered[route.Operation.OperationID+" "+strconv.Itoa(status)] = true
	e.mu.Unlock()
}

// uncovered lists the document's operation/status pairs no test made.
func (e *apiEnv) uncovered() []string {
	var miss []string
	for _, p := range e.spec.Paths.Map() {
		for _, op := range p.Operations() {
			for code := range op.Responses.Map() {
				if !e.covered[op.OperationID+" "+code] {
					miss = append(miss, op.OperationID+" "+code)
				}
			}
		}
	}
	sort.Strings(miss)
	return miss
}

// wantErr checks an error answer: status, code, and that its message
// holds each of parts.
func wantErr(t *testing.T, what string, status int, body []byte, wantStatus int, code string, parts ...string) map[string]string {
	t.Helper()
	var eb struct {
		Error map[string]string `json:"error"`
	}
	if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil {
		t.Fatalf("%s: answer %d %q is not a JSON error", what, status, body)
	}
	if status != wantStatus || eb.Error["code"] != code {
		t.Fatalf("%s: %d %s, want %d %s: %s", what, status, eb.Error["code"], wantStatus, code, body)
	}
	for _, p := range parts {
		if !strings.Contains(eb.Error["message"], p) {
			t.Fatalf("%s: message %q lacks %q", what, eb.Error["message"], p)
		}
	}
	return eb.Error
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

func f32s(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// inputs is one job's x, w, dy as a safetensors object.
func inputs(seed uint64, rows, dim int) ([]byte, []float32, []float32, []float32) {
	x := computetest.Uniform(seed+1, rows*dim, 1)
	w := computetest.Uniform(seed+2, dim, 0.1)
	for i := range w {
		w[i]++
	}
	dy := computetest.Uniform(seed+3, rows*dim, 0.5)
	var buf bytes.Buffer
	if err := safetensors.Encode(&buf, []safetensors.Tensor{
		{Name: "x", DType: "F32", Shape: []int{rows, dim}, Data: f32bytes(x)},
		{Name: "w", DType: "F32", Shape: []int{dim}, Data: f32bytes(w)},
		{Name: "dy", DType: "F32", Shape: []int{rows, dim}, Data: f32bytes(dy)},
	}, nil); err != nil {
		panic(err)
	}
	return buf.Bytes(), x, w, dy
}

func str(s string) *string { return &s }

// fileURL signs a /v1/files URL as the gateway does (HMAC-SHA256 of
// method, path and expiry under the URL key).
func fileURL(key []byte, method, rel string, exp time.Time) string {
	es := strconv.FormatInt(exp.Unix(), 10)
	m := hmac.New(sha256.New, key)
	m.Write([]byte(method + "\n" + rel + "\n" + es))
	return "/v1/files/" + rel + "?expires=" + es + "&sig=" + hex.EncodeToString(m.Sum(nil))
}

// rawHTTP sends a request as written on a new connection (for what
// net/http's client will not send) and returns the answer's status and body.
func rawHTTP(t *testing.T, base, raw string, closeWrite bool) (int, []byte, http.Header) {
	t.Helper()
	u, _ := url.Parse(base)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	if closeWrite {
		_ = c.(*net.TCPConn).CloseWrite()
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

// pingless is the router as the handler's store; the worker's readiness
// probe (Ping) is not part of these tests.
type pingless struct{ jobstore.Store }

func (pingless) Ping(context.Context) error { return nil }
