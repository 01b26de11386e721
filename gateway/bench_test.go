package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/gateway"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
)

// BenchmarkBatchSubmit posts batches of 500 jobs, two requests at once, to
// an in-process gateway on a real redis-server; b.N counts jobs. cmd/bench's gateway section
// compares the built gateway with jobs.Client.Enqueue.
func BenchmarkBatchSubmit(b *testing.B) {
	r := testenv.Redis(b)
	ropt := asynq.RedisClientOpt{Addr: r.Addr}
	c := jobs.NewClient(ropt)
	defer c.Close()
	root := b.TempDir()
	fs, _ := file.New(root)
	st := storage.NewRouter()
	st.Register("file", fs)
	g, err := gateway.New(gateway.Config{Client: c, Store: st})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(g)
	defer ts.Close()
	insp := asynq.NewInspector(ropt)
	defer insp.Close()
	const per = 500
	body := func(n, run int) []byte {
		type item struct {
			ID  string   `json:"id"`
			Job jobs.Job `json:"job"`
		}
		var items []item
		for k := range n {
			in := fmt.Sprintf("file://%s/in/%07d.safetensors", root, k)
			items = append(items, item{fmt.Sprintf("r%d-%07d", run, k), jobs.Job{V: 1, X: in + "#x", W: in + "#w", DY: in + "#dy", Out: in + ".out", Eps: 1e-6}})
		}
		bb, _ := json.Marshal(map[string]any{"jobs": items})
		return bb
	}
	var bodies [][]byte
	for i := 0; i < b.N; i += per {
		bodies = append(bodies, body(min(per, b.N-i), i))
	}
	next := make(chan []byte, len(bodies))
	for _, bb := range bodies {
		next <- bb
	}
	close(next)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 2 { // two requests at once, as cmd/bench's gateway section
		wg.Go(func() {
			for bb := range next {
				resp, err := http.Post(ts.URL+"/v1/jobs/batch", "application/json", bytes.NewReader(bb))
				if err != nil || resp.StatusCode != 200 {
					b.Error(err, resp)
					return
				}
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

// BenchmarkEnqueueDirect is BatchSubmit's baseline: the same jobs through
// jobs.Client.Enqueue from 64 goroutines on a real redis-server; b.N
// counts jobs.
func BenchmarkEnqueueDirect(b *testing.B) {
	r := testenv.Redis(b)
	c := jobs.NewClient(asynq.RedisClientOpt{Addr: r.Addr})
	defer c.Close()
	root := b.TempDir()
	next := make(chan int, b.N)
	for i := range b.N {
		next <- i
	}
	close(next)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for k := range next {
				in := fmt.Sprintf("file://%s/in/%07d.safetensors", root, k)
				j := jobs.Job{V: 1, X: in + "#x", W: in + "#w", DY: in + "#dy", Out: in + ".out", Eps: 1e-6}
				if _, err := c.Enqueue(context.Background(), j, asynq.TaskID(fmt.Sprintf("d-%07d", k))); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
