//go:build !linux

package procattr

import "syscall"

// Child returns the SysProcAttr for a child server process: its own process
// group. Other systems have no parent-death signal; the tests' cleanup stops
// the child instead.
func Child() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
