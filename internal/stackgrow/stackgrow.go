// Package stackgrow grows a goroutine's stack ahead of a deep call path.
//
// A goroutine's stack starts small and doubles when a call needs more;
// each doubling copies the frames already on the stack and walks every
// one of them to fix its pointers, so growing at the bottom of a deep path
// (a job's handler down to a socket write) costs far more than growing at
// its top. Grow, called first thing on a fresh goroutine, makes the one
// growth happen while the stack holds a few frames.
package stackgrow

// Grow grows the calling goroutine's stack to 16 KiB, the largest stack
// the Go runtime serves from its per-P caches, unless it is that large
// already (then it costs a stack check and zeroing 8 KiB). The stack stays
// grown until the goroutine ends or the GC shrinks an idle one.
//
//go:noinline
func Grow() {
	var pad [8 << 10]byte
	keep(pad[:])
}

// keep stops the compiler from dropping Grow's frame.
//
//go:noinline
func keep([]byte) {}
