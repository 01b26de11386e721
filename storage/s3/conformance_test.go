package s3_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/rmsgrad/rmsgrad/storage/storetest"
)

// TestConformance runs the suite every store passes against a real
// versitygw, each subtest under its own key prefix.
func TestConformance(t *testing.T) { eachServer(t, testConformance) }

func testConformance(t *testing.T, kind string) {
	gw := gateway(t, kind)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		return storetest.Fixture{
			Store:    newStore(t, gw, nil),
			Scheme:   "s3",
			Base:     fmt.Sprintf("s3://data/t/%d/", n.Add(1)),
			Denied:   []string{"s3://other/t/x", "s3://data/u/x", "s3://data/tx"},
			ReadOnly: "s3://readonly/",
			// versitygw's posix backend keeps objects as files and
			// refuses a key that is a directory of others or lies under
			// another (409); MinIO stores both, as AWS does.
			MustRefuseUnwritable: kind == "versitygw",
		}
	})
}
