package faults

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
)

// NewClusterEnv is NewEnv on a real Redis Cluster: masters masters with
// replicas replicas each (cluster-node-timeout 2 s, and
// cluster-require-full-coverage no, as configs/redis-cluster.conf
// recommends), the queue moved to shards shards before any job.
func NewClusterEnv(t testing.TB, masters, replicas, shards int) *Env {
	t.Helper()
	c := testenv.RedisCluster(t, masters, replicas, "--cluster-require-full-coverage", "no")
	e := &Env{Cluster: c, S3: testenv.Versitygw(t, Bucket)}
	st, err := s3.New(context.Background(), s3.Config{Endpoint: e.S3.Endpoint(), Region: "us-east-1",
		AccessKey: e.S3.AccessKey, SecretKey: e.S3.SecretKey, Allow: []s3.AllowRule{{Bucket: Bucket}}})
	if err != nil {
		t.Fatalf("faults: s3 store: %v", err)
	}
	e.Store = storage.NewRouter(storage.WithHeaderCache(0))
	e.Store.Register("s3", st)
	r := e.ClusterOpt()
	e.Client = jobs.NewClient(r, jobs.WithMaxRetry(25), jobs.WithPollInterval(50*time.Millisecond))
	e.Insp = asynq.NewInspector(r)
	t.Cleanup(func() { e.Client.Close(); e.Insp.Close() })
	// Nothing else runs yet: no settle needed.
	l, err := e.Client.Reshard(context.Background(), shards, jobs.ReshardOptions{Settle: 10 * time.Millisecond, Poll: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("faults: reshard to %d: %v", shards, err)
	}
	e.Queues = l.Queues()
	return e
}

// ClusterOpt is the connection option of the env's cluster.
func (e *Env) ClusterOpt() jobs.ClusterOpt {
	return jobs.ClusterOpt{RedisClusterClientOpt: asynq.RedisClusterClientOpt{Addrs: e.Cluster.Addrs()}}
}

// PutCounter is an HTTP reverse proxy in front of the S3 endpoint that
// counts the PUTs of each object path: how many times a job's output was
// written, which is how many times the job ran.
type PutCounter struct {
	Addr string
	srv  *httptest.Server

	mu   sync.Mutex
	puts map[string]int
}

// NewPutCounter starts a counting proxy to upstream (host:port).
func NewPutCounter(t testing.TB, upstream string) *PutCounter {
	t.Helper()
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: upstream})
	rp.ErrorLog = nil
	p := &PutCounter{puts: map[string]int{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.RawQuery == "" { // a single PUT, not a multipart part
			p.mu.Lock()
			p.puts[r.URL.Path]++
			p.mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	p.Addr = strings.TrimPrefix(p.srv.URL, "http://")
	return p
}

// Puts returns how many PUTs the object of an s3://Bucket/key URI got.
func (p *PutCounter) Puts(uri string) int {
	key := strings.TrimPrefix(uri, "s3://")
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.puts["/"+key]
}

// ReplicationLag measures, while it runs, how long a write acknowledged by
// a master takes to be readable on its replica: every 10 ms it SETs a
// counter under hash tag tag on the master and polls the replica (in
// READONLY mode) until it holds that value. That delay is the window in
// which a master that dies loses what it acknowledged.
type ReplicationLag struct {
	mu      sync.Mutex
	samples []time.Duration
	errs    int
	stop    context.CancelFunc
	done    chan struct{}
}

// StartReplicationLag starts sampling master -> replica for keys of tag.
func StartReplicationLag(master, replica, tag string) *ReplicationLag {
	ctx, cancel := context.WithCancel(context.Background())
	rl := &ReplicationLag{stop: cancel, done: make(chan struct{})}
	m := redis.NewClient(&redis.Options{Addr: master, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	r := redis.NewClient(&redis.Options{Addr: replica, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1,
		OnConnect: func(ctx context.Context, cn *redis.Conn) error { return cn.ReadOnly(ctx).Err() }})
	key := "rmsgrad-probe:{" + tag + "}"
	go func() {
		defer close(rl.done)
		defer m.Close()
		defer r.Close()
		for i := int64(1); ctx.Err() == nil; i++ {
			if err := m.Set(ctx, key, i, 0).Err(); err != nil {
				rl.fail()
				sleepOrDone(ctx, 10*time.Millisecond)
				continue
			}
			acked := time.Now()
			for ctx.Err() == nil {
				v, err := r.Get(ctx, key).Int64()
				if err == nil && v >= i {
					rl.mu.Lock()
					rl.samples = append(rl.samples, time.Since(acked))
					rl.mu.Unlock()
					break
				}
				if err != nil && err != redis.Nil {
					rl.fail()
					break
				}
				if time.Since(acked) > 5*time.Second {
					rl.fail()
					break
				}
			}
			sleepOrDone(ctx, 10*time.Millisecond)
		}
	}()
	return rl
}

func (rl *ReplicationLag) fail() {
	rl.mu.Lock()
	rl.errs++
	rl.mu.Unlock()
}

// Stop ends sampling and returns the delays measured (unsorted) and how
// many probes failed.
func (rl *ReplicationLag) Stop() ([]time.Duration, int) {
	rl.stop()
	<-rl.done
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return append([]time.Duration(nil), rl.samples...), rl.errs
}

func sleepOrDone(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
