package testenv

import (
	"crypto/tls"
	"net/http"
	"testing"
	"time"
)

// TestRedisTLS: the Debian redis-server speaks TLS with the generated
// certificate, and refuses a client that does not trust the test CA.
func TestRedisTLS(t *testing.T) {
	f := NewTLS(t)
	s := RedisTLS(t, f)
	c, err := DialRedis(s.Addr, f.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v, err := c.Do("PING"); err != nil || v != "PONG" {
		t.Fatalf("PING over TLS: %v %v", v, err)
	}
	if _, err := DialRedis(s.Addr, &tls.Config{MinVersion: tls.VersionTLS12}); err == nil {
		t.Fatal("a client without the test CA completed the handshake")
	}
}

// TestSentinel: a sentinel reports the master it monitors.
func TestSentinel(t *testing.T) {
	m := Redis(t)
	s := Sentinel(t, m, "tm", "")
	v := RedisDo(t, s, nil, "SENTINEL", "get-master-addr-by-name", "tm")
	if a, ok := v.([]any); !ok || len(a) != 2 || a[1] != m.Addr[len("127.0.0.1:"):] {
		t.Fatalf("sentinel master: %v", v)
	}
}

// TestVersitygwTLS: versitygw serves HTTPS with the generated certificate.
func TestVersitygwTLS(t *testing.T) {
	f := NewTLS(t)
	s := VersitygwTLS(t, f, "b")
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: f.ClientConfig()}}
	resp, err := cl.Get("https://" + s.Addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == 0 {
		t.Fatal("no answer")
	}
	if _, err := http.Get("https://" + s.Addr + "/"); err == nil {
		t.Fatal("the system roots accepted the test CA's certificate")
	}
}
