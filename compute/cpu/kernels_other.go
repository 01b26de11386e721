//go:build !amd64 || purego

package cpu

// extraPrims returns no other primitive sets: only the Go code runs here.
func extraPrims() map[string]*prims { return nil }
