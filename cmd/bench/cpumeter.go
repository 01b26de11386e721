package main

import (
	"runtime"
	"time"
)

// cpuSnap is the CPU the bench's servers and the machine have used up to
// one moment, for splitting a run's CPU between the worker, versitygw and
// redis-server, and for telling whether the machine's cores were the
// bound (busy close to runtime.NumCPU()).
type cpuSnap struct {
	at         time.Time
	gw, redis  time.Duration // user+sys CPU of versitygw and redis-server (0 when unreadable)
	busy       float64       // the machine's busy CPU seconds (/proc/stat)
	gwOK, rsOK bool
}

// serverCPU is what the servers and the machine used between two snapshots.
type serverCPU struct {
	GW, Redis time.Duration // CPU used by versitygw and redis-server
	Busy      float64       // the machine's average busy cores over the interval
	Cores     int
	OK        bool // both servers' CPU was readable
}

// snapServers reads the servers' CPU and the machine's busy time.
func (e *env) snapServers() cpuSnap {
	s := cpuSnap{at: time.Now(), busy: machineBusy()}
	if pid := e.s3.pid(); pid > 0 {
		if d, err := procCPU(pid); err == nil {
			s.gw, s.gwOK = d, true
		}
	}
	if pid := e.redis.pid(); pid > 0 {
		if d, err := procCPU(pid); err == nil {
			s.redis, s.rsOK = d, true
		}
	}
	return s
}

// since is what was used from s0 to s.
func (s cpuSnap) since(s0 cpuSnap) serverCPU {
	c := serverCPU{GW: s.gw - s0.gw, Redis: s.redis - s0.redis, Cores: runtime.NumCPU(),
		OK: s.gwOK && s0.gwOK && s.rsOK && s0.rsOK}
	if el := s.at.Sub(s0.at).Seconds(); el > 0 {
		c.Busy = (s.busy - s0.busy) / el
	}
	return c
}

// pid is the server's process ID, 0 when it is not running.
func (s *server) pid() int {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// perOp is d per n operations, in microseconds.
func perOp(d time.Duration, n int) float64 {
	if n <= 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / 1e3 / float64(n)
}
