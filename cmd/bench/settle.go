package main

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// settled is the kernel's page-cache state that settle found before a
// timed run: the bytes still to be written back and how long the sync
// that wrote them took.
type settled struct {
	Dirty int64         // Dirty + Writeback from /proc/meminfo before the sync, bytes; -1 unknown
	Sync  time.Duration // how long syscall.Sync took
}

// settle flushes the kernel's dirty pages before a timed run: the
// sections before it write gigabytes of objects into versitygw's posix
// directory, and the kernel's writeback of them could otherwise overlap
// one side of a ratio (a run) and not the other (the ceiling measured
// after it); after settle both start with none pending. It reads Dirty and
// Writeback from /proc/meminfo first; off Linux, or when /proc/meminfo
// cannot be read, it still syncs and reports Dirty -1.
func settle() settled {
	s := settled{Dirty: -1}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if d, err := parseDirty(b); err == nil {
			s.Dirty = d
		} else {
			slog.Warn("settle: dirty pages unknown", "err", err)
		}
	}
	t0 := time.Now()
	syscall.Sync()
	s.Sync = time.Since(t0)
	slog.Info("settle", "dirty_mib", s.Dirty>>20, "sync", s.Sync)
	return s
}

// parseDirty returns Dirty + Writeback of a /proc/meminfo text in bytes.
// Both fields must be there, in kB.
func parseDirty(meminfo []byte) (int64, error) {
	want := map[string]int64{"Dirty": -1, "Writeback": -1}
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if _, wanted := want[name]; !ok || !wanted {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return -1, fmt.Errorf("meminfo: %s: want \"N kB\", got %q", name, strings.TrimSpace(rest))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 {
			return -1, fmt.Errorf("meminfo: %s: %q is not a size", name, f[0])
		}
		want[name] = kb << 10
	}
	if err := sc.Err(); err != nil {
		return -1, fmt.Errorf("meminfo: %w", err)
	}
	var sum int64
	for _, name := range []string{"Dirty", "Writeback"} {
		if want[name] < 0 {
			return -1, fmt.Errorf("meminfo: no %s line", name)
		}
		sum += want[name]
	}
	return sum, nil
}

// String is e.g. "2,345 MiB dirty, sync 1.9 s".
func (s settled) String() string {
	dirty := "dirty unknown"
	if s.Dirty >= 0 {
		dirty = groupDigits(s.Dirty>>20) + " MiB dirty"
	}
	sync := fmt.Sprintf("%.1f s", s.Sync.Seconds())
	if s.Sync < time.Second {
		sync = fmt.Sprintf("%.0f ms", float64(s.Sync.Microseconds())/1e3)
	}
	return dirty + ", sync " + sync
}

// groupDigits writes n with a comma between groups of three digits.
func groupDigits(n int64) string {
	d := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(d, "-")
	d = strings.TrimPrefix(d, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range d {
		if i > 0 && (len(d)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// settleNote is the report's note on the flushes: what settle found before
// each small round's default-batching run and before the first large
// round's F32 run (large nil when no large round ran).
func settleNote(small []settled, large *settled) string {
	var per []string
	for i, s := range small {
		per = append(per, fmt.Sprintf("round %d: %s", i+1, s))
	}
	n := "before each timed end-to-end run (the profile's in-process runs excepted) and each storage ceiling measured in the e2e rounds, the bench reads Dirty + Writeback from /proc/meminfo and calls sync(2), so that no writeback of earlier writes is pending when the run starts; found before each small round's default-batching run: " +
		strings.Join(per, "; ")
	if large != nil {
		n += fmt.Sprintf("; before the first large round's F32 run: %s", large)
	}
	return n + "."
}
