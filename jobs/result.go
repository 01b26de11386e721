package jobs

// Result is what a worker writes with asynq's ResultWriter when a job
// completes; clients read it with Client.Wait or Client.Result.
type Result struct {
	Out       string            `json:"out"`
	SHA256    map[string]string `json:"sha256"` // output name -> hex sha256 of its bytes
	Rows      int               `json:"rows"`
	Dim       int               `json:"dim"`
	Backend   string            `json:"backend"`
	Device    string            `json:"device,omitempty"`
	Worker    string            `json:"worker"`
	BatchID   string            `json:"batch_id"`
	BatchJobs int               `json:"batch_jobs"`
	Timings   Timings           `json:"timings_ms"`
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
