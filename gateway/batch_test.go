package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzSplitBatch: whenever splitBatch takes a body, encoding/json (the
// reference, decodeStrict) takes it too and finds the same items.
func FuzzSplitBatch(f *testing.F) {
	for _, s := range []string{
		`{"jobs":[]}`,
		`{"jobs":[{"id":"a","job":{"v":1,"x":"s3://b/k#x"}}]}`,
		` { "jobs" : [ {"job":{"a":[1,{"b":"}"}]},"id":"b-1"} , {"job":{}} ] } `,
		`{"jobs":[{"id":"a\"","job":{}}]}`,
		`{"jobs":[{"id":"a","job":{"s":"\\\"}"}}]}`,
		`{"jobs":[{"id":"a","id":"b","job":{}}]}`,
		`{"jobs":[{"job":{}}],"x":1}`,
		`{"jobs":[{"job":{}}]}x`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fast, ok := splitBatch(body)
		if !ok {
			return
		}
		if !json.Valid(body) {
			return // the handler answers encoding/json's error for the body
		}
		var req batchRequest
		if e := decodeStrict(body, &req); e != nil {
			t.Fatalf("splitBatch took %q, encoding/json refuses it: %v", body, e)
		}
		if len(req.Jobs) != len(fast) {
			t.Fatalf("%q: %d items, encoding/json %d", body, len(fast), len(req.Jobs))
		}
		for i := range fast {
			if fast[i].ID != req.Jobs[i].ID || !bytes.Equal(fast[i].Job, req.Jobs[i].Job) {
				t.Fatalf("%q item %d: %q %q, encoding/json %q %q", body, i, fast[i].ID, fast[i].Job, req.Jobs[i].ID, req.Jobs[i].Job)
			}
		}
	})
}

func TestSplitBatch(t *testing.T) {
	for body, want := range map[string]bool{
		`{"jobs":[{"id":"a","job":{"v":1}},{"job":{"x":"}"}}]}`: true,
		`{"jobs":[{"id":"a\u0041","job":{}}]}`:                  false, // escapes: encoding/json reads it
		`{"jobs":[{"id":"a","job":{}},]}`:                       false,
		`{"jobs":[{"id":"a"}]}`:                                 false,
		`{"Jobs":[]}`:                                           false,
	} {
		if _, ok := splitBatch([]byte(body)); ok != want {
			t.Errorf("splitBatch(%s) ok = %v, want %v", body, ok, want)
		}
	}
	if !validID("a") || !validID("A9._:-z") || validID("") || validID("-a") || validID("a b") || validID(string(make([]byte, 129))) {
		t.Error("validID")
	}
}

// TestWriteBatch: writeBatch writes what writeJSON would, byte for byte.
func TestWriteBatch(t *testing.T) {
	cases := [][]batchAnswer{
		{},
		{{Index: 0, ID: "a", Queue: "rmsnorm", Status: 202}},
		{{Index: 0, ID: "py-1", Queue: "q", Status: 202}, {Index: 1, Status: 400, Error: newErr(400, CodeInvalidJob, "invalid job: eps: <0> & \"x\"")},
			{Index: 2, ID: "", Queue: "q", Status: 202}, {Index: 3, ID: "b\"c", Queue: "q", Status: 202}, {Index: 4, ID: "é", Queue: "q", Status: 202}},
	}
	for _, out := range cases {
		a, b := httptest.NewRecorder(), httptest.NewRecorder()
		writeBatch(a, out)
		writeJSON(b, http.StatusOK, struct {
			Jobs []batchAnswer `json:"jobs"`
		}{out})
		if a.Body.String() != b.Body.String() || a.Code != b.Code || a.Header().Get("Content-Type") != b.Header().Get("Content-Type") {
			t.Errorf("writeBatch:\n%s\nwriteJSON:\n%s", a.Body.String(), b.Body.String())
		}
	}
}
