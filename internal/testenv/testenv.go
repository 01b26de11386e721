// Package testenv starts the real servers that integration tests need: a
// redis-server and two independent S3 servers, a versitygw gateway and
// MinIO's own server, each on a free loopback port with its own data
// directory, stopped when the test ends.
//
// The binaries come from $RMSGRAD_REDIS_SERVER, $RMSGRAD_VERSITYGW and
// $RMSGRAD_MINIO, else from PATH and $(go env GOPATH)/bin. scripts/test.sh
// installs them; a test run without them skips with a message naming the
// missing binary, unless RMSGRAD_REQUIRE_SERVERS=1 (set by scripts/test.sh),
// which makes it fail.
package testenv

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/internal/procattr"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Binary finds a server binary: the env var, then PATH, then GOPATH/bin.
func Binary(t testing.TB, envVar, name string) string {
	t.Helper()
	if p := os.Getenv(envVar); p != "" {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	msg := fmt.Sprintf("testenv: %s not found (set %s, or run scripts/test.sh which installs it)", name, envVar)
	if os.Getenv("RMSGRAD_REQUIRE_SERVERS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// Server is a child server process.
type Server struct {
	Addr string // host:port
	Port int
	Dir  string // its data directory
	cmd  *exec.Cmd
	log  *bytes.Buffer
	args []string
	env  []string // added to the environment; nil: inherited as is
	bin  string
	t    testing.TB
	// ready, when set, says whether the server answers (beyond listening).
	ready func() bool
}

// Log returns what the server printed so far.
func (s *Server) Log() string { return s.log.String() }

// Stop stops the server (SIGTERM, then SIGKILL after 5 s) and waits.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
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

// Kill stops the server with SIGKILL and waits.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Start (re)starts a stopped server on the same port and directory.
func (s *Server) Start() {
	s.t.Helper()
	if s.cmd != nil {
		return
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.Dir
	cmd.Stdout = s.log
	cmd.Stderr = s.log
	if s.env != nil {
		cmd.Env = append(os.Environ(), s.env...)
	}
	cmd.SysProcAttr = procattr.Child()
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("testenv: start %s: %v", s.bin, err)
	}
	s.cmd = cmd
	waitPort(s.t, s.Addr, 30*time.Second, s)
}

func waitPort(t testing.TB, addr string, d time.Duration, s *Server) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			if s.ready == nil || s.ready() {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("testenv: %s did not listen on %s within %v; log:\n%s", s.bin, addr, d, s.Log())
}

func start(t testing.TB, bin string, port int, dir string, args []string, setup ...func(*Server)) *Server {
	t.Helper()
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: dir, log: &bytes.Buffer{}, args: args, bin: bin, t: t}
	for _, f := range setup {
		f(s)
	}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Redis starts a redis-server on a free port. Extra args are appended to
// the command line (e.g. "--appendonly", "yes").
func Redis(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := Binary(t, "RMSGRAD_REDIS_SERVER", "redis-server")
	port := FreePort(t)
	dir := t.TempDir()
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no"}, extra...)
	return start(t, bin, port, dir, args)
}

// S3 is a running S3 server (versitygw or MinIO) with its credentials and
// data root.
type S3 struct {
	*Server
	Kind                 string // "versitygw" or "minio"
	AccessKey, SecretKey string
	// Root is the data directory. versitygw's posix backend keeps each
	// bucket as a subdirectory and each object as a file under it; MinIO
	// keeps its own format (xl.meta per object), so only tests of
	// versitygw read objects from Root.
	Root string
}

// MultipartBytes returns the bytes the server keeps on disk for multipart
// uploads that were started and neither completed nor aborted (versitygw:
// <bucket>/.sgwtmp/multipart; MinIO: .minio.sys/multipart), and the files
// holding them: what a crashed uploader leaves behind.
func (s *S3) MultipartBytes() (bytes int64, files int, err error) {
	var dirs []string
	switch s.Kind {
	case "minio":
		dirs = []string{filepath.Join(s.Root, ".minio.sys", "multipart")}
	default:
		ents, err := os.ReadDir(s.Root)
		if err != nil {
			return 0, 0, err
		}
		for _, e := range ents {
			if e.IsDir() {
				dirs = append(dirs, filepath.Join(s.Root, e.Name(), ".sgwtmp", "multipart"))
			}
		}
	}
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(_ string, de os.DirEntry, err error) error {
			if err != nil {
				if os.IsNotExist(err) {
					return filepath.SkipDir
				}
				return err
			}
			if de.Type().IsRegular() {
				fi, err := de.Info()
				if err != nil {
					return err
				}
				bytes += fi.Size()
				files++
			}
			return nil
		})
		if err != nil && !os.IsNotExist(err) {
			return 0, 0, err
		}
	}
	return bytes, files, nil
}

// Endpoint returns host:port for minio-go.
func (s *S3) Endpoint() string { return s.Addr }

// Versitygw starts versitygw with its posix backend on a free port. Buckets
// are created by making directories under Root (or through the S3 API).
func Versitygw(t testing.TB, buckets ...string) *S3 {
	t.Helper()
	bin := Binary(t, "RMSGRAD_VERSITYGW", "versitygw")
	port := FreePort(t)
	root := t.TempDir()
	for _, b := range buckets {
		if err := os.MkdirAll(filepath.Join(root, b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ak, sk := "rmsgradtest", "rmsgradtestsecret"
	args := []string{"--access", ak, "--secret", sk, "--port", "127.0.0.1:" + strconv.Itoa(port), "posix", root}
	s := start(t, bin, port, root, args)
	return &S3{Server: s, Kind: "versitygw", AccessKey: ak, SecretKey: sk, Root: root}
}

// MinIO starts MinIO's own server (single drive) on a free port and makes
// buckets through its S3 API. extraEnv (NAME=value) goes to its
// environment, e.g. MINIO_API_STALE_UPLOADS_EXPIRY.
func MinIO(t testing.TB, buckets []string, extraEnv ...string) *S3 {
	t.Helper()
	bin := Binary(t, "RMSGRAD_MINIO", "minio")
	port := FreePort(t)
	root := t.TempDir()
	ak, sk := "rmsgradtest", "rmsgradtestsecret"
	addr := "127.0.0.1:" + strconv.Itoa(port)
	// The console (a second listener) is off; MINIO_CI_CD keeps it from
	// refusing a drive that is not a mount of its own.
	env := append([]string{"MINIO_ROOT_USER=" + ak, "MINIO_ROOT_PASSWORD=" + sk, "MINIO_BROWSER=off",
		"MINIO_UPDATE=off", "MINIO_CI_CD=1"}, extraEnv...)
	args := []string{"server", "--quiet", "--address", addr, filepath.Join(root, "data")}
	s := start(t, bin, port, root, args, func(s *Server) {
		s.env = env
		s.ready = func() bool {
			c := &http.Client{Timeout: time.Second}
			resp, err := c.Get("http://" + addr + "/minio/health/ready")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}
	})
	m := &S3{Server: s, Kind: "minio", AccessKey: ak, SecretKey: sk, Root: filepath.Join(root, "data")}
	if len(buckets) > 0 {
		if err := makeBuckets(m, buckets); err != nil {
			t.Fatalf("testenv: minio: %v\n%s", err, s.Log())
		}
	}
	return m
}

// S3Servers lists the S3 servers the storage tests run against.
var S3Servers = []string{"versitygw", "minio"}

// StartS3 starts the S3 server of kind ("versitygw" or "minio") with the
// buckets.
func StartS3(t testing.TB, kind string, buckets ...string) *S3 {
	t.Helper()
	switch kind {
	case "versitygw":
		return Versitygw(t, buckets...)
	case "minio":
		return MinIO(t, buckets)
	}
	t.Fatalf("testenv: unknown S3 server %q", kind)
	return nil
}
