//go:build !amd64 || purego

package jobs

// allFinite reports whether v holds no NaN or Inf.
func allFinite(v []float32) bool { return allFiniteSWAR(v) }
