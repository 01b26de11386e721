package cpu

import (
	"context"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

func TestConformance(t *testing.T) {
	computetest.Run(t, func(t *testing.T) compute.Backend { return New() })
}

func TestConformanceScalar(t *testing.T) {
	computetest.Run(t, func(t *testing.T) compute.Backend { return New(Scalar()) })
}

// TestWorkerPanicRaisedOnCaller: a panic on one of Execute's worker
// goroutines (here a task with no unit) is raised again on the caller's
// goroutine, after the workers stop, with the worker's stack: the caller
// can recover it, where a panic left on a worker ends the process.
func TestWorkerPanicRaisedOnCaller(t *testing.T) {
	p := &plan{be: New()}
	tasks := make([]task, 8)
	var got any
	func() {
		defer func() { got = recover() }()
		_ = p.runTasks(context.Background(), tasks, 4)
	}()
	wp, ok := got.(*WorkerPanic)
	if !ok {
		t.Fatalf("runTasks raised %T %v, want a *WorkerPanic", got, got)
	}
	if st := string(wp.GoroutineStack()); !strings.Contains(st, "(*task).do") {
		t.Fatalf("the panic's stack is not the worker's:\n%s", st)
	}
	if !strings.Contains(wp.Error(), "nil pointer") {
		t.Fatalf("the panic's message lacks its value: %s", wp.Error())
	}
}
