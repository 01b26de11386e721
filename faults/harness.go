package faults

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
	"github.com/rmsgrad/rmsgrad/internal/procattr"
	"github.com/rmsgrad/rmsgrad/internal/rediscluster"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// Bucket is the one bucket the tests' workers may read and write.
const Bucket = "rmsgrad"

// Build compiles the worker and enqueue commands of the module into dir and
// returns their paths. Run it from a package directory of the module.
func Build(dir string) (worker, enqueue string, err error) {
	worker, enqueue = filepath.Join(dir, "worker"), filepath.Join(dir, "enqueue")
	for bin, pkg := range map[string]string{worker: "../cmd/worker", enqueue: "../cmd/enqueue"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return worker, enqueue, nil
}

// Env is one test's servers: a redis-server, a versitygw with Bucket, a
// router on that S3 for uploading inputs and reading outputs, a jobs.Client
// and an asynq.Inspector.
type Env struct {
	Redis  *testenv.Server
	S3     *testenv.S3
	Store  *storage.Router
	Client *jobs.Client
	Insp   *asynq.Inspector
	// Cluster, when set (NewClusterEnv), is the Redis Cluster in place of
	// Redis, and Queues are the asynq queues (shards) the jobs go to.
	Cluster *rediscluster.Cluster
	Queues  []string
}

// queues returns the asynq queues the env's jobs live in.
func (e *Env) queues() []string {
	if len(e.Queues) > 0 {
		return e.Queues
	}
	return []string{jobs.DefaultQueue}
}

// NewEnv starts the servers (versitygw for S3); redisArgs go to
// redis-server's command line.
func NewEnv(t testing.TB, redisArgs ...string) *Env {
	t.Helper()
	return NewEnvOn(t, "versitygw", redisArgs...)
}

// NewEnvOn is NewEnv with the S3 server of kind (testenv.S3Servers).
func NewEnvOn(t testing.TB, kind string, redisArgs ...string) *Env {
	t.Helper()
	e := &Env{Redis: testenv.Redis(t, redisArgs...), S3: testenv.StartS3(t, kind, Bucket)}
	st, err := s3.New(context.Background(), s3.Config{Endpoint: e.S3.Endpoint(), Region: "us-east-1",
		AccessKey: e.S3.AccessKey, SecretKey: e.S3.SecretKey, Allow: []s3.AllowRule{{Bucket: Bucket}}})
	if err != nil {
		t.Fatalf("faults: s3 store: %v", err)
	}
	e.Store = storage.NewRouter(storage.WithHeaderCache(0))
	e.Store.Register("s3", st)
	r := asynq.RedisClientOpt{Addr: e.Redis.Addr}
	e.Client = jobs.NewClient(r, jobs.WithMaxRetry(25), jobs.WithPollInterval(50*time.Millisecond))
	e.Insp = asynq.NewInspector(r)
	t.Cleanup(func() { e.Client.Close(); e.Insp.Close() })
	return e
}

// WorkerConfig is what a test sets in the worker's config file; zero fields
// take the values noted.
type WorkerConfig struct {
	Name        string
	Redis       string // host:port
	S3Endpoint  string // host:port (versitygw or a Proxy)
	Concurrency int    // default 64
	BudgetBytes int64  // default 256 MiB
	MaxJobs     int    // default 32
	MaxWait     time.Duration
	RetryBase   time.Duration // default 200ms
	RetryMax    time.Duration // default 2s
	LogLevel    string        // default info
	OutageHold  time.Duration // default 30s (the worker's)
	// Limits and S3 settings; zero values keep the worker's defaults.
	MaxHeaderBytes     int64
	HeaderBudget       int64
	MultipartThreshold int64
	PartSize           int64
	StaleUploadAge     time.Duration
	// StoreBackoff, when set, is the S3 store's own retry policy
	// (storage.s3.backoff).
	StoreBackoff [3]time.Duration // attempts (as a count), base, max

	// ClusterAddrs, when set, are Redis Cluster seed nodes in place of
	// Redis (set by StartWorker when the env is a cluster).
	ClusterAddrs []string
}

func (c WorkerConfig) yaml(httpAddr string) string {
	or := func(v, d int64) int64 {
		if v == 0 {
			return d
		}
		return v
	}
	ord := func(v, d time.Duration) time.Duration {
		if v == 0 {
			return d
		}
		return v
	}
	lvl := c.LogLevel
	if lvl == "" {
		lvl = "info"
	}
	redis := "addr: " + c.Redis
	if len(c.ClusterAddrs) > 0 {
		redis = "cluster_addrs: [" + strings.Join(c.ClusterAddrs, ", ") + "]"
	}
	return fmt.Sprintf(`worker: %s
backend: cpu
concurrency: %d
shutdown_timeout: 30s
retry_base: %v
retry_max: %v
http_addr: %s
log_level: %s
budget_bytes: %d
batch:
  max_jobs: %d
  max_wait: %v
redis:
  %s
storage:
  s3:
    endpoint: %s
    tls: false
    allow: [{bucket: %s}]
`, c.Name, or(int64(c.Concurrency), 64), ord(c.RetryBase, 200*time.Millisecond), ord(c.RetryMax, 2*time.Second),
		httpAddr, lvl, or(c.BudgetBytes, 256<<20), or(int64(c.MaxJobs), 32), ord(c.MaxWait, 2*time.Millisecond),
		redis, c.S3Endpoint, Bucket) + c.s3Extra() + c.extra()
}

// s3Extra is the optional storage.s3 keys, indented under that section
// (the last one yaml writes).
func (c WorkerConfig) s3Extra() string {
	var b strings.Builder
	if c.MultipartThreshold > 0 {
		fmt.Fprintf(&b, "    multipart_threshold: %d\n", c.MultipartThreshold)
	}
	if c.PartSize > 0 {
		fmt.Fprintf(&b, "    part_size: %d\n", c.PartSize)
	}
	if c.StaleUploadAge > 0 {
		fmt.Fprintf(&b, "    stale_upload_age: %v\n", c.StaleUploadAge)
	}
	if c.StoreBackoff[0] > 0 {
		fmt.Fprintf(&b, "    backoff: {attempts: %d, base: %v, max: %v}\n", int(c.StoreBackoff[0]), c.StoreBackoff[1], c.StoreBackoff[2])
	}
	return b.String()
}

// extra is the YAML of the optional top-level settings and of the limits
// section (which yaml does not write), appended to the file.
func (c WorkerConfig) extra() string {
	var b strings.Builder
	if c.OutageHold > 0 {
		fmt.Fprintf(&b, "outage_hold: %v\n", c.OutageHold)
	}
	var lim []string
	if c.MaxHeaderBytes > 0 {
		lim = append(lim, fmt.Sprintf("max_header_bytes: %d", c.MaxHeaderBytes))
	}
	if c.HeaderBudget > 0 {
		lim = append(lim, fmt.Sprintf("header_budget_bytes: %d", c.HeaderBudget))
	}
	if len(lim) > 0 {
		fmt.Fprintf(&b, "limits: {%s}\n", strings.Join(lim, ", "))
	}
	return b.String()
}

// Worker is a running worker binary.
type Worker struct {
	Name string
	HTTP string // host:port of /metrics, /healthz, /readyz
	cmd  *exec.Cmd
	log  *lineLog
	done chan struct{}
	err  error // exit status, valid after done
}

// StartWorker runs bin with cfg (written to a config file, S3 keys in the
// environment) and waits until /readyz says ready.
func StartWorker(t testing.TB, bin string, e *Env, cfg WorkerConfig) *Worker {
	t.Helper()
	if cfg.Redis == "" && len(cfg.ClusterAddrs) == 0 && e.Cluster != nil {
		cfg.ClusterAddrs = e.Cluster.Addrs()
	}
	if cfg.Redis == "" && e.Redis != nil {
		cfg.Redis = e.Redis.Addr
	}
	if cfg.S3Endpoint == "" {
		cfg.S3Endpoint = e.S3.Endpoint()
	}
	if cfg.Name == "" {
		cfg.Name = "w"
	}
	w := &Worker{Name: cfg.Name, HTTP: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), log: &lineLog{}, done: make(chan struct{})}
	path := filepath.Join(t.TempDir(), "worker.yaml")
	if err := os.WriteFile(path, []byte(cfg.yaml(w.HTTP)), 0o600); err != nil {
		t.Fatal(err)
	}
	w.cmd = exec.Command(bin, "--config", path)
	w.cmd.Env = append(cleanEnv(), "RMSGRAD_S3_ACCESS_KEY="+e.S3.AccessKey, "RMSGRAD_S3_SECRET_KEY="+e.S3.SecretKey)
	w.cmd.Stdout, w.cmd.Stderr = w.log, w.log
	w.cmd.SysProcAttr = procattr.Child()
	if err := w.cmd.Start(); err != nil {
		t.Fatalf("faults: start worker %s: %v", cfg.Name, err)
	}
	go func() { w.err = w.cmd.Wait(); close(w.done) }()
	t.Cleanup(func() { w.Kill() })
	if err := w.WaitReady(60 * time.Second); err != nil {
		t.Fatalf("faults: worker %s: %v\n%s", cfg.Name, err, w.Logs())
	}
	return w
}

// cleanEnv is the test's environment without RMSGRAD_ variables, so the
// worker sees only the config the test wrote.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RMSGRAD_") {
			env = append(env, kv)
		}
	}
	return env
}

// PID returns the worker's process id.
func (w *Worker) PID() int { return w.cmd.Process.Pid }

// Logs returns everything the worker printed so far.
func (w *Worker) Logs() string { return w.log.String() }

// OnLine calls f with each line the worker prints from now on, in the
// goroutine that reads its output (so f can act before the next line).
func (w *Worker) OnLine(f func(line string)) { w.log.watch(f) }

// Exited reports whether the process has ended.
func (w *Worker) Exited() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL and waits for the process to end.
func (w *Worker) Kill() {
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	<-w.done
}

// Wait waits for the process to end and returns its exit status.
func (w *Worker) Wait() error {
	<-w.done
	return w.err
}

// Term sends SIGTERM and waits up to d for a clean exit.
func (w *Worker) Term(d time.Duration) error {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
		return w.err
	case <-time.After(d):
		w.Kill()
		return fmt.Errorf("worker %s did not exit within %v of SIGTERM", w.Name, d)
	}
}

// Readyz returns /readyz's status code and body.
func (w *Worker) Readyz() (int, string, error) { return httpGet("http://" + w.HTTP + "/readyz") }

// Metrics returns the /metrics text.
func (w *Worker) Metrics() (string, error) {
	code, body, err := httpGet("http://" + w.HTTP + "/metrics")
	if err == nil && code != 200 {
		err = fmt.Errorf("/metrics: HTTP %d", code)
	}
	return body, err
}

// WaitReady polls /readyz until it answers 200.
func (w *Worker) WaitReady(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		code, body, err := w.Readyz()
		if err == nil && code == 200 {
			return nil
		}
		if w.Exited() {
			return fmt.Errorf("worker exited before ready: %v", w.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %d %s %v", d, code, body, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

func httpGet(u string) (int, string, error) {
	resp, err := httpClient.Get(u)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// lineLog keeps a process's output and hands each complete line to its
// watchers.
type lineLog struct {
	mu       sync.Mutex
	all      bytes.Buffer
	partial  []byte
	watchers []func(string)
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all.Write(p)
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := string(l.partial[:i])
		l.partial = l.partial[i+1:]
		for _, f := range l.watchers {
			f(line)
		}
	}
	return len(p), nil
}

func (l *lineLog) watch(f func(string)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.watchers = append(l.watchers, f)
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all.String()
}

// Input is one uploaded input object (x, w, dy in one safetensors file)
// with the outputs a clean single-job CPU run computes from it.
type Input struct {
	X, W, DY   string
	Rows, Dim  int
	Ref        map[string][]byte // "dx", "dw", "r" -> the clean run's bytes
	SHA256     map[string]string // hex sha256 of each of Ref
	inputBytes int64
}

// Job returns the job of this input writing out, with outputs (default dx,
// dw).
func (in *Input) Job(out string, outputs ...string) jobs.Job {
	return jobs.Job{X: in.X, W: in.W, DY: in.DY, Out: out, Eps: 1e-6, Outputs: outputs}
}

// Inputs uploads one input object per shape (rows x dim) under
// s3://Bucket/in/<prefix>-<i> and computes each clean run in-process with
// the CPU backend, one job per command buffer.
func (e *Env) Inputs(t testing.TB, prefix string, seed uint64, shapes ...[2]int) []*Input {
	t.Helper()
	return e.InputsMeta(t, prefix, seed, nil, shapes...)
}

// InputsMeta is Inputs with meta as each object's __metadata__ (a large
// one makes a large header).
func (e *Env) InputsMeta(t testing.TB, prefix string, seed uint64, meta map[string]string, shapes ...[2]int) []*Input {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 7))
	be := cpu.New()
	b := jobs.NewBatcher(be, jobs.BatchConfig{MaxJobs: 1}, nil, nil)
	defer b.Close(ctx)
	var ins []*Input
	for i, sh := range shapes {
		rows, dim := sh[0], sh[1]
		gen := func(n int, scale float64) []float32 {
			v := make([]float32, n)
			for j := range v {
				v[j] = float32(rng.NormFloat64() * scale)
			}
			return v
		}
		x, w, dy := gen(rows*dim, 1), gen(dim, 0.5), gen(rows*dim, 0.1)
		obj := fmt.Sprintf("s3://%s/in/%s-%d.safetensors", Bucket, prefix, i)
		if _, err := e.Store.Write(ctx, obj, []storage.OutTensor{
			safetensors.F32("x", []int{rows, dim}, x),
			safetensors.F32("w", []int{dim}, w),
			safetensors.F32("dy", []int{rows, dim}, dy),
		}, meta); err != nil {
			t.Fatalf("faults: upload %s: %v", obj, err)
		}
		alloc := func(vals []float32, shape ...int) compute.Buffer {
			buf, err := be.Alloc(compute.F32, shape...)
			if err != nil {
				t.Fatal(err)
			}
			copy(buf.Float32s(), vals)
			return buf
		}
		work := &jobs.Work{Rows: rows, Dim: dim, Eps: float32(1e-6),
			X: alloc(x, rows, dim), W: alloc(w, dim), DY: alloc(dy, rows, dim),
			R: alloc(nil, rows), DX: alloc(nil, rows, dim), DW: alloc(nil, dim)}
		if _, err := b.Submit(ctx, work); err != nil {
			t.Fatalf("faults: clean run of %s: %v", obj, err)
		}
		in := &Input{X: obj + "#x", W: obj + "#w", DY: obj + "#dy", Rows: rows, Dim: dim,
			Ref:    map[string][]byte{"dx": bytes.Clone(work.DX.Bytes()), "dw": bytes.Clone(work.DW.Bytes()), "r": bytes.Clone(work.R.Bytes())},
			SHA256: map[string]string{}, inputBytes: int64(4 * (2*rows*dim + dim))}
		for k, v := range in.Ref {
			s := sha256.Sum256(v)
			in.SHA256[k] = hex.EncodeToString(s[:])
		}
		for _, bb := range []compute.Buffer{work.X, work.W, work.DY, work.R, work.DX, work.DW} {
			bb.Release()
		}
		ins = append(ins, in)
	}
	return ins
}

// CheckObject reads the output object out back from S3 and requires each of
// outputs to equal the clean run's bytes.
func (e *Env) CheckObject(ctx context.Context, in *Input, out string, outputs ...string) error {
	if len(outputs) == 0 {
		outputs = jobs.DefaultOutputs
	}
	for _, name := range outputs {
		ti, err := e.Store.Head(ctx, out+"#"+name)
		if err != nil {
			return fmt.Errorf("output %s#%s: %w", out, name, err)
		}
		got := make([]byte, ti.Size)
		if err := e.Store.Fetch(ctx, ti, got); err != nil {
			return fmt.Errorf("output %s#%s: %w", out, name, err)
		}
		if !bytes.Equal(got, in.Ref[name]) {
			return fmt.Errorf("output %s#%s: %d bytes differ from the clean run's %d bytes", out, name, len(got), len(in.Ref[name]))
		}
	}
	return nil
}

// CheckResult requires res to describe in's job with the clean run's
// sha256 for each of outputs.
func CheckResult(res *jobs.Result, in *Input, out string, outputs ...string) error {
	if len(outputs) == 0 {
		outputs = jobs.DefaultOutputs
	}
	if res.Out != out || res.Rows != in.Rows || res.Dim != in.Dim {
		return fmt.Errorf("result %+v: want out %s, %dx%d", res, out, in.Rows, in.Dim)
	}
	for _, name := range outputs {
		if res.SHA256[name] != in.SHA256[name] {
			return fmt.Errorf("result for %s: sha256 of %s is %s, the clean run's is %s", out, name, res.SHA256[name], in.SHA256[name])
		}
	}
	return nil
}

// Final is the end state of a set of jobs.
type Final struct {
	Results  map[string]*jobs.Result // completed job id -> result
	Retried  map[string]int          // job id -> asynq retry count (completed jobs)
	LastErr  map[string]string       // job id -> last error of a completed job that was retried
	Archived map[string]string       // archived job id -> last error
	Lost     []string                // ids that are neither completed nor archived
}

// WaitFinal polls the queue until every job in ids has completed or been
// archived (or ctx ends), riding out Redis being down, then reads every
// completed job's result.
func (e *Env) WaitFinal(ctx context.Context, ids []string) (*Final, error) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var lastErr error
	for {
		info, err := e.queueInfo()
		if err == nil && info.Pending+info.Active+info.Scheduled+info.Retry == 0 && info.Completed+info.Archived >= len(want) {
			break
		}
		if err != nil {
			lastErr = err
		} else {
			lastErr = fmt.Errorf("queue: %d pending, %d active, %d scheduled, %d retry, %d completed, %d archived",
				info.Pending, info.Active, info.Scheduled, info.Retry, info.Completed, info.Archived)
		}
		select {
		case <-ctx.Done():
			f, _ := e.collect(want)
			return f, fmt.Errorf("jobs not final: %v (last: %v)", ctx.Err(), lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
	return e.collect(want)
}

// queueInfo sums asynq's counts over the env's queues.
func (e *Env) queueInfo() (*asynq.QueueInfo, error) {
	sum := &asynq.QueueInfo{}
	known, err := e.Insp.Queues()
	if err != nil {
		return nil, err
	}
	for _, q := range e.queues() {
		if !slices.Contains(known, q) {
			continue // no task ever went there
		}
		info, err := e.Insp.GetQueueInfo(q)
		if err != nil {
			return nil, fmt.Errorf("queue %s: %w", q, err)
		}
		sum.Pending += info.Pending
		sum.Active += info.Active
		sum.Scheduled += info.Scheduled
		sum.Retry += info.Retry
		sum.Completed += info.Completed
		sum.Archived += info.Archived
	}
	return sum, nil
}

func (e *Env) collect(want map[string]bool) (*Final, error) {
	f := &Final{Results: map[string]*jobs.Result{}, Retried: map[string]int{}, LastErr: map[string]string{}, Archived: map[string]string{}}
	for _, q := range e.queues() {
		if err := e.collectQueue(q, f); err != nil {
			return f, err
		}
	}
	for id := range want {
		if f.Results[id] == nil && f.Archived[id] == "" {
			f.Lost = append(f.Lost, id)
		}
	}
	slices.Sort(f.Lost)
	return f, nil
}

func (e *Env) collectQueue(queue string, f *Final) error {
	for page := 1; ; page++ {
		ts, err := e.Insp.ListCompletedTasks(queue, asynq.PageSize(1000), asynq.Page(page))
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			return fmt.Errorf("list completed: %w", err)
		}
		for _, ti := range ts {
			var r jobs.Result
			if err := json.Unmarshal(ti.Result, &r); err != nil {
				return fmt.Errorf("job %s: result: %w", ti.ID, err)
			}
			f.Results[ti.ID] = &r
			f.Retried[ti.ID] = ti.Retried
			if ti.LastErr != "" {
				f.LastErr[ti.ID] = ti.LastErr
			}
		}
		if len(ts) < 1000 {
			break
		}
	}
	for page := 1; ; page++ {
		ts, err := e.Insp.ListArchivedTasks(queue, asynq.PageSize(1000), asynq.Page(page))
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			return fmt.Errorf("list archived: %w", err)
		}
		for _, ti := range ts {
			f.Archived[ti.ID] = ti.LastErr
		}
		if len(ts) < 1000 {
			break
		}
	}
	return nil
}

// EnqueueAll enqueues jobs[i] under ids[i] from par goroutines.
func (e *Env) EnqueueAll(ctx context.Context, ids []string, js []jobs.Job, par int) error {
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, par)
	for range par {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(js) {
					return
				}
				if _, err := e.Client.Enqueue(ctx, js[i], asynq.TaskID(ids[i])); err != nil {
					errs <- fmt.Errorf("enqueue %s: %w", ids[i], err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Proxy is an HTTP reverse proxy in front of versitygw that can stall
// uploads half way: with Hold on, each PUT body passes its first half to
// versitygw and then blocks until Release, which fails it (the worker that
// sent it is dead by then), so versitygw sees an upload cut mid-body.
type Proxy struct {
	Addr string // host:port for the worker's storage.s3.endpoint
	srv  *httptest.Server

	mu     sync.Mutex
	hold   bool
	holdIf func(*http.Request) bool // nil: every PUT
	gate   chan struct{}
	held   atomic.Int64
	puts   atomic.Int64
}

// NewProxy starts a proxy to the S3 endpoint upstream (host:port).
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	u := &url.URL{Scheme: "http", Host: upstream}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = nil
	rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
		http.Error(w, "proxy: "+err.Error(), http.StatusBadGateway)
	}
	p := &Proxy{gate: make(chan struct{})}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			p.puts.Add(1)
			p.mu.Lock()
			hold, gate := p.hold, p.gate
			if hold && p.holdIf != nil {
				hold = p.holdIf(r)
			}
			p.mu.Unlock()
			if hold {
				half := r.ContentLength / 2
				if r.ContentLength < 0 { // chunked: cut after the first 64 KiB
					half = 64 << 10
				}
				r.Body = &gatedBody{r: r.Body, left: max(half, 1), gate: gate, held: &p.held}
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { p.Release(); p.srv.Close() })
	p.Addr = strings.TrimPrefix(p.srv.URL, "http://")
	return p
}

// Hold makes every later PUT stall half way through its body.
func (p *Proxy) Hold() {
	p.mu.Lock()
	p.hold = true
	p.mu.Unlock()
}

// HoldIf makes the later PUTs for which f is true stall half way
// through their body.
func (p *Proxy) HoldIf(f func(*http.Request) bool) {
	p.mu.Lock()
	p.hold, p.holdIf = true, f
	p.mu.Unlock()
}

// Held returns how many uploads are stalled half way now.
func (p *Proxy) Held() int { return int(p.held.Load()) }

// Puts returns how many PUTs the proxy has seen.
func (p *Proxy) Puts() int { return int(p.puts.Load()) }

// Release fails the stalled uploads and stops holding new ones.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hold {
		close(p.gate)
		p.gate = make(chan struct{})
		p.hold, p.holdIf = false, nil
	}
}

// gatedBody passes left bytes, then blocks until gate closes and fails.
type gatedBody struct {
	r       io.ReadCloser
	left    int64
	gate    chan struct{}
	held    *atomic.Int64
	counted bool
}

var errCut = errors.New("faults: upload cut half way")

func (g *gatedBody) Read(p []byte) (int, error) {
	if g.left <= 0 {
		if !g.counted {
			g.counted = true
			g.held.Add(1)
			defer g.held.Add(-1)
		}
		<-g.gate
		return 0, errCut
	}
	if int64(len(p)) > g.left {
		p = p[:g.left]
	}
	n, err := g.r.Read(p)
	g.left -= int64(n)
	return n, err
}

func (g *gatedBody) Close() error { return g.r.Close() }

// Percentile returns the p-th percentile (0..100) of sorted values.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p / 100 * float64(len(sorted)-1))
	return sorted[i]
}
