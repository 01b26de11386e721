package main

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
)

// overheadMethod explains analyzeCPUProfile in the report.
const overheadMethod = "per-job overhead method: the in-process small run's CPU profile (runtime/pprof, 100 Hz, user+sys time " +
	"of every goroutine) is split by stack: **compute** = any frame under compute.(*CommandBuffer).Commit or the cpu " +
	"backend's kernel goroutines; **network** = any frame in the S3 client (storage/s3 and minio-go), net/http, net, crypto/tls, golang.org/x/net, go-redis, " +
	"syscall, internal/poll or the runtime's netpoller (the kernel's time in a syscall is charged to its syscall frame, so " +
	"it falls here); **overhead** = every other sample: rmsgrad's own code (handler, batcher, router, codec, buffers, sha256 of the outputs, logs, " +
	"metrics), asynq's own code, and the Go runtime's GC and scheduler (which the allocations and goroutines cause). " +
	"Overhead per job = overhead CPU time / jobs."

// profileSplit is a CPU profile's time by category, in nanoseconds.
type profileSplit struct {
	Jobs     int
	Total    int64
	Compute  int64
	Network  int64
	Rmsgrad  int64
	Asynq    int64
	Runtime  int64
	Other    int64
	flatOver map[string]int64 // leaf function -> ns, overhead samples only
}

// OverheadPerJob is everything but network and compute, in us per job.
func (p profileSplit) OverheadPerJob() float64 {
	return float64(p.Total-p.Compute-p.Network) / 1e3 / float64(p.Jobs)
}

// TotalPerJob is the profile's whole CPU time per job, in us.
func (p profileSplit) TotalPerJob() float64 { return float64(p.Total) / 1e3 / float64(p.Jobs) }

func (p profileSplit) us(ns int64) float64 { return float64(ns) / 1e3 / float64(p.Jobs) }

// Breakdown names each category's us per job.
func (p profileSplit) Breakdown() string {
	return fmt.Sprintf("network %.0f, compute %.0f; overhead = rmsgrad %.0f + asynq %.0f + Go runtime %.0f + other %.0f",
		p.us(p.Network), p.us(p.Compute), p.us(p.Rmsgrad), p.us(p.Asynq), p.us(p.Runtime), p.us(p.Other))
}

// Top lists the n leaf functions costing the most overhead.
func (p profileSplit) Top(n int) string {
	type kv struct {
		k string
		v int64
	}
	var all []kv
	for k, v := range p.flatOver {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v })
	var parts []string
	for i := 0; i < len(all) && i < n; i++ {
		parts = append(parts, fmt.Sprintf("%s %.1f", strings.TrimPrefix(all[i].k, "github.com/rmsgrad/rmsgrad/"), p.us(all[i].v)))
	}
	return strings.Join(parts, "; ")
}

var (
	computeFrames = []string{
		"github.com/rmsgrad/rmsgrad/compute.(*CommandBuffer).Commit",
		"github.com/rmsgrad/rmsgrad/compute/cpu.(*plan).run",
		"github.com/rmsgrad/rmsgrad/compute/cpu.(*task).",
	}
	networkPrefixes = []string{
		"github.com/minio/minio-go/", "net/http.", "net.", "crypto/tls.", "golang.org/x/net/", "vendor/golang.org/x/net/",
		"github.com/redis/go-redis/", "syscall.", "internal/poll.", "runtime.netpoll", "internal/runtime/syscall.",
		// storage/s3 is the worker's S3 client: since ec8698a its GETs run
		// on its own HTTP/1.1 client (request, SigV4, response parsing)
		// instead of minio-go's, which was counted here all along.
		"github.com/rmsgrad/rmsgrad/storage/s3.",
	}
)

// classify sorts one stack (function names, leaf first).
func classify(stack []string) string {
	for _, f := range stack {
		for _, c := range computeFrames {
			if strings.HasPrefix(f, c) {
				return "compute"
			}
		}
	}
	for _, f := range stack {
		for _, n := range networkPrefixes {
			if strings.HasPrefix(f, n) {
				return "network"
			}
		}
	}
	for _, f := range stack {
		if strings.HasPrefix(f, "github.com/rmsgrad/") {
			return "rmsgrad"
		}
	}
	for _, f := range stack {
		if strings.HasPrefix(f, "github.com/hibiken/asynq") {
			return "asynq"
		}
	}
	if len(stack) > 0 && slices.IndexFunc(stack, func(f string) bool { return !strings.HasPrefix(f, "runtime.") }) < 0 {
		return "runtime"
	}
	return "other"
}

// analyzeCPUProfile reads a runtime/pprof CPU profile and splits its time.
func analyzeCPUProfile(path string, jobs int) (profileSplit, error) {
	p := profileSplit{Jobs: jobs, flatOver: map[string]int64{}}
	samples, err := readProfile(path)
	if err != nil {
		return p, err
	}
	for _, s := range samples {
		p.Total += s.ns
		switch classify(s.stack) {
		case "compute":
			p.Compute += s.ns
			continue
		case "network":
			p.Network += s.ns
			continue
		case "rmsgrad":
			p.Rmsgrad += s.ns
		case "asynq":
			p.Asynq += s.ns
		case "runtime":
			p.Runtime += s.ns
		default:
			p.Other += s.ns
		}
		if len(s.stack) > 0 {
			p.flatOver[s.stack[0]] += s.ns
		}
	}
	if p.Total == 0 {
		return p, fmt.Errorf("profile %s: no samples", path)
	}
	return p, nil
}

type sample struct {
	stack []string // leaf first, inlined frames expanded
	ns    int64
}

// readProfile decodes the parts of profile.proto a CPU profile's split
// needs (samples, locations, functions, strings) with protowire, so the
// bench needs no pprof library. The CPU value is the last sample value
// (cpu nanoseconds).
func readProfile(path string) ([]sample, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("profile %s: %w", path, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("profile %s: %w", path, err)
	}
	type rawSample struct {
		locs []uint64
		vals []int64
	}
	var (
		rs      []rawSample
		locFns  = map[uint64][]uint64{} // location -> function ids, leaf (innermost inline) first
		fnName  = map[uint64]int64{}    // function -> string index
		strs    []string
		errProf = fmt.Errorf("profile %s: malformed", path)
	)
	packed := func(v []byte, add func(uint64)) error {
		for len(v) > 0 {
			x, n := binary.Uvarint(v)
			if n <= 0 {
				return errProf
			}
			add(x)
			v = v[n:]
		}
		return nil
	}
	// fields calls f for each field of msg (protobuf wire format); varint
	// fields pass their value in x, length-delimited ones their bytes in v.
	fields := func(msg []byte, f func(num uint64, x uint64, v []byte) error) error {
		for len(msg) > 0 {
			tag, n := binary.Uvarint(msg)
			if n <= 0 {
				return errProf
			}
			msg = msg[n:]
			num, typ := tag>>3, tag&7
			var x uint64
			var v []byte
			switch typ {
			case 0: // varint
				if x, n = binary.Uvarint(msg); n <= 0 {
					return errProf
				}
			case 1: // 64-bit
				n = 8
			case 2: // length-delimited
				l, m := binary.Uvarint(msg)
				if m <= 0 || uint64(len(msg)-m) < l {
					return errProf
				}
				v = msg[m : m+int(l)]
				if v == nil {
					v = []byte{}
				}
				n = m + int(l)
			case 5: // 32-bit
				n = 4
			default:
				return errProf
			}
			if n > len(msg) {
				return errProf
			}
			msg = msg[n:]
			if err := f(num, x, v); err != nil {
				return err
			}
		}
		return nil
	}
	err = fields(b, func(num uint64, _ uint64, v []byte) error {
		switch num {
		case 2: // sample
			var s rawSample
			err := fields(v, func(num uint64, x uint64, v []byte) error {
				switch num {
				case 1:
					if v != nil {
						return packed(v, func(u uint64) { s.locs = append(s.locs, u) })
					}
					s.locs = append(s.locs, x)
				case 2:
					if v != nil {
						return packed(v, func(u uint64) { s.vals = append(s.vals, int64(u)) })
					}
					s.vals = append(s.vals, int64(x))
				}
				return nil
			})
			rs = append(rs, s)
			return err
		case 4: // location
			var id uint64
			var fns []uint64
			err := fields(v, func(num uint64, x uint64, v []byte) error {
				switch num {
				case 1:
					id = x
				case 4: // line
					return fields(v, func(num uint64, x uint64, _ []byte) error {
						if num == 1 {
							fns = append(fns, x)
						}
						return nil
					})
				}
				return nil
			})
			locFns[id] = fns
			return err
		case 5: // function
			var id uint64
			var name int64
			err := fields(v, func(num uint64, x uint64, _ []byte) error {
				switch num {
				case 1:
					id = x
				case 2:
					name = int64(x)
				}
				return nil
			})
			fnName[id] = name
			return err
		case 6:
			strs = append(strs, string(v))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(strs) == 0 {
		return nil, errors.Join(errProf, errors.New("no string table"))
	}
	out := make([]sample, 0, len(rs))
	for _, s := range rs {
		if len(s.vals) == 0 {
			continue
		}
		var st []string
		for _, l := range s.locs {
			for _, f := range locFns[l] {
				if i := fnName[f]; i >= 0 && int(i) < len(strs) {
					st = append(st, strs[i])
				}
			}
		}
		out = append(out, sample{stack: st, ns: s.vals[len(s.vals)-1]})
	}
	return out, nil
}

// startCPUProfile starts runtime/pprof's CPU profile into a new file at
// path. stop ends it and closes the file; it may be called more than once
// (a deferred call after an explicit one is a no-op).
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
		})
	}, nil
}
