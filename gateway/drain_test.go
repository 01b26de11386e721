package gateway_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/gateway"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
)

// TestDrain: a wait in flight on a job nobody serves answers at once with
// the job's state when the gateway drains (shutdown), instead of holding
// the server's shutdown for its whole timeout.
func TestDrain(t *testing.T) {
	r := testenv.Redis(t)
	c := jobs.NewClient(asynq.RedisClientOpt{Addr: r.Addr}, jobs.WithQueue("nobody-serves"))
	defer c.Close()
	g, err := gateway.New(gateway.Config{Client: c, MaxWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(g)
	defer ts.Close()
	resp, err := http.Post(ts.URL+"/v1/jobs?id=held", "application/json",
		strings.NewReader(`{"v":1,"x":"s3://b/k#x","w":"s3://b/k#w","dy":"s3://b/k#dy","out":"s3://b/o","eps":1e-6}`))
	if err != nil || resp.StatusCode != 202 {
		t.Fatalf("submit: %v %v", err, resp)
	}
	resp.Body.Close()
	type answer struct {
		state string
		took  time.Duration
	}
	done := make(chan answer, 1)
	start := time.Now()
	go func() {
		resp, err := http.Get(ts.URL + "/v1/jobs/held/wait?timeout=50")
		if err != nil {
			done <- answer{"error " + err.Error(), 0}
			return
		}
		defer resp.Body.Close()
		var st struct{ State string }
		_ = json.NewDecoder(resp.Body).Decode(&st)
		done <- answer{st.State, time.Since(start)}
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case a := <-done:
		t.Fatalf("the wait answered before the drain: %+v", a)
	default:
	}
	g.Drain()
	select {
	case a := <-done:
		if a.state != "pending" || a.took > 10*time.Second {
			t.Fatalf("after the drain: state %q after %v, want pending at once", a.state, a.took)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the wait did not answer within 20s of the drain")
	}
	// Waits after the drain answer at once too.
	t0 := time.Now()
	resp, err = http.Get(ts.URL + "/v1/jobs/held/wait?timeout=50")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("a wait after the drain took %v", d)
	}
}
