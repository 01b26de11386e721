package faults

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

// workerBin and enqueueBin are the binaries under test, built once.
var workerBin, enqueueBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() { // every test here is long and skips
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "rmsgrad-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workerBin, enqueueBin, err = Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
