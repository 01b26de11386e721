package testenv

import (
	"net"
	"os"
	"runtime"
	"testing"
)

// A port that another process takes between FreePort and the server's
// bind: the server is started again on another port, and the test gets a
// server that is its own, not the process that took the port.
func TestStartPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	calls := 0
	pickPort = func(t testing.TB) int {
		if calls++; calls == 1 {
			return taken
		}
		return FreePort(t)
	}
	defer func() { pickPort = FreePort }()

	s := Redis(t)
	if s.Port == taken {
		t.Fatalf("the server reports the taken port %d", taken)
	}
	if calls != 2 {
		t.Errorf("ports chosen: %d; want 2 (the taken one, then another)", calls)
	}
	if got := RedisDo(t, s, nil, "PING"); got != "PONG" {
		t.Errorf("PING = %v", got)
	}
	if runtime.GOOS == "linux" {
		if owned, known := listenerOwnedBy(s.cmd.Process.Pid, s.Port); !known || !owned {
			t.Errorf("listenerOwnedBy(server pid, %d) = %v, %v; want true, true", s.Port, owned, known)
		}
	}
}

func TestListenerOwnedBy(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if owned, known := listenerOwnedBy(os.Getpid(), port); !owned || !known {
		t.Errorf("own listener: owned %v, known %v; want true, true", owned, known)
	}
	if owned, known := listenerOwnedBy(os.Getppid(), port); owned || !known {
		t.Errorf("parent's view: owned %v, known %v; want false, true", owned, known)
	}
	free := FreePort(t)
	if _, known := listenerOwnedBy(os.Getpid(), free); known {
		t.Errorf("a port nobody listens on: known; want unknown")
	}
}
