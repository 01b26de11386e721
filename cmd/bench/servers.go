package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rmsgrad/rmsgrad/internal/procattr"
	"github.com/rmsgrad/rmsgrad/internal/syncbuf"
)

// server is a child server process started by the harness. It mirrors
// internal/testenv, which needs a testing.TB and so cannot be used here.
type server struct {
	name string
	addr string
	dir  string
	cmd  *exec.Cmd
	log  *syncbuf.Buffer
}

// findBinary looks at the env var, then PATH, then $(go env GOPATH)/bin,
// the same order as internal/testenv and scripts/test.sh.
func findBinary(envVar, name string) (string, error) {
	if p := os.Getenv(envVar); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found (set %s, or run scripts/bench.sh which installs it)", name, envVar)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startServer runs bin with args in dir and waits until addr accepts
// connections. Pdeathsig makes the child die with the harness.
func startServer(ctx context.Context, name, bin, addr, dir string, args []string) (*server, error) {
	s := &server{name: name, addr: addr, dir: dir, log: &syncbuf.Buffer{}}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = s.log
	cmd.Stderr = s.log
	cmd.SysProcAttr = procattr.Child()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	s.cmd = cmd
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if err := ctx.Err(); err != nil {
			s.stop()
			return nil, err
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return s, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.stop()
	return nil, fmt.Errorf("%s did not listen on %s within 30s; log:\n%s", name, addr, s.log.String())
}

// stop sends SIGTERM, then SIGKILL after 5 s, and waits.
func (s *server) stop() {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// env is the pair of servers one bench run uses.
type env struct {
	redis     *server
	s3        *server
	accessKey string
	secretKey string
	s3Root    string
	tmp       string
	inproc    string // the in-process runs' compute backend: "cpu" (the default) or "cuda"
}

// benchBucket is the bucket every measurement uses.
const benchBucket = "bench"

func startEnv(ctx context.Context) (*env, error) {
	tmp, err := os.MkdirTemp("", "rmsgrad-bench-")
	if err != nil {
		return nil, err
	}
	e := &env{tmp: tmp, accessKey: "rmsgradbench", secretKey: "rmsgradbenchsecret"}
	redisBin, err := findBinary("RMSGRAD_REDIS_SERVER", "redis-server")
	if err != nil {
		return nil, err
	}
	gwBin, err := findBinary("RMSGRAD_VERSITYGW", "versitygw")
	if err != nil {
		return nil, err
	}
	rp, err := freePort()
	if err != nil {
		return nil, err
	}
	rdir := filepath.Join(tmp, "redis")
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		return nil, err
	}
	e.redis, err = startServer(ctx, "redis-server", redisBin, "127.0.0.1:"+strconv.Itoa(rp), rdir,
		[]string{"--port", strconv.Itoa(rp), "--bind", "127.0.0.1", "--dir", rdir,
			"--save", "", "--appendonly", "no", "--protected-mode", "no"})
	if err != nil {
		e.close()
		return nil, err
	}
	sp, err := freePort()
	if err != nil {
		e.close()
		return nil, err
	}
	e.s3Root = filepath.Join(tmp, "s3")
	if err := os.MkdirAll(filepath.Join(e.s3Root, benchBucket), 0o755); err != nil {
		e.close()
		return nil, err
	}
	// --keep-alive: versitygw closes every connection after one response
	// by default (Connection: close), so every request of the ceilings and
	// of the worker alike would pay a TCP dial and close, which real S3
	// services do not make clients pay. --quiet: no per-request log line on
	// stdout (the gateway's CPU is the machine's, shared with the worker).
	// RMSGRAD_BENCH_VERSITYGW_ARGS adds gateway flags for a diagnosis
	// (e.g. "--pprof 127.0.0.1:6060" or "--access-log /tmp/gw.log").
	gwArgs := []string{"--access", e.accessKey, "--secret", e.secretKey, "--port", "127.0.0.1:" + strconv.Itoa(sp),
		"--keep-alive", "--quiet"}
	gwArgs = append(gwArgs, strings.Fields(os.Getenv("RMSGRAD_BENCH_VERSITYGW_ARGS"))...)
	e.s3, err = startServer(ctx, "versitygw", gwBin, "127.0.0.1:"+strconv.Itoa(sp), e.s3Root,
		append(gwArgs, "posix", e.s3Root))
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// close stops both servers and removes their data.
func (e *env) close() {
	e.s3.stop()
	e.redis.stop()
	if e.tmp != "" {
		_ = os.RemoveAll(e.tmp)
	}
}
