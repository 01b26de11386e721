package s3

import (
	"testing"
	"time"
)

// TestAppendAmzDate: the fast path's date stamp is what
// time.AppendFormat(amzDate) writes, in UTC, for any zone and year.
func TestAppendAmzDate(t *testing.T) {
	zone := time.FixedZone("x", -(9*3600 + 30*60))
	for _, tm := range []time.Time{
		time.Date(2026, 12, 3, 13, 17, 5, 999999999, time.UTC),
		time.Date(2026, 12, 31, 20, 0, 0, 0, zone), // next day, next year in UTC
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 9, 9, 9, 9, 9, 0, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(0, 0),
		time.Now(),
	} {
		want := tm.UTC().AppendFormat([]byte("x-"), amzDate)
		if got := appendAmzDate([]byte("x-"), tm); string(got) != string(want) {
			t.Errorf("%v: %q, want %q", tm, got, want)
		}
	}
}
