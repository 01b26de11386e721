package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TLSFiles is a throwaway certificate authority and one server certificate
// it signed for 127.0.0.1 and localhost, written as PEM files into a test
// directory. Servers get CertFile and KeyFile; clients trust CAFile (or
// Pool).
type TLSFiles struct {
	CAFile   string // the CA certificate (PEM): what a client's ca_file names
	CertFile string // the server certificate (PEM)
	KeyFile  string // the server's private key (PEM, PKCS#8)
	Pool     *x509.CertPool
}

// ClientConfig returns a TLS client configuration that trusts only the
// test CA.
func (f *TLSFiles) ClientConfig() *tls.Config {
	return &tls.Config{RootCAs: f.Pool, MinVersion: tls.VersionTLS12}
}

// NewTLS generates a CA and a server certificate (ECDSA P-256, valid for an
// hour, SANs 127.0.0.1, ::1 and localhost) with crypto/x509.
func NewTLS(t testing.TB) *TLSFiles {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testenv: CA key: %v", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "rmsgrad test CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("testenv: CA certificate: %v", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testenv: server key: %v", err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		DNSNames:     []string{"localhost"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("testenv: server certificate: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	f := &TLSFiles{
		CAFile:   write("ca.pem", "CERTIFICATE", caDER),
		CertFile: write("server.pem", "CERTIFICATE", srvDER),
		KeyFile:  write("server.key", "PRIVATE KEY", keyDER),
		Pool:     x509.NewCertPool(),
	}
	f.Pool.AddCert(ca)
	return f
}

// RedisTLS starts a redis-server that listens only for TLS (--port 0
// --tls-port P), with f's server certificate and without client
// certificates. Clients connect with rediss://127.0.0.1:P and trust f's CA.
// It fails the test with the server's log if redis-server was built without
// TLS.
func RedisTLS(t testing.TB, f *TLSFiles, extra ...string) *Server {
	t.Helper()
	bin := Binary(t, "RMSGRAD_REDIS_SERVER", "redis-server")
	dir := t.TempDir()
	s := start(t, bin, dir, func(port int) []string {
		return append([]string{"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--tls-cert-file", f.CertFile, "--tls-key-file", f.KeyFile, "--tls-ca-cert-file", f.CAFile,
			"--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--protected-mode", "no"}, extra...)
	})
	// A TCP connect is not a TLS handshake: prove the port speaks TLS with
	// this CA before the test relies on it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", s.Addr, f.ClientConfig())
		if err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: redis-server on %s does not complete a TLS handshake: %v; log:\n%s", s.Addr, err, s.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// VersitygwOptions configure VersitygwWith.
type VersitygwOptions struct {
	AccessKey, SecretKey string    // default: fixed test keys
	TLS                  *TLSFiles // when set, serve HTTPS with its server certificate
}

// VersitygwTLS starts versitygw like Versitygw, serving HTTPS with f's
// server certificate (--cert, --key).
func VersitygwTLS(t testing.TB, f *TLSFiles, buckets ...string) *S3 {
	t.Helper()
	return VersitygwWith(t, VersitygwOptions{TLS: f}, buckets...)
}

// VersitygwWith starts versitygw with its posix backend on a free port,
// with the given root credentials and, optionally, TLS.
func VersitygwWith(t testing.TB, o VersitygwOptions, buckets ...string) *S3 {
	t.Helper()
	bin := Binary(t, "RMSGRAD_VERSITYGW", "versitygw")
	root := t.TempDir()
	for _, b := range buckets {
		if err := os.MkdirAll(filepath.Join(root, b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if o.AccessKey == "" {
		o.AccessKey, o.SecretKey = "rmsgradtlstest", "rmsgradtlstestsecret"
	}
	s := start(t, bin, root, func(port int) []string {
		args := []string{"--access", o.AccessKey, "--secret", o.SecretKey, "--port", "127.0.0.1:" + strconv.Itoa(port)}
		if o.TLS != nil {
			args = append(args, "--cert", o.TLS.CertFile, "--key", o.TLS.KeyFile)
		}
		return append(args, "posix", root)
	})
	return &S3{Server: s, AccessKey: o.AccessKey, SecretKey: o.SecretKey, Root: root}
}
