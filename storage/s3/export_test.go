package s3

// SetFastTrace reports the read fast path's requests and body bytes to
// tests (the tap transport sees only minio-go's). It returns false when
// the store has no fast path.
func SetFastTrace(s *Store, request func(method, bucket, key, rng string, status int), body func(n int)) bool {
	if s.fast == nil {
		return false
	}
	s.fast.trace = &fastTrace{request: request, body: body}
	return true
}

// FastIdle is how many connections the fast path holds in its pool.
func FastIdle(s *Store) int {
	if s.fast == nil {
		return -1
	}
	s.fast.mu.Lock()
	defer s.fast.mu.Unlock()
	return len(s.fast.pool)
}

// FastCounts returns how many connections the fast path dialed and how
// many requests it handed to minio-go.
func FastCounts(s *Store) (dials, fallbacks int64) {
	return s.fast.dials.Load(), s.fast.fallbacks.Load()
}

// SetFastWrote calls fn before each chunk of a fast-path PUT body goes
// out (off: bytes of this body already sent); an error cuts the body
// there, as a sender dying mid-body would.
func SetFastWrote(s *Store, fn func(off, n int64) error) bool {
	if s.fast == nil {
		return false
	}
	if s.fast.trace == nil {
		s.fast.trace = &fastTrace{request: func(string, string, string, string, int) {}, body: func(int) {}}
	}
	s.fast.trace.wrote = fn
	return true
}
