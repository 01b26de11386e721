package jobs

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
)

// Result is what a worker writes with asynq's ResultWriter when a job
// completes; clients read it with Client.Wait or Client.Result.
type Result struct {
	Out    string            `json:"out"`
	SHA256 map[string]string `json:"sha256"` // output name -> hex sha256 of its bytes
	// DTypes maps each output's name to its dtype in the output object
	// ("F32", "BF16", "F16"; r is always "F32").
	DTypes    map[string]string `json:"dtypes"`
	Rows      int               `json:"rows"`
	Dim       int               `json:"dim"`
	Backend   string            `json:"backend"`
	Device    string            `json:"device,omitempty"`
	Worker    string            `json:"worker"`
	BatchID   string            `json:"batch_id"`
	BatchJobs int               `json:"batch_jobs"`
	Timings   Timings           `json:"timings_ms"`

	totalUS int64 // Timings.Total in whole microseconds, for the log line
}

// Timings are the stages of one job, in milliseconds.
type Timings struct {
	QueueWait float64 `json:"queue_wait"` // enqueue to handler start
	Fetch     float64 `json:"fetch"`      // headers and tensor reads
	Batch     float64 `json:"batch_wait"` // waiting for the batch to fill and the device
	Compute   float64 `json:"compute"`    // the batch's command buffer, device time
	Store     float64 `json:"store"`      // writing the output object
	Total     float64 `json:"total"`      // handler start to result written
}

// marshal encodes r as json.Marshal does, byte for byte (FuzzResultJSON),
// without its reflection: the worker writes one result per job. Strings
// that json.Marshal would escape and non-finite timings (an error there)
// go through json.Marshal.
func (r *Result) marshal() ([]byte, error) {
	plain := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				return false
			}
		}
		return true
	}
	ok := plain(r.Out) && plain(r.Backend) && plain(r.Device) && plain(r.Worker) && plain(r.BatchID)
	keys := make([]string, 0, len(r.SHA256))
	for k, v := range r.SHA256 {
		ok = ok && plain(k) && plain(v)
		keys = append(keys, k)
	}
	dkeys := make([]string, 0, len(r.DTypes))
	for k, v := range r.DTypes {
		ok = ok && plain(k) && plain(v)
		dkeys = append(dkeys, k)
	}
	t := r.Timings
	for _, f := range [...]float64{t.QueueWait, t.Fetch, t.Batch, t.Compute, t.Store, t.Total} {
		ok = ok && !math.IsNaN(f) && !math.IsInf(f, 0)
	}
	if !ok {
		return json.Marshal(r)
	}
	slices.Sort(keys)
	slices.Sort(dkeys)
	b := make([]byte, 0, 416+len(r.Out)+80*len(keys)+16*len(dkeys))
	str := func(s string) {
		b = append(b, '"')
		b = append(b, s...)
		b = append(b, '"')
	}
	b = append(b, `{"out":`...)
	str(r.Out)
	b = append(b, `,"sha256":`...)
	if r.SHA256 == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			str(k)
			b = append(b, ':')
			str(r.SHA256[k])
		}
		b = append(b, '}')
	}
	b = append(b, `,"dtypes":`...)
	if r.DTypes == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '{')
		for i, k := range dkeys {
			if i > 0 {
				b = append(b, ',')
			}
			str(k)
			b = append(b, ':')
			str(r.DTypes[k])
		}
		b = append(b, '}')
	}
	b = append(b, `,"rows":`...)
	b = strconv.AppendInt(b, int64(r.Rows), 10)
	b = append(b, `,"dim":`...)
	b = strconv.AppendInt(b, int64(r.Dim), 10)
	b = append(b, `,"backend":`...)
	str(r.Backend)
	if r.Device != "" {
		b = append(b, `,"device":`...)
		str(r.Device)
	}
	b = append(b, `,"worker":`...)
	str(r.Worker)
	b = append(b, `,"batch_id":`...)
	str(r.BatchID)
	b = append(b, `,"batch_jobs":`...)
	b = strconv.AppendInt(b, int64(r.BatchJobs), 10)
	b = append(b, `,"timings_ms":{"queue_wait":`...)
	b = appendJSONFloat(b, t.QueueWait)
	b = append(b, `,"fetch":`...)
	b = appendJSONFloat(b, t.Fetch)
	b = append(b, `,"batch_wait":`...)
	b = appendJSONFloat(b, t.Batch)
	b = append(b, `,"compute":`...)
	b = appendJSONFloat(b, t.Compute)
	b = append(b, `,"store":`...)
	b = appendJSONFloat(b, t.Store)
	b = append(b, `,"total":`...)
	b = appendJSONFloat(b, t.Total)
	b = append(b, '}', '}')
	return b, nil
}

// appendJSONFloat formats a finite float64 as encoding/json does.
func appendJSONFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// clean up e-09 to e-9
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
