package testenv

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RedisConn is a bare RESP connection for test set-up (ACL SETUSER,
// CONFIG SET, SENTINEL queries), so tests need no Redis client library of
// their own.
type RedisConn struct {
	c net.Conn
	r *bufio.Reader
}

// DialRedis connects to addr, over TLS when tlsCfg is not nil.
func DialRedis(addr string, tlsCfg *tls.Config) (*RedisConn, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	var c net.Conn
	var err error
	if tlsCfg != nil {
		c, err = tls.DialWithDialer(d, "tcp", addr, tlsCfg)
	} else {
		c, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	return &RedisConn{c: c, r: bufio.NewReader(c)}, nil
}

// Close closes the connection.
func (c *RedisConn) Close() error { return c.c.Close() }

// Do sends one command and returns its reply: a string (simple or bulk), an
// int64, nil (null), or a []any; an error reply is returned as an error.
func (c *RedisConn) Do(args ...string) (any, error) {
	_ = c.c.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c.c, b.String()); err != nil {
		return nil, err
	}
	return c.reply()
}

func (c *RedisConn) reply() (any, error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty RESP line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, errors.New(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = c.reply(); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected RESP line %q", line)
}

// RedisDo runs one command on a fresh connection to s (plain TCP), first
// authenticating with auth (password, or username and password) when given.
func RedisDo(t testing.TB, s *Server, auth []string, args ...string) any {
	t.Helper()
	c, err := DialRedis(s.Addr, nil)
	if err != nil {
		t.Fatalf("testenv: dial redis %s: %v", s.Addr, err)
	}
	defer c.Close()
	if len(auth) > 0 {
		if _, err := c.Do(append([]string{"AUTH"}, auth...)...); err != nil {
			t.Fatalf("testenv: AUTH: %v", err)
		}
	}
	v, err := c.Do(args...)
	if err != nil {
		t.Fatalf("testenv: redis %s: %v", args[0], err)
	}
	return v
}

// Sentinel starts redis-server --sentinel on a free port monitoring master
// under the name masterName (quorum 1; failover timers long enough that it
// never fails over during a test), and waits until it reports the master.
// masterAuth, when given, is the password the sentinel uses on the master.
func Sentinel(t testing.TB, master *Server, masterName, masterAuth string) *Server {
	t.Helper()
	bin := Binary(t, "RMSGRAD_REDIS_SERVER", "redis-server")
	dir := t.TempDir()
	// Sentinel rewrites its config file, so it lives in the data directory.
	path := filepath.Join(dir, "sentinel.conf")
	s := start(t, bin, dir, func(port int) []string {
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nprotected-mode no\n"+
			"sentinel monitor %s 127.0.0.1 %d 1\n"+
			"sentinel down-after-milliseconds %s 60000\n"+
			"sentinel failover-timeout %s 180000\n",
			port, dir, masterName, master.Port, masterName, masterName)
		if masterAuth != "" {
			conf += fmt.Sprintf("sentinel auth-pass %s %s\n", masterName, masterAuth)
		}
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{path, "--sentinel"}
	})
	want := master.Addr
	deadline := time.Now().Add(15 * time.Second)
	for {
		v := RedisDo(t, s, nil, "SENTINEL", "get-master-addr-by-name", masterName)
		if a, ok := v.([]any); ok && len(a) == 2 && fmt.Sprint(a[0])+":"+fmt.Sprint(a[1]) == want {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: sentinel on %s reports master %v, want %s; log:\n%s", s.Addr, v, want, s.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
