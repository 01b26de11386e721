package jobs

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// TestPingHonoursContext: against a Redis that accepts connections and
// never answers, the client's and the worker's Ping return when their
// context ends, not after go-redis's own read timeout (3 s): the worker's
// readiness probe gives each check 2 s and must name a hung Redis then.
func TestPingHonoursContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // read nothing, answer nothing
		}
	}()
	opt := asynq.RedisClientOpt{Addr: ln.Addr().String()}
	client := NewClient(opt)
	defer client.Close()
	srv := NewServers(opt, ServersConfig{Queues: map[string]int{DefaultQueue: 1}})
	for name, ping := range map[string]func(context.Context) error{"Client": client.Ping, "Servers": srv.Ping} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		err := ping(ctx)
		took := time.Since(start)
		cancel()
		if err == nil || took > 2*time.Second {
			t.Errorf("%s.Ping against a Redis that never answers: %v after %v, want an error when its 300 ms context ends", name, err, took)
		}
	}
}
