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
	"errors"
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
	// done is closed when the running process has exited (one goroutine
	// waits for it); exitErr is then Wait's error.
	done    chan struct{}
	exitErr error
}

// Log returns what the server printed so far.
func (s *Server) Log() string { return s.log.String() }

// Stop stops the server (SIGTERM, then SIGKILL after 5 s) and waits.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// Kill stops the server with SIGKILL and waits.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Start (re)starts a stopped server on the same port and directory.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.launch(); err != nil {
		s.t.Fatal(err)
	}
}

// errPortTaken: the server's port was taken by another process between
// FreePort and the server's bind.
var errPortTaken = errors.New("port taken by another process")

// launch starts the process and waits until it serves on its port; an
// error wraps errPortTaken when the port turned out to be another
// process's.
func (s *Server) launch() error {
	if s.cmd != nil {
		return nil
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
		return fmt.Errorf("testenv: start %s: %w", s.bin, err)
	}
	s.cmd = cmd
	done := make(chan struct{})
	s.done = done
	go func() { s.exitErr = cmd.Wait(); close(done) }()
	return s.waitReady(30 * time.Second)
}

// waitReady waits until the server's own process listens on its port and
// answers (ready). A port that answers while the listening socket belongs
// to another process, or a server that exits saying the address is in use,
// is errPortTaken (the server is stopped then).
func (s *Server) waitReady(d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			s.cmd = nil
			err := fmt.Errorf("testenv: %s exited before serving on %s (%v); log:\n%s", s.bin, s.Addr, s.exitErr, s.Log())
			if strings.Contains(strings.ToLower(s.Log()), "address already in use") {
				return fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		default:
		}
		c, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			if owned, known := listenerOwnedBy(s.cmd.Process.Pid, s.Port); known && !owned {
				// Not ours yet, or not ours at all: ours exits when its
				// bind fails, and is given until the deadline otherwise.
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if s.ready == nil || s.ready() {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	owned, known := listenerOwnedBy(s.cmd.Process.Pid, s.Port)
	s.Kill()
	if known && !owned {
		return fmt.Errorf("%w: %s: another process listens on %s; log:\n%s", errPortTaken, s.bin, s.Addr, s.Log())
	}
	return fmt.Errorf("testenv: %s did not serve on %s within %v; log:\n%s", s.bin, s.Addr, d, s.Log())
}

// listenerOwnedBy reports whether the socket listening on TCP port port
// is one of process pid's open files; known is false where /proc cannot
// tell (not Linux, or no listener seen), and the dial alone is trusted. A
// process whose open files cannot be read owns nothing.
func listenerOwnedBy(pid, port int) (owned, known bool) {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fs := strings.Fields(line)
			if len(fs) < 10 || fs[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fs[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && int(p) == port {
				inodes["socket:["+fs[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return false, false
	}
	fds, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return false, true // exited (a zombie has no open files) or not ours to read
	}
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd.Name()); err == nil && inodes[l] {
			return true, true
		}
	}
	return false, true
}

// pickPort chooses the port of a server start (FreePort; tests of start
// replace it).
var pickPort = FreePort

// start starts bin in dir on a free port with argsFor(port) as its command
// line, and stops it when the test ends. A port taken by another process
// between FreePort and the server's bind makes it start again on another
// port, up to 5 times.
func start(t testing.TB, bin, dir string, argsFor func(port int) []string, setup ...func(*Server)) *Server {
	t.Helper()
	var err error
	for range 5 {
		port := pickPort(t)
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: dir, log: &bytes.Buffer{}, args: argsFor(port), bin: bin, t: t}
		for _, f := range setup {
			f(s)
		}
		if err = s.launch(); err == nil {
			t.Cleanup(s.Stop)
			return s
		}
		if !errors.Is(err, errPortTaken) {
			break
		}
		t.Logf("testenv: %v; starting %s on another port", err, bin)
	}
	t.Fatal(err)
	return nil
}

// Redis starts a redis-server on a free port. Extra args are appended to
// the command line (e.g. "--appendonly", "yes").
func Redis(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := Binary(t, "RMSGRAD_REDIS_SERVER", "redis-server")
	dir := t.TempDir()
	return start(t, bin, dir, func(port int) []string {
		return append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--protected-mode", "no"}, extra...)
	})
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
	root := t.TempDir()
	for _, b := range buckets {
		if err := os.MkdirAll(filepath.Join(root, b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ak, sk := "rmsgradtest", "rmsgradtestsecret"
	s := start(t, bin, root, func(port int) []string {
		return []string{"--access", ak, "--secret", sk, "--port", "127.0.0.1:" + strconv.Itoa(port), "posix", root}
	})
	return &S3{Server: s, Kind: "versitygw", AccessKey: ak, SecretKey: sk, Root: root}
}

// MinIO starts MinIO's own server (single drive) on a free port and makes
// buckets through its S3 API. extraEnv (NAME=value) goes to its
// environment, e.g. MINIO_API_STALE_UPLOADS_EXPIRY.
func MinIO(t testing.TB, buckets []string, extraEnv ...string) *S3 {
	t.Helper()
	bin := Binary(t, "RMSGRAD_MINIO", "minio")
	root := t.TempDir()
	ak, sk := "rmsgradtest", "rmsgradtestsecret"
	// The console (a second listener) is off; MINIO_CI_CD keeps it from
	// refusing a drive that is not a mount of its own.
	env := append([]string{"MINIO_ROOT_USER=" + ak, "MINIO_ROOT_PASSWORD=" + sk, "MINIO_BROWSER=off",
		"MINIO_UPDATE=off", "MINIO_CI_CD=1"}, extraEnv...)
	s := start(t, bin, root, func(port int) []string {
		return []string{"server", "--quiet", "--address", "127.0.0.1:" + strconv.Itoa(port), filepath.Join(root, "data")}
	}, func(s *Server) {
		s.env = env
		s.ready = func() bool {
			c := &http.Client{Timeout: time.Second}
			resp, err := c.Get("http://" + s.Addr + "/minio/health/ready")
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
