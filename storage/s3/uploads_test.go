package s3_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
)

// debris starts a multipart upload of bucket/key on gw and uploads one
// part of n bytes, as a sender killed after its first part leaves it.
func debris(t *testing.T, gw *testenv.S3, bucket, key string, n int) string {
	t.Helper()
	c, err := gw.Client()
	if err != nil {
		t.Fatal(err)
	}
	core := minio.Core{Client: c}
	ctx := context.Background()
	id, err := core.NewMultipartUpload(ctx, bucket, key, minio.PutObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := core.PutObjectPart(ctx, bucket, key, id, 1, bytes.NewReader(make([]byte, n)), int64(n), minio.PutObjectPartOptions{}); err != nil {
		t.Fatal(err)
	}
	return id
}

// uploadsOf lists the uploads in progress of exactly key.
func uploadsOf(t *testing.T, gw *testenv.S3, bucket, key string) []string {
	t.Helper()
	c, err := gw.Client()
	if err != nil {
		t.Fatal(err)
	}
	res, err := minio.Core{Client: c}.ListMultipartUploads(context.Background(), bucket, key, "", "", "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, u := range res.Uploads {
		if u.Key == key {
			ids = append(ids, u.UploadID)
		}
	}
	return ids
}

// TestSameKeyDebris: the debris of an earlier, dead upload of a key is
// aborted once a multipart upload of that key completes, on every server.
func TestSameKeyDebris(t *testing.T) { eachServer(t, testSameKeyDebris) }

func testSameKeyDebris(t *testing.T, kind string) {
	gw := gateway(t, kind)
	key := "t/debris.safetensors"
	debris(t, gw, "data", key, 5<<20)
	if n := len(uploadsOf(t, gw, "data", key)); n != 1 {
		t.Fatalf("%d uploads in progress of %s before the write, want the debris", n, key)
	}
	st := newStore(t, gw, func(c *s3.Config) { c.MultipartThreshold = 6 << 20; c.PartSize = 5 << 20 })
	x := tensor("dx", 3072, 1024, 7) // 12 MiB: two parts
	if _, err := newRouter(st).Write(context.Background(), "s3://data/"+key, []storage.OutTensor{x}, nil); err != nil {
		t.Fatal(err)
	}
	if ids := uploadsOf(t, gw, "data", key); len(ids) != 0 {
		t.Fatalf("uploads %v of %s still in progress after a multipart write of the key completed", ids, key)
	}
	if b, _, err := gw.MultipartBytes(); err != nil || b != 0 {
		t.Fatalf("%d bytes of multipart uploads on disk (%v), want 0", b, err)
	}
}

// TestAbortStaleUploads: uploads older than the age under the writable
// allow-list are aborted; younger ones, and those under read-only rules,
// are left alone. MinIO lists a bucket's uploads only by exact key, so
// there the prefix listing finds nothing: MinIO removes stale uploads
// itself (MINIO_API_STALE_UPLOADS_EXPIRY).
func TestAbortStaleUploads(t *testing.T) { eachServer(t, testAbortStaleUploads) }

func testAbortStaleUploads(t *testing.T, kind string) {
	gw := gateway(t, kind)
	debris(t, gw, "data", "t/old.safetensors", 5<<20)
	debris(t, gw, "data", "u/outside-prefix.safetensors", 5<<20)
	debris(t, gw, "readonly", "old.safetensors", 5<<20)
	// The young upload must stay under the age limit and the old ones
	// over it however long making the young one takes on a loaded
	// machine (its 5 MiB part): the limit is that time plus 1.5 s (the
	// servers stamp uploads in whole seconds), and the old ones are 3 s
	// older than the young one.
	time.Sleep(3 * time.Second)
	youngStart := time.Now()
	debris(t, gw, "data", "t/young.safetensors", 5<<20)
	maxAge := time.Since(youngStart) + 1500*time.Millisecond
	st := newStore(t, gw, nil)
	res, err := st.AbortStaleUploads(context.Background(), maxAge)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %+v", kind, res)
	if kind == "minio" {
		if res.Aborted != 0 {
			t.Fatalf("MinIO: aborted %d uploads through a prefix listing it does not answer", res.Aborted)
		}
		return
	}
	if res.Aborted != 1 || res.Bytes != 5<<20 || res.Young != 1 {
		t.Fatalf("AbortStaleUploads = %+v, want 1 aborted (5 MiB) and 1 young", res)
	}
	for _, c := range []struct {
		bucket, key string
		left        int
	}{{"data", "t/old.safetensors", 0}, {"data", "t/young.safetensors", 1}, {"data", "u/outside-prefix.safetensors", 1}, {"readonly", "old.safetensors", 1}} {
		if n := len(uploadsOf(t, gw, c.bucket, c.key)); n != c.left {
			t.Errorf("s3://%s/%s: %d uploads in progress, want %d", c.bucket, c.key, n, c.left)
		}
	}
}
