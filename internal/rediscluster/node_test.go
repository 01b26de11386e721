package rediscluster

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// A node whose port another server answers on, or whose cluster bus port
// another process holds, fails to start with ErrPortTaken (which Start
// answers by choosing other ports), never by taking the other server for
// itself.
func TestNodeStartPortTaken(t *testing.T) {
	bin := os.Getenv("RMSGRAD_REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	if _, err := exec.LookPath(bin); err != nil {
		if os.Getenv("RMSGRAD_REQUIRE_SERVERS") == "1" {
			t.Fatalf("redis-server is required: %v", err)
		}
		t.Skipf("no redis-server: %v", err)
	}
	opt := Options{Server: bin, NodeTimeout: 2 * time.Second}
	ports, err := freePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	first := newNode(opt, ports[0], t.TempDir())
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	defer first.Stop()

	second := newNode(opt, ports[0], t.TempDir())
	if err := second.Start(); !errors.Is(err, ErrPortTaken) {
		second.Stop()
		t.Fatalf("a node on a port another server answers on: %v; want ErrPortTaken", err)
	}
	if second.Running() {
		t.Error("the refused node is still running")
	}

	bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(ports[1]+10000))
	if err != nil {
		t.Skipf("cluster bus port %d: %v", ports[1]+10000, err)
	}
	defer bus.Close()
	third := newNode(opt, ports[1], t.TempDir())
	if err := third.Start(); !errors.Is(err, ErrPortTaken) {
		third.Stop()
		t.Fatalf("a node whose bus port is held: %v; want ErrPortTaken", err)
	}
	if err := first.Start(); err != nil || !first.Running() {
		t.Errorf("the first node: %v", err)
	}
}
