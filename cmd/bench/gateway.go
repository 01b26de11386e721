package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/gateway"
	"github.com/rmsgrad/rmsgrad/internal/procattr"
	"github.com/rmsgrad/rmsgrad/internal/syncbuf"
	"github.com/rmsgrad/rmsgrad/jobs"
)

// gatewayQueue is the queue of the gateway section.
const gatewayQueue = "bench-gateway"

// benchGateway measures the HTTP gateway (bin/gateway) against its
// baselines on the same Redis and S3, alternating the two of each pair
// -repeat times; the figures are medians, the ratio the median of the
// ratios of adjacent runs (robust to a machine whose load drifts):
//
//   - enqueue: jobs/s posted through POST /v1/jobs/batch (batches of 500,
//     two requests at once: 64 enqueues in flight in the gateway) against
//     jobs.Client.Enqueue from 64 goroutines here; no worker runs, the
//     queue is emptied between runs;
//   - end to end: the Python client's batch API (clients/python/examples/
//     throughput.py: upload through presigned URLs, batch submit, batch
//     wait, read dx and dw back) against `enqueue synth --wait` (its own
//     jobs/s: upload, enqueue, wait; its check of the outputs is after its
//     clock stops), on the same small jobs, one bin/worker serving both.
func benchGateway(ctx context.Context, e *env, o options) ([]row, []string, error) {
	dir := filepath.Dir(o.worker)
	gwBin, enqBin := filepath.Join(dir, "gateway"), filepath.Join(dir, "enqueue")
	tok, err := gateway.NewToken()
	if err != nil {
		return nil, nil, err
	}
	line, _ := gateway.TokenLine("bench", tok)
	tokFile := filepath.Join(e.tmp, "gateway-tokens")
	if err := os.WriteFile(tokFile, []byte(line+"\n"), 0o600); err != nil {
		return nil, nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cfg := fmt.Sprintf("http_addr: %s\nlog_level: warn\nqueue: %s\nauth: {token_files: [%s]}\nlimits: {requests_per_s: 0, max_body_bytes: 4194304}\n"+
		"redis: {addr: %q}\nstorage: {s3: {endpoint: %q, tls: false, allow: [{bucket: %s}]}}\nuploads: {prefix: s3://%s/gw/}\n",
		addr, gatewayQueue, tokFile, e.redis.addr, e.s3.addr, benchBucket, benchBucket)
	gw, err := startProc(ctx, e, "gateway", gwBin, cfg, "http://"+addr+"/readyz")
	if err != nil {
		return nil, nil, err
	}
	defer gw.stop()
	rc := asynq.RedisClientOpt{Addr: e.redis.addr}
	insp := asynq.NewInspector(rc)
	defer insp.Close()
	client := jobs.NewClient(rc, jobs.WithQueue(gatewayQueue))
	defer client.Close()

	// Enqueue: direct vs through the gateway.
	n := o.scaled(10000)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	// One unmeasured run of each first: connections, Redis's script
	// cache and the gateway's first allocations.
	if _, err := enqueueDirect(ctx, client, 1000, 99); err != nil {
		return nil, nil, fmt.Errorf("gateway bench, warm-up: %w", err)
	}
	warm, err := batchBodies(1000, 99)
	if err != nil {
		return nil, nil, err
	}
	if _, err := enqueueGateway(ctx, hc, "http://"+addr, tok, warm); err != nil {
		return nil, nil, fmt.Errorf("gateway bench, warm-up: %w", err)
	}
	var direct, viaGW []float64
	// CPU microseconds a job, by process: this one (the direct client, or
	// the HTTP client), the gateway, redis-server.
	cpu := map[string][][3]float64{}
	snap := func() [3]time.Duration {
		var t [3]time.Duration
		for i, pid := range []int{os.Getpid(), gw.cmd.Process.Pid, e.redis.cmd.Process.Pid} {
			t[i], _ = procCPU(pid)
		}
		return t
	}
	reps := max(o.repeat, 1)
	for rep := range reps {
		for _, mode := range []string{"direct", "gateway"} {
			_ = insp.DeleteQueue(gatewayQueue, true)
			var r float64
			var bodies [][]byte
			if mode == "gateway" {
				if bodies, err = batchBodies(n, rep); err != nil {
					return nil, nil, err
				}
			}
			t0 := snap()
			if mode == "direct" {
				r, err = enqueueDirect(ctx, client, n, rep)
				direct = append(direct, r)
			} else {
				r, err = enqueueGateway(ctx, hc, "http://"+addr, tok, bodies)
				viaGW = append(viaGW, r)
			}
			if err != nil {
				return nil, nil, fmt.Errorf("gateway bench, enqueue %s: %w", mode, err)
			}
			t1 := snap()
			var us [3]float64
			for i := range us {
				us[i] = float64((t1[i] - t0[i]).Microseconds()) / float64(n)
			}
			cpu[mode] = append(cpu[mode], us)
		}
	}
	_ = insp.DeleteQueue(gatewayQueue, true)
	md, mg := med(direct), med(viaGW)
	rows := []row{
		{Section: "gateway", What: "enqueue: jobs.Client.Enqueue, 64 goroutines", Figure: fmt.Sprintf("%.0f jobs/s (runs %s)", md, list(direct)), Ceiling: "(baseline)"},
		pairRow("enqueue: POST /v1/jobs/batch, 500 a request, 2 at once", fmt.Sprintf("%.0f jobs/s (runs %s)", mg, list(viaGW)),
			"jobs.Client.Enqueue", viaGW, direct, 0.8),
	}
	notes := []string{fmt.Sprintf("gateway section: CPU %s; %d jobs a run, %d runs of each alternating; figures are medians, ratios the median of adjacent pairs' ratios",
		cpuModel(), n, reps)}
	for _, mode := range []string{"direct", "gateway"} {
		var parts []string
		for i, who := range []string{"bench process", "gateway", "redis-server"} {
			var xs []float64
			for _, c := range cpu[mode] {
				xs = append(xs, c[i])
			}
			parts = append(parts, fmt.Sprintf("%s %.1f", who, med(xs)))
		}
		notes = append(notes, fmt.Sprintf("enqueue %s: CPU us a job (medians, 10 ms clock ticks): %s", mode, strings.Join(parts, ", ")))
	}

	// End to end: the Python client vs enqueue synth, one worker.
	py := os.Getenv("RMSGRAD_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import numpy").CombinedOutput(); err != nil {
		rows = append(rows, row{Section: "gateway", What: "end to end: Python client", Figure: fmt.Sprintf("skipped: %s with numpy not found (%v %s)", py, err, out)})
		return rows, notes, nil
	}
	wport, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	wcfg := fmt.Sprintf("worker: bench-gw\nbackend: cpu\nconcurrency: %d\nqueues: {%s: 1}\nhttp_addr: 127.0.0.1:%d\nlog_level: warn\nredis: {addr: %q}\n"+
		"storage: {s3: {endpoint: %q, tls: false, allow: [{bucket: %s}]}}\n", o.concurrency, gatewayQueue, wport, e.redis.addr, e.s3.addr, benchBucket)
	w, err := startProc(ctx, e, "worker", o.worker, wcfg, fmt.Sprintf("http://127.0.0.1:%d/readyz", wport))
	if err != nil {
		return nil, nil, err
	}
	defer w.stop()
	enqCfg := filepath.Join(e.tmp, "gateway-enqueue.yaml")
	if err := os.WriteFile(enqCfg, []byte(fmt.Sprintf("redis: {addr: %q}\nqueue: %s\nstorage: {s3: {endpoint: %q, tls: false, buckets: [%s]}}\n",
		e.redis.addr, gatewayQueue, e.s3.addr, benchBucket)), 0o600); err != nil {
		return nil, nil, err
	}
	repo, _ := os.Getwd()
	pyDir := filepath.Join(repo, "clients", "python")
	small := shape{Name: "small", Rows: 8, Dim: 1024}
	jn := o.scaled(1000)
	var synth, pyRate []float64
	for rep := -1; rep < reps; rep++ { // run -1 warms up (the worker's pools, S3's directories) and is not counted
		count := jn
		if rep < 0 {
			count = min(jn, 200)
		}
		out, err := runJSON(ctx, exec.Command(enqBin, "synth", "--config", enqCfg, "--count", strconv.Itoa(count),
			"--shape", fmt.Sprintf("%dx%d", small.Rows, small.Dim), "--prefix", fmt.Sprintf("s3://%s/synth%d", benchBucket, rep+1),
			"--run", fmt.Sprintf("g%d", rep+1), "--wait", "--json"), e, "")
		if err != nil {
			return nil, nil, fmt.Errorf("gateway bench: enqueue synth: %w", err)
		}
		if rep >= 0 {
			synth = append(synth, out["jobs_per_s"].(float64))
		}
		cmd := exec.Command(py, filepath.Join(pyDir, "examples", "throughput.py"), "--count", strconv.Itoa(count),
			"--rows", strconv.Itoa(small.Rows), "--dim", strconv.Itoa(small.Dim))
		out, err = runJSON(ctx, cmd, e, "PYTHONPATH="+pyDir, "RMSGRAD_GATEWAY=http://"+addr, "RMSGRAD_TOKEN="+tok)
		if err != nil {
			return nil, nil, fmt.Errorf("gateway bench: python client: %w", err)
		}
		if rep >= 0 {
			pyRate = append(pyRate, out["jobs_per_s"].(float64))
		}
		_ = insp.DeleteQueue(gatewayQueue, true)
	}
	ms, mp := med(synth), med(pyRate)
	rows = append(rows,
		row{Section: "gateway", What: fmt.Sprintf("end to end %dx%d: enqueue synth --wait (Go, Redis and S3 directly)", small.Rows, small.Dim),
			Figure: fmt.Sprintf("%.0f jobs/s (runs %s)", ms, list(synth)), Ceiling: "(baseline)"},
		pairRow(fmt.Sprintf("end to end %dx%d: Python client, batch API, outputs read back", small.Rows, small.Dim),
			fmt.Sprintf("%.0f jobs/s (runs %s)", mp, list(pyRate)), "enqueue synth", pyRate, synth, 0.7))
	notes = append(notes, fmt.Sprintf("gateway end to end: %d jobs a run, one bin/worker (cpu, concurrency %d), Python %s", jn, o.concurrency, py))
	return rows, notes, nil
}

// enqueueDirect enqueues n jobs with jobs.Client from 64 goroutines and
// returns jobs/s.
func enqueueDirect(ctx context.Context, c *jobs.Client, n, rep int) (float64, error) {
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	start := time.Now()
	for range 64 {
		wg.Go(func() {
			for i := range next {
				if _, err := c.Enqueue(ctx, gatewayJob(i), asynq.TaskID(fmt.Sprintf("d%d-%07d", rep, i))); err != nil {
					select {
					case errc <- err:
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	select {
	case err := <-errc:
		return 0, err
	default:
	}
	return float64(n) / el.Seconds(), nil
}

// batchBodies are the request bodies of n jobs in batches of 500.
func batchBodies(n, rep int) ([][]byte, error) {
	const per = 500
	var bodies [][]byte
	for i := 0; i < n; i += per {
		type item struct {
			ID  string   `json:"id"`
			Job jobs.Job `json:"job"`
		}
		var items []item
		for k := i; k < min(i+per, n); k++ {
			items = append(items, item{fmt.Sprintf("g%d-%07d", rep, k), gatewayJob(k)})
		}
		b, err := json.Marshal(map[string]any{"jobs": items})
		if err != nil {
			return nil, err
		}
		bodies = append(bodies, b)
	}
	return bodies, nil
}

// enqueueGateway posts the bodies, two requests at once, and returns
// jobs/s (bodies are built before, as Enqueue's jobs are).
func enqueueGateway(ctx context.Context, hc *http.Client, base, tok string, bodies [][]byte) (float64, error) {
	n := 0
	for _, b := range bodies {
		n += bytes.Count(b, []byte(`"job":`))
	}
	next := make(chan []byte, len(bodies))
	for _, b := range bodies {
		next <- b
	}
	close(next)
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	start := time.Now()
	for range 2 {
		wg.Go(func() {
			for b := range next {
				if err := postBatch(ctx, hc, base, tok, b); err != nil {
					select {
					case errc <- err:
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	select {
	case err := <-errc:
		return 0, err
	default:
	}
	return float64(n) / el.Seconds(), nil
}

func postBatch(ctx context.Context, hc *http.Client, base, tok string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/jobs/batch", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		return fmt.Errorf("batch: HTTP %d: %v %s", resp.StatusCode, err, tailStr(string(b), 500))
	}
	// One "status" a job: all must be 202. Counting them costs this
	// process (which shares the machine with the gateway) less than
	// decoding the answer; a shortfall is decoded for its message.
	if bytes.Count(b, []byte(`"status":202`)) != bytes.Count(b, []byte(`"status":`)) {
		var ans struct {
			Jobs []struct {
				Status int
				Error  map[string]string
			}
		}
		_ = json.Unmarshal(b, &ans)
		for _, j := range ans.Jobs {
			if j.Status != 202 {
				return fmt.Errorf("batch: a job answered %d: %v", j.Status, j.Error)
			}
		}
		return fmt.Errorf("batch: an answer other than 202: %s", tailStr(string(b), 500))
	}
	return nil
}

// gatewayJob is job i of the enqueue runs: URIs of the bench bucket.
func gatewayJob(i int) jobs.Job {
	in := fmt.Sprintf("s3://%s/gw/in/%07d.safetensors", benchBucket, i)
	return jobs.Job{V: jobs.Version, X: in + "#x", W: in + "#w", DY: in + "#dy",
		Out: fmt.Sprintf("s3://%s/gw/out/%07d.safetensors", benchBucket, i), Eps: 1e-6}
}

// proc is a server binary started by the gateway section.
type proc struct {
	cmd  *exec.Cmd
	log  *syncbuf.Buffer
	done chan struct{}
}

// startProc runs bin with cfg as its config file (S3 keys in its
// environment) and waits until readyz answers 200.
func startProc(ctx context.Context, e *env, name, bin, cfg, readyz string) (*proc, error) {
	path := filepath.Join(e.tmp, name+"-"+strconv.FormatInt(time.Now().UnixNano(), 36)+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	p := &proc{cmd: exec.Command(bin, "--config", path), log: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "RMSGRAD_S3_ACCESS_KEY="+e.accessKey, "RMSGRAD_S3_SECRET_KEY="+e.secretKey)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = procattr.Child()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(readyz)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p, nil
			}
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited: %s", bin, p.log.String())
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s not ready at %s: %v; log:\n%s", bin, readyz, err, p.log.String())
		}
	}
}

func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// runJSON runs cmd (S3 keys and extra in its environment) and decodes the
// last line of its stdout as a JSON object.
func runJSON(ctx context.Context, cmd *exec.Cmd, e *env, extra ...string) (map[string]any, error) {
	cmd.Env = append(os.Environ(), "RMSGRAD_S3_ACCESS_KEY="+e.accessKey, "RMSGRAD_S3_SECRET_KEY="+e.secretKey)
	for _, x := range extra {
		if x != "" {
			cmd.Env = append(cmd.Env, x)
		}
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = procattr.Child()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return nil, fmt.Errorf("%s: %v\n%s\n%s", cmd.Path, err, tailStr(out.String(), 2000), tailStr(errb.String(), 2000))
		}
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return nil, ctx.Err()
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil {
		return nil, fmt.Errorf("%s: last line of output is not JSON: %v", cmd.Path, err)
	}
	if _, ok := m["jobs_per_s"].(float64); !ok {
		return nil, fmt.Errorf("%s: no jobs_per_s in its output", cmd.Path)
	}
	return m, nil
}

func tailStr(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// pairRow is a ratio row whose ratio is the median of ours[i]/base[i].
func pairRow(what, figure, ceiling string, ours, base []float64, target float64) row {
	var rs []float64
	for i := range min(len(ours), len(base)) {
		if base[i] > 0 {
			rs = append(rs, ours[i]/base[i])
		}
	}
	r := ratioRow("gateway", what, figure, ceiling, med(rs), 1, target)
	r.Figure += fmt.Sprintf("; pair ratios %s", pct(rs))
	return r
}

func pct(xs []float64) string {
	p := make([]string, len(xs))
	for i, x := range xs {
		p[i] = strconv.FormatFloat(100*x, 'f', 0, 64) + "%"
	}
	return strings.Join(p, ", ")
}

func med(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func list(xs []float64) string {
	p := make([]string, len(xs))
	for i, x := range xs {
		p[i] = strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strings.Join(p, ", ")
}
