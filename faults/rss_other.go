//go:build !linux

package faults

import "errors"

// Memory returns a process's resident set size now and its peak; only
// Linux (/proc/PID/status) is supported.
func Memory(pid int) (rss, peak int64, err error) {
	return 0, 0, errors.New("faults: process memory is read from /proc, Linux only")
}
