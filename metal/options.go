package metal

// Option configures Open.
type Option func(*options)

type options struct {
	poolLimit       int64
	maxCommandBytes int64
}

// PoolLimit bounds the backend's Metal buffers, in use and kept for reuse
// together, to n bytes: a released buffer that would go over it is
// released to the system instead of pooled, and pooled buffers of other
// sizes are released before a new buffer would take the total over it. A
// worker passes its memory budget (with the slack the CPU backend gets),
// so buffers of shapes it no longer sees do not stay resident. 0 (the
// default) keeps every released buffer until Close.
func PoolLimit(n int64) Option { return func(o *options) { o.poolLimit = n } }

// MaxCommandBytes bounds the memory traffic of one command buffer (see
// shaders.DefaultMaxCommandBytes, the default): a larger batch, or a huge
// job's row groups, is split over several command buffers committed one
// after the other, so that none runs long enough for macOS to end it.
func MaxCommandBytes(n int64) Option { return func(o *options) { o.maxCommandBytes = n } }
