package s3

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/rmsgrad/rmsgrad/storage"
)

// put is a single PUT on the fast path (fastget.go): the request head,
// then n bytes of the body that r's WriteTo writes from start, straight
// from its own buffers (storage.Segments: the header and the compute
// buffers) to the connection, with no copy into a transfer buffer, then
// the response. The body carries the CRC32C crc in a header, as the
// minio-go path does. A server error answer is decoded as minio-go would
// (errorResponse); an answer the fast path does not handle is errFallback,
// and the caller sends the PUT again through minio-go (a PUT of the same
// bytes is idempotent).
func (f *fastGet) put(ctx context.Context, ref storage.Ref, r seekWriterTo, start, n int64, crc string) error {
	bucket, key := ref.Bucket, ref.Key
	if !utf8.ValidString(key) {
		return errFallback // minio-go sends such keys unencoded
	}
	c, err := f.exchange(ctx, http.MethodPut, bucket, key, 0, -1, func(c *fconn, now time.Time) (bool, error) {
		return f.putOnce(ctx, c, now, bucket, key, r, start, n, crc)
	})
	if err != nil {
		return err
	}
	if c.status != http.StatusOK {
		return f.errorResponse(c, http.MethodPut, bucket, key)
	}
	// Stored. The (empty) body is drained so that the connection can serve
	// again; one that cannot is closed.
	ok := !c.chunked && c.clen >= 0
	if ok && c.left > 0 && c.left <= maxErrorBody {
		k, derr := c.br.Discard(int(c.left))
		c.left -= int64(k)
		ok = derr == nil
	}
	f.release(c, ok && c.left == 0)
	return nil
}

// putOnce sends the PUT on c and reads the response head. fresh is true
// when no byte of a response came (the request may be sent again).
func (f *fastGet) putOnce(ctx context.Context, c *fconn, now time.Time, bucket, key string, r seekWriterTo, start, n int64, crc string) (fresh bool, err error) {
	if ctx.Done() != nil {
		c.stop = context.AfterFunc(ctx, c.kick)
	}
	// No stall timeout: the minio-go path has none for uploads, and a
	// server may take a while to store what it got. The context's
	// deadline, if any, still applies.
	d, _ := ctx.Deadline()
	if err := c.nc.SetDeadline(d); err != nil {
		return true, err
	}
	if ctx.Done() != nil && ctx.Err() != nil {
		return true, ctx.Err()
	}
	b := f.putRequest(c, now, bucket, key, n, crc)
	if _, err := c.nc.Write(b); err != nil {
		return true, err
	}
	if err := f.putBody(c, r, start, n); err != nil {
		// A server that refuses a request may answer before reading its
		// body and close the connection: its answer says more than the
		// broken pipe.
		var cut *bodyCut
		if !errors.As(err, &cut) && ctx.Err() == nil {
			c.nc.SetReadDeadline(time.Now().Add(time.Second))
			if _, herr := c.readHead(); herr == nil && c.status >= 400 {
				c.close = true
				return false, nil
			}
		}
		return !errors.As(err, &cut), err
	}
	return c.readHead()
}

// bodyCut is a body write stopped by the test hook (fastTrace.wrote).
type bodyCut struct{ err error }

func (b *bodyCut) Error() string { return b.err.Error() }
func (b *bodyCut) Unwrap() error { return b.err }

// putBody writes n bytes of r from start to c.
func (f *fastGet) putBody(c *fconn, r seekWriterTo, start, n int64) error {
	if _, err := r.Seek(start, io.SeekStart); err != nil {
		return err
	}
	w := &connWriter{c: c, f: f, left: n, n: n}
	_, err := r.WriteTo(w)
	if err == errSummed {
		err = nil
	}
	if err == nil && w.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// putChunk bounds one write to the connection: large enough that a 64 KiB
// socket buffer is the limit, small enough for a test hook to cut a body
// part way.
const putChunk = 1 << 20

// connWriter sends a body to a connection in chunks and stops at left.
type connWriter struct {
	c       *fconn
	f       *fastGet
	left, n int64
}

func (w *connWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 && w.left > 0 {
		k := int(min(int64(len(p)), putChunk, w.left))
		if w.f.trace != nil && w.f.trace.wrote != nil {
			if err := w.f.trace.wrote(w.n-w.left, int64(k)); err != nil {
				return n, &bodyCut{err}
			}
		}
		m, err := w.c.nc.Write(p[:k])
		n, p, w.left = n+m, p[m:], w.left-int64(m)
		if err != nil {
			return n, err
		}
	}
	if w.left == 0 {
		return n, errSummed // the body is complete: stop the WriteTo
	}
	return n, nil
}

// putRequest builds the PUT's head into c.req.
func (f *fastGet) putRequest(c *fconn, now time.Time, bucket, key string, n int64, crc string) []byte {
	b, p0, p1 := f.requestLine(c, http.MethodPut, bucket, key)
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, "\r\nContent-Type: "+putContentType+"\r\nX-Amz-Checksum-Crc32c: "...)
	b = append(b, crc...)
	b = append(b, "\r\n"...)
	return f.endRequest(c, b, now, http.MethodPut, b[p0:p1], crc)
}
