// Package procattr holds the one platform-specific detail of starting child
// server processes: on Linux the child gets SIGKILL when its parent dies, so a
// crashed test or bench run never leaves redis-server or versitygw behind.
package procattr

import "syscall"

// Child returns the SysProcAttr for a child server process: its own process
// group (so signals to the test do not reach it) and, on Linux, death with its
// parent.
func Child() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
