package jobs

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
	"github.com/rmsgrad/rmsgrad/internal/syncbuf"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
	"github.com/rmsgrad/rmsgrad/storage/s3"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// routerAdapter is the worker's adapter (cmd/worker/store.go) from
// *storage.Router to Store, repeated here because jobs cannot import a
// main package.
type routerAdapter struct{ r *storage.Router }

func (s routerAdapter) Check(uri string, write bool) error { return s.r.Check(uri, write) }
func (s routerAdapter) Head(ctx context.Context, uri string) (TensorInfo, error) {
	t, err := s.r.Head(ctx, uri)
	if err != nil {
		return TensorInfo{}, err
	}
	return TensorInfo{URI: uri, DType: t.DType, Shape: t.Shape, Size: t.Size, Handle: t}, nil
}
func (s routerAdapter) Fetch(ctx context.Context, t TensorInfo, dst []byte) error {
	return s.r.Fetch(ctx, t.Handle.(storage.TensorInfo), dst)
}
func (s routerAdapter) Write(ctx context.Context, uri string, outs []OutTensor, meta map[string]string) (map[string]string, int64, error) {
	ts := make([]storage.OutTensor, len(outs))
	sums := make([][32]byte, len(outs))
	for i, o := range outs {
		ts[i] = storage.OutTensor{Name: o.Name, DType: o.DType, Shape: o.Shape, Data: o.Data}
		if o.SHA256 == nil {
			sums = nil
		} else if sums != nil {
			sums[i] = *o.SHA256
		}
	}
	var opts []storage.WriteOption
	if sums != nil {
		opts = append(opts, storage.WithSHA256(sums))
	}
	wr, err := s.r.Write(ctx, uri, ts, meta, opts...)
	return wr.SHA256, wr.Bytes, err
}
func (s routerAdapter) Ping(ctx context.Context) error { return nil }

// goodInput is one valid job's inputs in S3 and its expected outputs (a
// single-job run of the CPU backend, checked against the float64 oracle).
type goodInput struct {
	uri    string // s3://tensors/good/N.safetensors, holding x, w, dy
	dx, dw []byte
}

// realEnv is a worker's worth of real parts: redis-server, versitygw
// (buckets "tensors", allow-listed, and "other", which exists but is not),
// a file store root with a directory outside it, the storage router, the
// CPU backend, the batcher, the handler and an asynq server.
type realEnv struct {
	redis   *testenv.Server
	s3      *testenv.S3
	root    string // the file store's root
	outside string // a directory beside the root, holding valid inputs
	admin   *storage.Router
	reader  *storage.Router // the worker's router (allow-listed)
	be      compute.Backend
	reg     *prometheus.Registry
	logs    *syncbuf.Buffer
	srv     *asynq.Server
	b       *Batcher
	asq     *asynq.Client
	client  *Client
	goods   []goodInput
}

const (
	maxTestHeader = 64 << 10
	allowedBucket = "tensors"
	foreignBucket = "other"
	rawMaxRetry   = 3
)

func newRealEnv(t *testing.T, limits Limits, signingKey []byte) *realEnv {
	t.Helper()
	e := &realEnv{redis: testenv.Redis(t), s3: testenv.Versitygw(t, allowedBucket, foreignBucket)}
	ctx := context.Background()
	base := t.TempDir()
	e.root, e.outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{e.root, e.outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mkRouter := func(maxHeader int64, allow ...string) *storage.Router {
		r := storage.NewRouter(storage.WithMaxHeaderBytes(maxHeader))
		cfg := s3.Config{Endpoint: e.s3.Endpoint(), AccessKey: e.s3.AccessKey, SecretKey: e.s3.SecretKey}
		for _, b := range allow {
			cfg.Allow = append(cfg.Allow, s3.AllowRule{Bucket: b})
		}
		st, err := s3.New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		r.Register("s3", st)
		return r
	}
	e.admin = mkRouter(0, allowedBucket, foreignBucket)
	// The worker's reader bounds headers, as cmd/worker does with
	// limits.max_header_bytes.
	e.reader = mkRouter(maxTestHeader, allowedBucket)
	outsideFS, err := file.New(e.outside)
	if err != nil {
		t.Fatal(err)
	}
	e.admin.Register("file", outsideFS)
	rootFS, err := file.New(e.root)
	if err != nil {
		t.Fatal(err)
	}
	e.reader.Register("file", rootFS)

	e.be = cpu.New()
	t.Cleanup(func() { e.be.Close() })
	// Good inputs the batch-mates of every case use; their expected
	// outputs come from a single-job run, checked against the oracle.
	for i, shape := range [][2]int{{3, 64}, {8, 129}, {5, 256}} {
		w := newWork(t, e.be, uint64(100+i), shape[0], shape[1])
		uri := fmt.Sprintf("s3://%s/good/%d.safetensors", allowedBucket, i)
		e.putTensors(t, uri, safetensors.F32("x", shape[:], w.X.Float32s()),
			safetensors.F32("w", shape[1:], w.W.Float32s()), safetensors.F32("dy", shape[:], w.DY.Float32s()))
		compute1(t, e.be, w)
		checkOracle(t, w)
		e.goods = append(e.goods, goodInput{uri: uri, dx: bytes.Clone(w.DX.Bytes()), dw: bytes.Clone(w.DW.Bytes())})
	}

	e.reg = prometheus.NewRegistry()
	m := NewMetrics(e.reg)
	e.logs = &syncbuf.Buffer{}
	log := slog.New(slog.NewJSONHandler(e.logs, nil))
	// max_wait is long enough that the jobs a case enqueues together share
	// a command buffer.
	e.b = NewBatcher(e.be, BatchConfig{MaxJobs: 16, MaxWait: 25 * time.Millisecond}, m, log)
	h, err := NewHandler(HandlerConfig{Backend: e.be, Batcher: e.b, Store: routerAdapter{e.reader}, Budget: NewBudget(64 << 20),
		Limits: limits, SigningKey: signingKey, Worker: "badinput", Metrics: m, Logger: log, Pins: NewPinCache(1 << 20)})
	if err != nil {
		t.Fatal(err)
	}
	redis := asynq.RedisClientOpt{Addr: e.redis.Addr}
	e.srv = asynq.NewServer(redis, asynq.Config{
		Concurrency:     16,
		Queues:          map[string]int{DefaultQueue: 1},
		RetryDelayFunc:  RetryDelay(50*time.Millisecond, 200*time.Millisecond),
		ShutdownTimeout: 20 * time.Second,
		// Archiving a permanent failure is logged by asynq at warn level
		// ("Retry exhausted"); the test asserts on it instead.
		LogLevel: asynq.ErrorLevel,
		// Poll often, so a case does not wait a second for the next
		// check, and a wrongly retried job comes back (and fails the
		// test) quickly.
		TaskCheckInterval:        10 * time.Millisecond,
		DelayedTaskCheckInterval: 100 * time.Millisecond,
	})
	mux := asynq.NewServeMux()
	h.Register(mux)
	if err := e.srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.srv.Shutdown()
		_ = e.b.Close(context.Background())
	})
	var copts []ClientOption
	copts = append(copts, WithMaxRetry(rawMaxRetry), WithPollInterval(20*time.Millisecond))
	if signingKey != nil {
		copts = append(copts, WithSigningKey(signingKey))
	}
	e.client = NewClient(redis, copts...)
	e.asq = asynq.NewClient(redis)
	t.Cleanup(func() { e.client.Close(); e.asq.Close() })
	return e
}

// putTensors uploads a safetensors object through the unrestricted router.
func (e *realEnv) putTensors(t *testing.T, uri string, ts ...safetensors.Tensor) {
	t.Helper()
	var b bytes.Buffer
	if err := safetensors.Encode(&b, ts, nil); err != nil {
		t.Fatal(err)
	}
	e.putRaw(t, uri, b.Bytes())
}

// putRaw uploads bytes as they are (malformed objects included).
func (e *realEnv) putRaw(t *testing.T, uri string, obj []byte) {
	t.Helper()
	if err := e.admin.Put(context.Background(), uri, bytes.NewReader(obj), int64(len(obj))); err != nil {
		t.Fatalf("upload %s: %v", uri, err)
	}
}

// enqueueRaw enqueues a payload as it is, bypassing Client's validation,
// as a hostile or buggy producer could, with retries available so that
// "retried 0" means the error was classified permanent.
func (e *realEnv) enqueueRaw(t *testing.T, payload []byte) string {
	t.Helper()
	info, err := e.asq.Enqueue(asynq.NewTask(TaskType, payload), asynq.Queue(DefaultQueue),
		asynq.MaxRetry(rawMaxRetry), asynq.Retention(time.Hour), asynq.Timeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

// enqueueGood enqueues a valid job on good input i writing to out.
func (e *realEnv) enqueueGood(t *testing.T, i int, out string) string {
	t.Helper()
	g := e.goods[i]
	id, err := e.client.Enqueue(context.Background(), Job{X: g.uri + "#x", W: g.uri + "#w", DY: g.uri + "#dy", Out: out, Eps: 1e-6})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// checkGood waits for a good job and compares its stored outputs bitwise
// with the single-job run.
func (e *realEnv) checkGood(t *testing.T, ctx context.Context, id string, i int, out string) *Result {
	t.Helper()
	res, err := e.client.Wait(ctx, id)
	if err != nil {
		t.Fatalf("batch-mate %s: %v", id, err)
	}
	for name, want := range map[string][]byte{"dx": e.goods[i].dx, "dw": e.goods[i].dw} {
		ti, err := e.admin.Head(ctx, out+"#"+name)
		if err != nil {
			t.Fatalf("batch-mate %s: %v", id, err)
		}
		got := make([]byte, ti.Size)
		if err := e.admin.Fetch(ctx, ti, got); err != nil {
			t.Fatalf("batch-mate %s: %v", id, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("batch-mate %s: %s differs from a single-job run", id, name)
		}
	}
	return res
}

// counter returns the value of a counter series from the registry (0 when
// absent).
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// rawObject builds a safetensors object from a header string and n data
// bytes, with the correct length prefix.
func rawObject(header string, n int) []byte {
	b := make([]byte, 8, 8+len(header)+n)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, n)...)
}

// mustReplace replaces the one occurrence of old in b, failing if none.
func mustReplace(t *testing.T, b []byte, old, new string) []byte {
	t.Helper()
	if bytes.Count(b, []byte(old)) != 1 {
		t.Fatalf("payload %s does not hold %s once", b, old)
	}
	return bytes.Replace(b, []byte(old), []byte(new), 1)
}

func f32s(n int, v float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func normal(n int, seed uint64) []float32 {
	s := make([]float32, n)
	for i := range s {
		// a fixed, finite, varied pattern
		s[i] = float32(math.Sin(float64(i)*0.7+float64(seed))) + 0.1
	}
	return s
}

// badCase is one hostile input: how to make it and what its message must
// say.
type badCase struct {
	name string
	// make uploads what the case needs and returns either a job (enqueued
	// raw, without Client's validation) or a raw payload.
	make func(t *testing.T, e *realEnv, p string) (Job, []byte)
	want []string // substrings of the archived task's message besides "job <id>"
	// sameBatch: the job reaches the batcher; require that a batch-mate
	// was computed in the same command buffer.
	sameBatch bool
}

// TestBadInput runs every hostile input of the failure model through a
// real queue (redis-server), real storage (versitygw and the file store)
// and the real handler, batcher and CPU backend. Each case enqueues the bad
// job between two good ones. It must end archived with a message naming
// the job and the tensor, URI or limit, with 0 retries although retries
// were allowed; its batch-mates must complete with outputs bitwise equal to
// a single-job run; and the same worker keeps serving: nothing is
// restarted between cases, and a last good job completes after them all.
func TestBadInput(t *testing.T) {
	limits := Limits{MaxElements: 1 << 16, MaxBytes: 512 << 10}
	e := newRealEnv(t, limits, nil)
	S := "s3://" + allowedBucket + "/"
	// put writes x, w, dy with the given shapes and values into one object
	// and returns the job reading it.
	put := func(t *testing.T, e *realEnv, uri string, xs, ws, dys []int, fill func(name string, n int) []float32) Job {
		n := func(s []int) int {
			k := 1
			for _, d := range s {
				k *= d
			}
			return k
		}
		if fill == nil {
			fill = func(name string, k int) []float32 { return normal(k, uint64(len(name))) }
		}
		e.putTensors(t, uri, safetensors.F32("x", xs, fill("x", n(xs))), safetensors.F32("w", ws, fill("w", n(ws))),
			safetensors.F32("dy", dys, fill("dy", n(dys))))
		return Job{X: uri + "#x", W: uri + "#w", DY: uri + "#dy", Out: uri + ".out", Eps: 1e-6}
	}
	okJob := func(t *testing.T, e *realEnv, uri string) Job {
		return put(t, e, uri, []int{4, 16}, []int{16}, []int{4, 16}, nil)
	}
	// dtypeJob stores x with another dtype (w and dy F32).
	dtypeJob := func(dtype string, size int) func(t *testing.T, e *realEnv, p string) (Job, []byte) {
		return func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			uri := p + ".safetensors"
			e.putTensors(t, uri, safetensors.Tensor{Name: "x", DType: dtype, Shape: []int{4, 16}, Data: make([]byte, 64*size)},
				safetensors.F32("w", []int{16}, f32s(16, 1)), safetensors.F32("dy", []int{4, 16}, f32s(64, 1)))
			return Job{X: uri + "#x", W: uri + "#w", DY: uri + "#dy", Out: p + ".out", Eps: 1e-6}, nil
		}
	}
	// oneX replaces x with a raw object and keeps valid w and dy.
	oneX := func(obj func() []byte) func(t *testing.T, e *realEnv, p string) (Job, []byte) {
		return func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			e.putRaw(t, p+".x.safetensors", obj())
			j.X = p + ".x.safetensors"
			return j, nil
		}
	}
	nonFinite := func(tensor string, v float32, at int) func(t *testing.T, e *realEnv, p string) (Job, []byte) {
		return func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return put(t, e, p+".safetensors", []int{4, 16}, []int{16}, []int{4, 16}, func(name string, k int) []float32 {
				s := normal(k, uint64(len(name)))
				if name == tensor {
					s[at] = v
				}
				return s
			}), nil
		}
	}
	payloadOf := func(t *testing.T, j Job) []byte {
		j.V = Version
		b, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var base Job // a valid job's fields for payload-level cases, set below
	// good0 is that job writing to the case's own output, so that a case
	// that wrongly succeeds cannot hide behind another's output.
	good0 := func(p string) Job {
		j := base
		j.Out = p + ".out"
		return j
	}
	cases := []badCase{
		{name: "truncated object", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			var b bytes.Buffer
			_ = safetensors.Encode(&b, []safetensors.Tensor{safetensors.F32("x", []int{4, 16}, f32s(64, 1))}, nil)
			return oneX(func() []byte { return b.Bytes()[:b.Len()-100] })(t, e, p)
		}, want: []string{"tensor x", ".x.safetensors", "the object is"}},
		{name: "header length past the end", make: oneX(func() []byte {
			o := rawObject(`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 4)
			binary.LittleEndian.PutUint64(o, 1<<20)
			return o
		}), want: []string{"tensor x", "header length 1048576 overruns the object"}},
		{name: "header length over the 100 MB cap", make: oneX(func() []byte {
			o := rawObject(`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 4)
			binary.LittleEndian.PutUint64(o, 1<<40)
			return o
		}), want: []string{"tensor x", "exceeds the safetensors format's cap of 100000000 bytes"}},
		{name: "header over the worker's header limit", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			// Valid, but 100 KiB of metadata: the whole header would be
			// held in memory outside the tensor budget.
			uri := p + ".safetensors"
			var b bytes.Buffer
			if err := safetensors.Encode(&b, []safetensors.Tensor{safetensors.F32("x", []int{4, 16}, normal(64, 1)),
				safetensors.F32("w", []int{16}, normal(16, 2)), safetensors.F32("dy", []int{4, 16}, normal(64, 3))},
				map[string]string{"padding": strings.Repeat("p", 100<<10)}); err != nil {
				t.Fatal(err)
			}
			e.putRaw(t, uri, b.Bytes())
			return Job{X: uri + "#x", W: uri + "#w", DY: uri + "#dy", Out: p + ".out", Eps: 1e-6}, nil
		}, want: []string{"header limit of 65536 bytes", "limits.max_header_bytes"}},
		{name: "object shorter than the length prefix", make: oneX(func() []byte { return []byte{1, 2, 3} }),
			want: []string{"tensor x", "shorter than the 8-byte header length prefix"}},
		{name: "invalid header JSON", make: oneX(func() []byte {
			return rawObject(`{"x":{"dtype":"F32","shape":[4,16],"data_offsets":[0,256]`+"    ", 256)
		}), want: []string{"tensor x", "invalid JSON"}},
		{name: "duplicate tensor names", make: oneX(func() []byte {
			return rawObject(`{"x":{"dtype":"F32","shape":[4,16],"data_offsets":[0,256]},"x":{"dtype":"F32","shape":[4,16],"data_offsets":[256,512]}}`, 512)
		}), want: []string{"tensor x", `duplicate name "x"`}},
		{name: "dtype F64", make: dtypeJob("F64", 8), want: []string{"tensor x", "dtype F64", "supported: F32, BF16, F16"}},
		{name: "dtype I32", make: dtypeJob("I32", 4), want: []string{"tensor x", "dtype I32", "supported: F32, BF16, F16"}},
		{name: "dtype F8_E4M3", make: dtypeJob("F8_E4M3", 1), want: []string{"tensor x", "dtype F8_E4M3", "supported: F32, BF16, F16"}},
		{name: "dtype I16 (2 bytes, not a float)", make: dtypeJob("I16", 2), want: []string{"tensor x", "dtype I16", "supported: F32, BF16, F16"}},
		{name: "dtype BF16 with F32's byte count", make: oneX(func() []byte {
			return rawObject(`{"x":{"dtype":"BF16","shape":[4,16],"data_offsets":[0,256]}}`, 256)
		}), want: []string{"tensor x", "shape [4 16] of BF16 needs 128"}},
		{name: "x and dy shapes differ", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return put(t, e, p+".safetensors", []int{4, 16}, []int{16}, []int{16, 4}, nil), nil
		}, want: []string{"tensor dy", "shape [16 4]: want x's shape [4 16]"}},
		{name: "x and dy leading dims differ", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return put(t, e, p+".safetensors", []int{2, 2, 16}, []int{16}, []int{4, 16}, nil), nil
		}, want: []string{"tensor dy", "want x's shape [2 2 16]"}},
		{name: "w not [D]: wrong length", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return put(t, e, p+".safetensors", []int{4, 16}, []int{17}, []int{4, 16}, nil), nil
		}, want: []string{"tensor w", "shape [17]: want [16]"}},
		{name: "w not [D]: two dims", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return put(t, e, p+".safetensors", []int{4, 16}, []int{1, 16}, []int{4, 16}, nil), nil
		}, want: []string{"tensor w", "shape [1 16]: want [16]"}},
		{name: "dimension 0 (D)", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return put(t, e, p+".safetensors", []int{4, 0}, []int{0}, []int{4, 0}, nil), nil
		}, want: []string{"tensor x", "every dim must be > 0"}},
		{name: "dimension 0 (rows)", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return put(t, e, p+".safetensors", []int{0, 16}, []int{16}, []int{0, 16}, nil), nil
		}, want: []string{"tensor x", "every dim must be > 0"}},
		{name: "x is a scalar", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return put(t, e, p+".safetensors", []int{}, []int{1}, []int{}, nil), nil
		}, want: []string{"tensor x", "want at least one dim"}},
		{name: "rows*dim overflows", make: oneX(func() []byte {
			return rawObject(`{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}}`, 16)
		}), want: []string{"tensor x", "overflows"}},
		{name: "rows*dim overflows in the product of three dims", make: oneX(func() []byte {
			return rawObject(`{"x":{"dtype":"F32","shape":[2097152,2097152,2097152],"data_offsets":[0,16]}}`, 16)
		}), want: []string{"tensor x", "overflows"}},
		{name: "over limits.max_elements", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return put(t, e, p+".safetensors", []int{129, 512}, []int{512}, []int{129, 512}, nil), nil
		}, want: []string{"tensor x", "66048 elements", "limits.max_elements", "65536"}},
		{name: "over limits.max_job_bytes", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return put(t, e, p+".safetensors", []int{128, 512}, []int{512}, []int{128, 512}, nil), nil
		}, want: []string{"tensor x", "limits.max_job_bytes", "524288"}},
		{name: "missing object", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			j.DY = p + ".nothing.safetensors#dy"
			return j, nil
		}, want: []string{"tensor dy", ".nothing.safetensors", "not found"}},
		{name: "missing tensor name", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			j.W = p + ".safetensors#gamma"
			return j, nil
		}, want: []string{"tensor w", "#gamma", "no such tensor", "it holds: x, w, dy"}},
		{name: "no #name in a multi-tensor object", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			j.W = p + ".safetensors"
			return j, nil
		}, want: []string{"tensor w", "holds 3 tensors", "name one with #name"}},
		{name: "input bucket outside the allow-list", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			uri := "s3://" + foreignBucket + "/" + strings.TrimPrefix(p, S) + ".safetensors" // exists
			e.putTensors(t, uri, safetensors.F32("x", []int{4, 16}, normal(64, 1)))
			j.X = uri + "#x"
			return j, nil
		}, want: []string{"tensor x", "s3://" + foreignBucket + "/", "not allowed"}},
		{name: "output bucket outside the allow-list", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			j.Out = "s3://" + foreignBucket + "/stolen.safetensors"
			return j, nil
		}, want: []string{"tensor out", "s3://" + foreignBucket + "/stolen.safetensors", "not allowed"}},
		{name: "s3 key with ..", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			j.X = S + "a/../" + strings.TrimPrefix(p, S) + ".safetensors#x"
			return j, nil
		}, want: []string{"tensor x", `path segment ".." is not allowed`}},
		{name: "file URI with .. leaving the root", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			e.putTensors(t, "file://"+filepath.Join(e.outside, "x.safetensors"), safetensors.F32("x", []int{4, 16}, normal(64, 1)))
			j.X = "file://" + e.root + "/../outside/x.safetensors#x"
			return j, nil
		}, want: []string{"tensor x", `path segment ".." is not allowed`}},
		{name: "file URI outside the root", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			e.putTensors(t, "file://"+filepath.Join(e.outside, "x2.safetensors"), safetensors.F32("x", []int{4, 16}, normal(64, 1)))
			j.X = "file://" + filepath.Join(e.outside, "x2.safetensors") + "#x"
			return j, nil
		}, want: []string{"tensor x", "outside the file store root"}},
		{name: "symlink escaping the file root", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			target := filepath.Join(e.outside, "x3.safetensors")
			e.putTensors(t, "file://"+target, safetensors.F32("x", []int{4, 16}, normal(64, 1)))
			link := filepath.Join(e.root, "link3.safetensors")
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			j.X = "file://" + link + "#x"
			return j, nil
		}, want: []string{"tensor x", "link3.safetensors", "not allowed", "outside the file store root"}},
		{name: "symlinked directory escaping the file root", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			e.putTensors(t, "file://"+filepath.Join(e.outside, "x4.safetensors"), safetensors.F32("x", []int{4, 16}, normal(64, 1)))
			if err := os.Symlink(e.outside, filepath.Join(e.root, "dirlink")); err != nil {
				t.Fatal(err)
			}
			j.X = "file://" + filepath.Join(e.root, "dirlink", "x4.safetensors") + "#x"
			return j, nil
		}, want: []string{"tensor x", "dirlink", "not allowed"}},
		{name: "output through a symlink escaping the file root", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			if err := os.Symlink(e.outside, filepath.Join(e.root, "outlink")); err != nil {
				t.Fatal(err)
			}
			j.Out = "file://" + filepath.Join(e.root, "outlink", "stolen.safetensors")
			return j, nil
		}, want: []string{"tensor out", "outlink", "not allowed"}},
		{name: "out equal to an input object", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			j.Out = p + ".safetensors"
			return j, nil
		}, want: []string{"out", "also input x", "overwrite an input"}},
		{name: "out equal to an input, fragment kept", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			j.Out = j.DY
			return j, nil
		}, want: []string{"out", "also input", "overwrite an input"}},
		{name: "malformed payload JSON", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return Job{}, []byte(`{"v":1,"x":"` + good0(p).X + `","w":`)
		}, want: []string{"payload", "malformed JSON"}},
		{name: "payload is not an object", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return Job{}, []byte(`["s3://tensors/a"]`)
		}, want: []string{"payload", "malformed JSON"}},
		{name: "trailing data after the payload", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return Job{}, append(payloadOf(t, good0(p)), `{"v":1}`...)
		}, want: []string{"payload", "trailing data"}},
		{name: "unknown field", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			b := payloadOf(t, good0(p))
			return Job{}, append(b[:len(b)-1], `,"endpoint":"evil.example:9000"}`...)
		}, want: []string{"payload", `unknown field "endpoint"`}},
		{name: "payload key in another case", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			// encoding/json alone would let "OUT" fill Out.
			return Job{}, mustReplace(t, payloadOf(t, good0(p)), `"out":`, `"OUT":`)
		}, want: []string{"payload", `unknown field "OUT"`}},
		{name: "payload key given twice", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			// encoding/json alone would keep the last out.
			b := payloadOf(t, good0(p))
			return Job{}, append(b[:len(b)-1], `,"out":"`+p+`.other"}`...)
		}, want: []string{"payload", `field "out" given twice`}},
		{name: "unknown version", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return Job{}, mustReplace(t, payloadOf(t, good0(p)), `"v":1`, `"v":2`)
		}, want: []string{"v", "version 2 not supported"}},
		{name: "payload over 16 KiB", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := good0(p)
			j.X += strings.Repeat("x", MaxPayloadBytes)
			return Job{}, payloadOf(t, j)
		}, want: []string{"payload", "limit 16384"}},
		{name: "eps 0", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := good0(p)
			j.Eps = 0
			return j, nil
		}, want: []string{"eps", "must be finite and > 0, got 0"}},
		{name: "eps negative", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := good0(p)
			j.Eps = -1e-6
			return j, nil
		}, want: []string{"eps", "must be finite and > 0, got -1e-06"}},
		{name: "eps NaN", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			// JSON has no NaN: a producer writing one sends this.
			b := payloadOf(t, good0(p))
			return Job{}, mustReplace(t, b, `"eps":0.000001`, `"eps":NaN`)
		}, want: []string{"payload", "malformed JSON", "invalid character 'N'"}},
		{name: "eps NaN as a string", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			b := payloadOf(t, good0(p))
			return Job{}, mustReplace(t, b, `"eps":0.000001`, `"eps":"NaN"`)
		}, want: []string{"payload", "malformed JSON", "Job.eps"}},
		{name: "eps underflows float32", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := good0(p)
			j.Eps = 1e-50
			return j, nil
		}, want: []string{"eps", "not representable as a positive finite float32"}},
		{name: "eps overflows float32", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := good0(p)
			j.Eps = 1e39
			return j, nil
		}, want: []string{"eps", "not representable as a positive finite float32"}},
		{name: "NaN in x", make: nonFinite("x", float32(math.NaN()), 5),
			want: []string{"tensor x", "non-finite values", "1 NaN/Inf of 64 values, first at flat index 5"}},
		{name: "+Inf in dy", make: nonFinite("dy", float32(math.Inf(1)), 63),
			want: []string{"tensor dy", "non-finite values", "first at flat index 63 (+Inf)"}},
		{name: "-Inf in w", make: nonFinite("w", float32(math.Inf(-1)), 0),
			want: []string{"tensor w", "non-finite values", "first at flat index 0 (-Inf)"}},
		{name: "finite inputs whose gradient overflows", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			return put(t, e, p+".safetensors", []int{4, 16}, []int{16}, []int{4, 16}, func(name string, k int) []float32 {
				if name == "dy" {
					return f32s(k, 3e38)
				}
				return f32s(k, 2)
			}), nil
		}, want: []string{"non-finite values", "output (batch "}, sameBatch: true},
		{name: "finite x whose sum of squares overflows float32", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			// Without a guard rms_inv comes out 0 and dx, dw finite zeros:
			// silently wrong rather than non-finite.
			return put(t, e, p+".safetensors", []int{4, 16}, []int{16}, []int{4, 16}, func(name string, k int) []float32 {
				s := normal(k, uint64(len(name)))
				if name == "x" {
					for i := range s {
						s[i] *= 1e20
					}
				}
				return s
			}), nil
		}, want: []string{"tensor x", "non-finite values", "row 0 of x: its sum of squares overflows float32"}, sameBatch: true},
		{name: "w not the bytes its pin names", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			j.WSHA256 = strings.Repeat("ab", 32)
			return j, nil
		}, want: []string{"tensor w", ".safetensors#w", "does not match the job's w_sha256", "the job pins " + strings.Repeat("ab", 32)}, sameBatch: false},
		{name: "w_sha256 not a digest", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := good0(p)
			j.WSHA256 = "ABCD"
			return j, nil
		}, want: []string{"w_sha256", "64 lowercase hex digits", "got 4 characters"}},
		{name: "unknown output", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := good0(p)
			j.Outputs = []string{"dx", "ddx"}
			return j, nil
		}, want: []string{"outputs", `unknown output "ddx"`}},
		{name: "missing x URI", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := good0(p)
			j.X = ""
			return j, nil
		}, want: []string{"x", "missing tensor URI"}},
		{name: "output URI names a tensor", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			j.Out = p + ".out#dx"
			return j, nil
		}, want: []string{"tensor out", "names an object, not a tensor"}},
		{name: "unknown URI scheme", make: func(t *testing.T, e *realEnv, p string) (Job, []byte) {
			j := okJob(t, e, p+".safetensors")
			j.X = "http://169.254.169.254/latest/meta-data#x"
			return j, nil
		}, want: []string{"tensor x", `unknown scheme "http"`}},
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base = okJob(t, e, S+"base.safetensors")
	attempts := 0
	var mu sync.Mutex
	// The cases run in parallel, so bad jobs meet good ones in the same
	// batches, as they would in production.
	t.Run("cases", func(t *testing.T) {
		for ci, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				// A case that must share a command buffer with its
				// batch-mates is tried again (fresh objects) when the
				// scheduler happened to split them.
				for attempt := 0; ; attempt++ {
					_, shared := runBadCase(t, ctx, e, c, fmt.Sprintf("%scase%d-%d", S, ci, attempt), ci, payloadOf)
					mu.Lock()
					attempts++
					mu.Unlock()
					if !c.sameBatch || shared {
						break
					}
					if attempt == 4 {
						t.Fatalf("in 5 attempts the bad job never shared a command buffer with a batch-mate")
					}
				}
			})
		}
	})
	if t.Failed() {
		return
	}
	// The worker still serves.
	out := S + "after.out"
	e.checkGood(t, ctx, e.enqueueGood(t, 0, out), 0, out)
	perm := counter(t, e.reg, "rmsgrad_jobs_total", map[string]string{"outcome": OutcomePermanent})
	retry := counter(t, e.reg, "rmsgrad_jobs_total", map[string]string{"outcome": OutcomeRetry})
	ok := counter(t, e.reg, "rmsgrad_jobs_total", map[string]string{"outcome": OutcomeOK})
	if perm != float64(attempts) || retry != 0 || ok != float64(2*attempts+1) {
		t.Fatalf("rmsgrad_jobs_total: permanent %v (want %d), retry %v (want 0), ok %v (want %d)", perm, attempts, retry, ok, 2*attempts+1)
	}
	t.Logf("%d bad inputs (%d jobs) archived with 0 retries; %d batch-mates and 1 later job completed bitwise", len(cases), attempts, 2*attempts)
}

// batchRE finds the batch id a message names ("batch 1a2b3c4d-17").
var batchRE = regexp.MustCompile(`batch ([0-9a-f]+-[0-9]+)`)

// runBadCase enqueues c's bad job between two good batch-mates under prefix
// p and checks all three. It returns the bad job's message, and whether it
// shared a command buffer with a batch-mate (only known for jobs that
// reach the batcher).
func runBadCase(t *testing.T, ctx context.Context, e *realEnv, c badCase, p string, ci int, payloadOf func(*testing.T, Job) []byte) (msg string, shared bool) {
	t.Helper()
	j, raw := c.make(t, e, p)
	if raw == nil {
		raw = payloadOf(t, j)
	}
	outs := []string{p + ".mate0.out", p + ".mate1.out"}
	// The bad job between its two batch-mates.
	mate0 := e.enqueueGood(t, ci%len(e.goods), outs[0])
	id := e.enqueueRaw(t, raw)
	mate1 := e.enqueueGood(t, (ci+1)%len(e.goods), outs[1])

	_, err := e.client.Wait(ctx, id)
	var fe *JobFailedError
	if !errors.As(err, &fe) {
		t.Fatalf("bad job %s ended with %v, want archived", id, err)
	}
	t.Logf("archived after %d retries: %s", fe.Retried, fe.Msg)
	if fe.Retried != 0 {
		t.Errorf("bad job %s retried %d times (max %d): the error was not classified permanent: %s", id, fe.Retried, rawMaxRetry, fe.Msg)
	}
	for _, w := range append([]string{"job " + id}, c.want...) {
		if !strings.Contains(fe.Msg, w) {
			t.Errorf("message %q lacks %q", fe.Msg, w)
		}
	}
	s, err := e.client.Status(ctx, id)
	if err != nil || s.State != StateFailed {
		t.Fatalf("bad job state %v, %v; want failed (archived)", s, err)
	}
	// A permanent failure stores no output.
	if j.Out != "" && strings.HasPrefix(j.Out, "s3://"+allowedBucket+"/") {
		if _, err := e.admin.Head(ctx, j.Out+"#dx"); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("bad job left an output at %s: %v", j.Out, err)
		}
	}
	r0 := e.checkGood(t, ctx, mate0, ci%len(e.goods), outs[0])
	r1 := e.checkGood(t, ctx, mate1, (ci+1)%len(e.goods), outs[1])
	if !c.sameBatch {
		return fe.Msg, false
	}
	batch := ""
	if m := batchRE.FindStringSubmatch(fe.Msg); m != nil {
		batch = m[1]
	}
	if batch == "" {
		t.Fatalf("message %q does not name its batch", fe.Msg)
	}
	t.Logf("bad job's batch %s; batch-mates' batches %s (%d jobs), %s (%d jobs)", batch, r0.BatchID, r0.BatchJobs, r1.BatchID, r1.BatchJobs)
	return fe.Msg, r0.BatchID == batch || r1.BatchID == batch
}
