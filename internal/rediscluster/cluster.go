// Package rediscluster starts a real local Redis Cluster for tests and
// benchmarks: redis-server processes with --cluster-enabled yes on free
// loopback ports, joined by `redis-cli --cluster create`, each with its own
// data directory. It reads the cluster's view of itself (CLUSTER NODES) so
// that a test can kill a master and wait for its replica to take over.
//
// internal/testenv wraps it for tests (testenv.RedisCluster); cmd/bench
// uses it directly.
package rediscluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rmsgrad/rmsgrad/internal/procattr"
	"github.com/rmsgrad/rmsgrad/internal/syncbuf"
)

// Options says what to start. Zero fields take the values noted.
type Options struct {
	Server   string // redis-server binary (required)
	CLI      string // redis-cli binary (required)
	Dir      string // parent of the nodes' data directories (required)
	Masters  int    // default 3
	Replicas int    // replicas per master; 0 is allowed
	// NodeTimeout is cluster-node-timeout: how long a master may not
	// answer before the others mark it failed and its replica takes over.
	// Default 2 s (Redis's own default is 15 s).
	NodeTimeout time.Duration
	// Extra arguments for every redis-server (e.g. "--appendonly", "yes").
	Extra []string
	// Password, when set, is every node's requirepass (and masterauth, so
	// replicas sync).
	Password string
	// TLS, when set, makes every node speak TLS only: clients, the cluster
	// bus and replication.
	TLS *TLS
}

// TLS is a cluster's TLS material.
type TLS struct {
	CertFile, KeyFile, CAFile string
	Client                    *tls.Config // what Do and the health checks dial with
}

// Node is one redis-server of the cluster.
type Node struct {
	Addr string // 127.0.0.1:port
	Port int
	Dir  string
	bin  string
	args []string

	password string
	tls      *tls.Config

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited (its Wait returned)
	log  *syncbuf.Buffer
}

// Cluster is a running cluster. Nodes are in creation order: the first
// Masters of them were created as masters; which replica follows which
// master, and who is master after a failover, is what Topology reports.
type Cluster struct {
	Nodes []*Node
	opt   Options
}

// Start starts the nodes, joins them into a cluster and waits until every
// node reports cluster_state:ok and every replica is in sync.
func Start(ctx context.Context, opt Options) (*Cluster, error) {
	if opt.Server == "" || opt.CLI == "" || opt.Dir == "" {
		return nil, errors.New("rediscluster: Server, CLI and Dir are required")
	}
	if opt.Masters == 0 {
		opt.Masters = 3
	}
	// The ports are free when chosen and taken by the nodes moments later;
	// another process (a test's server elsewhere on the machine) may take
	// one in between. Node.Start sees that (ErrPortTaken): start again on
	// other ports.
	for attempt := 1; ; attempt++ {
		c, err := start(ctx, opt)
		if err == nil || !errors.Is(err, ErrPortTaken) || attempt == 5 {
			return c, err
		}
		for i := range opt.Masters * (1 + opt.Replicas) {
			os.RemoveAll(filepath.Join(opt.Dir, fmt.Sprintf("node-%d", i)))
		}
	}
}

// ErrPortTaken is Node.Start's error when another process answers on the
// node's port (or holds its cluster bus port, so the node exits).
var ErrPortTaken = errors.New("rediscluster: the node's port is taken by another process")

func start(ctx context.Context, opt Options) (*Cluster, error) {
	if opt.NodeTimeout == 0 {
		opt.NodeTimeout = 2 * time.Second
	}
	c := &Cluster{opt: opt}
	n := opt.Masters * (1 + opt.Replicas)
	ports, err := freePorts(n)
	if err != nil {
		return nil, err
	}
	for i, port := range ports {
		dir := filepath.Join(opt.Dir, fmt.Sprintf("node-%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		nd := newNode(opt, port, dir)
		c.Nodes = append(c.Nodes, nd)
		if err := nd.Start(); err != nil {
			c.Close()
			return nil, err
		}
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(opt.Replicas), "--cluster-yes")
	if opt.TLS != nil {
		args = append(args, "--tls", "--cacert", opt.TLS.CAFile)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, opt.CLI, args...)
	if opt.Password != "" {
		cmd.Env = append(os.Environ(), "REDISCLI_AUTH="+opt.Password) // not on the command line
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		c.Close()
		return nil, fmt.Errorf("rediscluster: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.WaitHealthy(ctx, time.Minute); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// newNode is the node of a cluster started with opt, on port, its data in
// dir (not started).
func newNode(opt Options, port int, dir string) *Node {
	args := []string{"--port", strconv.Itoa(port)}
	if opt.TLS != nil {
		args = []string{"--port", "0", "--tls-port", strconv.Itoa(port), "--tls-cluster", "yes", "--tls-replication", "yes",
			"--tls-cert-file", opt.TLS.CertFile, "--tls-key-file", opt.TLS.KeyFile, "--tls-ca-cert-file", opt.TLS.CAFile,
			"--tls-auth-clients", "no"}
	}
	if opt.Password != "" {
		args = append(args, "--requirepass", opt.Password, "--masterauth", opt.Password)
	}
	args = append(args, "--bind", "127.0.0.1", "--dir", dir,
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.Itoa(int(opt.NodeTimeout/time.Millisecond)),
		"--save", "", "--appendonly", "no", "--protected-mode", "no")
	args = append(args, opt.Extra...)
	nd := &Node{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: dir, bin: opt.Server, args: args, log: &syncbuf.Buffer{},
		password: opt.Password}
	if opt.TLS != nil {
		nd.tls = opt.TLS.Client
	}
	return nd
}

// Addrs returns every node's address (masters and replicas), the seed list
// a cluster client takes.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, n := range c.Nodes {
		a = append(a, n.Addr)
	}
	return a
}

// Node returns the node listening on addr, or nil.
func (c *Cluster) Node(addr string) *Node {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// Close stops every node (SIGTERM, then SIGKILL after 5 s).
func (c *Cluster) Close() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		wg.Go(n.Stop)
	}
	wg.Wait()
}

// NodeInfo is one line of CLUSTER NODES.
type NodeInfo struct {
	ID       string
	Addr     string // host:port
	Master   bool
	MasterID string   // a replica's master
	Flags    []string // myself, master, slave, fail?, fail, ...
	Slots    [][2]int // a master's slot ranges, inclusive
	Up       bool     // link-state connected and not flagged fail
}

// Failed reports whether the cluster has agreed the node is down (fail),
// or the answering node suspects it (fail?).
func (n NodeInfo) Failed() bool {
	return slices.Contains(n.Flags, "fail") || slices.Contains(n.Flags, "fail?")
}

// HasSlot reports whether the node serves slot.
func (n NodeInfo) HasSlot(slot int) bool {
	for _, r := range n.Slots {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

// Topology returns CLUSTER NODES as seen by the first running node that
// answers.
func (c *Cluster) Topology(ctx context.Context) ([]NodeInfo, error) {
	var lastErr error
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		s, err := n.Do(ctx, "CLUSTER", "NODES")
		if err != nil {
			lastErr = err
			continue
		}
		return ParseNodes(fmt.Sprint(s))
	}
	return nil, fmt.Errorf("rediscluster: no node answered CLUSTER NODES: %v", lastErr)
}

// ParseNodes parses the text of CLUSTER NODES.
func ParseNodes(text string) ([]NodeInfo, error) {
	var out []NodeInfo
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("rediscluster: CLUSTER NODES line %q: want at least 8 fields", line)
		}
		addr, _, _ := strings.Cut(f[1], "@") // ip:port@cport[,hostname]
		ni := NodeInfo{ID: f[0], Addr: addr, Flags: strings.Split(f[2], ","), Up: f[7] == "connected"}
		ni.Master = slices.Contains(ni.Flags, "master")
		if f[3] != "-" {
			ni.MasterID = f[3]
		}
		if ni.Failed() {
			ni.Up = false
		}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") { // a slot being migrated
				continue
			}
			lo, hi, ok := strings.Cut(s, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("rediscluster: CLUSTER NODES slot range %q", s)
			}
			ni.Slots = append(ni.Slots, [2]int{a, b})
		}
		out = append(out, ni)
	}
	return out, nil
}

// MasterOf returns the node that serves slot as master now.
func (c *Cluster) MasterOf(ctx context.Context, slot int) (*Node, error) {
	top, err := c.Topology(ctx)
	if err != nil {
		return nil, err
	}
	for _, ni := range top {
		if ni.Master && !ni.Failed() && ni.HasSlot(slot) {
			if n := c.Node(ni.Addr); n != nil {
				return n, nil
			}
		}
	}
	return nil, fmt.Errorf("rediscluster: no master serves slot %d", slot)
}

// ReplicasOf returns the running replicas of the master at addr.
func (c *Cluster) ReplicasOf(ctx context.Context, addr string) ([]*Node, error) {
	top, err := c.Topology(ctx)
	if err != nil {
		return nil, err
	}
	id := ""
	for _, ni := range top {
		if ni.Addr == addr {
			id = ni.ID
		}
	}
	var out []*Node
	for _, ni := range top {
		if id != "" && ni.MasterID == id && !ni.Failed() {
			if n := c.Node(ni.Addr); n != nil && n.Running() {
				out = append(out, n)
			}
		}
	}
	return out, nil
}

// WaitHealthy waits until every running node reports cluster_state:ok with
// all 16384 slots assigned, and every running replica's link to its master
// is up.
func (c *Cluster) WaitHealthy(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	var why string
	for {
		why = c.unhealthy(ctx)
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("rediscluster: not healthy after %v: %s", d, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Cluster) unhealthy(ctx context.Context) string {
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		info, err := n.Do(ctx, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Sprintf("%s: %v", n.Addr, err)
		}
		s := fmt.Sprint(info)
		if !strings.Contains(s, "cluster_state:ok") || !strings.Contains(s, "cluster_slots_ok:16384") {
			return fmt.Sprintf("%s: %s", n.Addr, strings.ReplaceAll(strings.TrimSpace(s), "\r\n", " "))
		}
		repl, err := n.Do(ctx, "INFO", "replication")
		if err != nil {
			return fmt.Sprintf("%s: %v", n.Addr, err)
		}
		r := fmt.Sprint(repl)
		if strings.Contains(r, "role:slave") && !strings.Contains(r, "master_link_status:up") {
			return fmt.Sprintf("%s: replica link not up", n.Addr)
		}
		if strings.Contains(r, "role:slave") && strings.Contains(r, "master_sync_in_progress:1") {
			return fmt.Sprintf("%s: replica still syncing", n.Addr)
		}
	}
	return ""
}

// WaitPromoted waits until the node at addr (a killed master) is flagged
// fail by the others and its slots are served by another master, and
// returns that master.
func (c *Cluster) WaitPromoted(ctx context.Context, addr string, slot int, d time.Duration) (*Node, error) {
	deadline := time.Now().Add(d)
	for {
		n, err := c.MasterOf(ctx, slot)
		if err == nil && n.Addr != addr && n.Running() {
			return n, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("rediscluster: slot %d not served by a new master %v after the kill of %s (last: %v)", slot, d, addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Start starts (or restarts, with the same port and data directory) the
// node and waits until it accepts connections.
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return nil
	}
	cmd := exec.Command(n.bin, n.args...)
	cmd.Dir = n.Dir
	cmd.Stdout, cmd.Stderr = n.log, n.log
	cmd.SysProcAttr = procattr.Child()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("rediscluster: start %s: %w", n.bin, err)
	}
	n.cmd = cmd
	n.done = make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(n.done)
	// Ready when the server on the port is this process: its INFO names
	// our pid. Another process there (the port was taken after it was
	// chosen), or ours exiting (a port it could not bind), is ErrPortTaken.
	pid := fmt.Sprintf("process_id:%d\r\n", cmd.Process.Pid)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-n.done:
			n.cmd = nil
			log := n.log.String()
			if strings.Contains(log, "Address already in use") {
				return fmt.Errorf("%w: %s exited at start on %s; log:\n%s", ErrPortTaken, n.bin, n.Addr, log)
			}
			return fmt.Errorf("rediscluster: %s exited at start on %s; log:\n%s", n.bin, n.Addr, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := n.Do(ctx, "INFO", "server")
		cancel()
		if err == nil {
			if str, ok := info.(string); ok && strings.Contains(str, pid) {
				return nil
			}
			_ = cmd.Process.Kill()
			<-n.done
			n.cmd = nil
			return fmt.Errorf("%w: another server answers on %s", ErrPortTaken, n.Addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("rediscluster: %s did not answer on %s within 30s; log:\n%s", n.bin, n.Addr, n.log.String())
}

// Kill sends SIGKILL and waits for the process to end.
func (n *Node) Kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.done
	n.cmd = nil
}

// Stop sends SIGTERM, then SIGKILL after 5 s, and waits.
func (n *Node) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(5 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
	n.cmd = nil
}

// Pause stops the process with SIGSTOP: it keeps its sockets but answers
// nothing, as a host cut off by the network does. Resume undoes it.
func (n *Node) Pause() error { return n.signal(syscall.SIGSTOP) }

// Resume continues a paused node (SIGCONT).
func (n *Node) Resume() error { return n.signal(syscall.SIGCONT) }

func (n *Node) signal(s syscall.Signal) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return fmt.Errorf("rediscluster: %s is not running", n.Addr)
	}
	return n.cmd.Process.Signal(s)
}

// Running reports whether the process was started and not stopped.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

// PID returns the process id, or 0 when stopped.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Log returns what the server printed so far.
func (n *Node) Log() string { return n.log.String() }

// Do runs one command on the node over a fresh connection (no cluster
// redirection) and returns its reply.
func (n *Node) Do(ctx context.Context, args ...any) (any, error) {
	var tc *tls.Config
	if n.tls != nil {
		tc = n.tls.Clone()
	}
	cl := redis.NewClient(&redis.Options{Addr: n.Addr, Password: n.password, TLSConfig: tc, DialTimeout: time.Second,
		ReadTimeout: 5 * time.Second, MaxRetries: -1, PoolSize: 1, Protocol: 2})
	defer cl.Close()
	return cl.Do(ctx, args...).Result()
}

// freePorts returns n distinct loopback ports, each with port+10000 (its
// cluster bus port) free as well.
func freePorts(n int) ([]int, error) {
	var out []int
	var hold []net.Listener
	defer func() {
		for _, l := range hold {
			l.Close()
		}
	}()
	for tries := 0; len(out) < n; tries++ {
		if tries > 1000 {
			return nil, errors.New("rediscluster: no free port pairs (port, port+10000)")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("rediscluster: free port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		if p+10000 > 65535 {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		if err != nil {
			l.Close()
			continue
		}
		hold = append(hold, l, bus)
		out = append(out, p)
	}
	return out, nil
}
