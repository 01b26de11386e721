package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
)

func cmdSubmit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("submit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf connFlags
	cf.register(fs)
	x := fs.String("x", "", "x: tensor URI (s3://bucket/key#name, file:///path#name) or a local safetensors file")
	w := fs.String("w", "", "w: tensor URI or local file")
	dy := fs.String("dy", "", "dy: tensor URI or local file")
	out := fs.String("out", "", "output object URI (one safetensors file holding the outputs)")
	eps := fs.Float64("eps", 1e-6, "epsilon added to the mean square")
	outputs := fs.String("outputs", "dx,dw", "outputs to write: any of dx,dw,r")
	id := fs.String("id", "", "task id: re-submitting the same job under its id is a no-op (safe retries); another job under a taken id is an error")
	wait := fs.Bool("wait", false, "wait for the result and exit non-zero if the job fails")
	gradDType := fs.String("grad-dtype", "", "dtype of dx and dw: f32, bf16 or f16 (the inputs may each be F32, BF16 or F16); default: dx like x, dw like w")
	if err := fs.Parse(args); err != nil {
		return &exitError{2, err}
	}
	c, err := loadConfig(&cf)
	if err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{{"x", *x}, {"w", *w}, {"dy", *dy}, {"out", *out}} {
		if f.v == "" {
			return &exitError{2, fmt.Errorf("--%s is required", f.name)}
		}
	}
	var grad string
	if *gradDType != "" {
		dt, err := parseDType("grad-dtype", *gradDType)
		if err != nil {
			return &exitError{2, err}
		}
		grad = string(dt)
	}
	// Redis first: an unreachable queue should fail before any upload.
	client, err := openClient(c)
	if err != nil {
		return err
	}
	defer client.Close()
	router, err := openStorage(ctx, c)
	if err != nil {
		return err
	}
	j := jobs.Job{V: jobs.Version, Eps: *eps, Out: *out, GradDType: grad}
	if *outputs != "" {
		j.Outputs = strings.Split(*outputs, ",")
	}
	for _, in := range []struct {
		name string
		v    string
		dst  *string
	}{{"x", *x, &j.X}, {"w", *w, &j.W}, {"dy", *dy, &j.DY}} {
		u, err := resolveInput(ctx, router, c, in.name, in.v)
		if err != nil {
			return err
		}
		*in.dst = u
	}
	var opts []asynq.Option
	if *id != "" {
		opts = append(opts, asynq.TaskID(*id))
	}
	taskID, err := client.Enqueue(ctx, j, opts...)
	if err != nil {
		return err
	}
	if !*wait {
		if cf.json {
			return json.NewEncoder(stdout).Encode(map[string]string{"id": taskID, "queue": c.Queue})
		}
		fmt.Fprintln(stdout, taskID)
		return nil
	}
	res, err := client.Wait(ctx, taskID)
	return printOutcome(stdout, cf.json, taskID, res, err)
}

// printOutcome prints a waited-for job's result or error; a failed job is an
// exit code 1.
func printOutcome(stdout io.Writer, asJSON bool, id string, res *jobs.Result, err error) error {
	var failed *jobs.JobFailedError
	if err != nil && !errors.As(err, &failed) {
		return err
	}
	if asJSON {
		v := map[string]any{"id": id, "state": "completed", "result": res}
		if failed != nil {
			v = map[string]any{"id": id, "state": "failed", "error": failed.Msg, "retried": failed.Retried}
		}
		if e := json.NewEncoder(stdout).Encode(v); e != nil {
			return e
		}
	} else if failed == nil {
		fmt.Fprintf(stdout, "job %s completed: out %s (%dx%d) on %s/%s, batch %s of %d jobs, %.1f ms total\n",
			id, res.Out, res.Rows, res.Dim, res.Backend, res.Worker, res.BatchID, res.BatchJobs, res.Timings.Total)
		for _, name := range []string{"dx", "dw", "r"} {
			if h, ok := res.SHA256[name]; ok {
				fmt.Fprintf(stdout, "  %-2s sha256 %s (%s)\n", name, h, res.DTypes[name])
			}
		}
		tm := res.Timings
		fmt.Fprintf(stdout, "  ms: queue_wait %.1f, fetch %.1f, batch_wait %.1f, compute %.1f, store %.1f\n",
			tm.QueueWait, tm.Fetch, tm.Batch, tm.Compute, tm.Store)
	}
	if failed != nil {
		return &exitError{1, failed}
	}
	return nil
}

// resolveInput returns a tensor URI for an input flag: URIs pass through;
// a local file inside the file store root becomes a file:// URI; any other
// local file is uploaded under upload_prefix, named by its content hash so
// that re-submitting uploads nothing new.
func resolveInput(ctx context.Context, r *storage.Router, c config, name, v string) (string, error) {
	if strings.Contains(v, "://") {
		if _, err := storage.ParseRef(v); err != nil {
			return "", fmt.Errorf("--%s: %w", name, err)
		}
		return v, nil
	}
	path, frag, _ := strings.Cut(v, "#")
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", name, err)
	}
	suffix := ""
	if frag != "" {
		suffix = "#" + frag
	}
	if root := c.Storage.FileRoot; root != "" {
		if rootAbs, err := filepath.Abs(root); err == nil {
			if rel, err := filepath.Rel(rootAbs, abs); err == nil && !strings.HasPrefix(rel, "..") {
				return "file://" + abs + suffix, nil
			}
		}
	}
	prefix := c.Storage.UploadPrefix
	if prefix == "" {
		return "", fmt.Errorf("--%s: %s is a local file outside the file store root; set upload_prefix (or --upload-prefix) to upload it", name, path)
	}
	f, err := os.Open(abs)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", name, err)
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return "", fmt.Errorf("--%s: read %s: %w", name, path, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	uri := strings.TrimRight(prefix, "/") + "/" + hex.EncodeToString(h.Sum(nil))[:16] + "-" + filepath.Base(abs)
	if err := r.Put(ctx, uri, f, size); err != nil {
		return "", fmt.Errorf("--%s: upload %s to %s: %w", name, path, uri, err)
	}
	return uri + suffix, nil
}
