package testenv

import (
	"context"
	"fmt"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Client returns a minio-go client on s with its credentials, for tests
// that look at the server through its S3 API (list multipart uploads, make
// buckets).
func (s *S3) Client() (*minio.Client, error) {
	return minio.New(s.Endpoint(), &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Region: "us-east-1"})
}

// makeBuckets creates the buckets through the S3 API (MinIO keeps bucket
// metadata of its own: a directory made beside its data is not a bucket).
func makeBuckets(s *S3, buckets []string) error {
	c, err := s.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, b := range buckets {
		if err := c.MakeBucket(ctx, b, minio.MakeBucketOptions{Region: "us-east-1"}); err != nil {
			return fmt.Errorf("make bucket %s: %w", b, err)
		}
	}
	return nil
}
