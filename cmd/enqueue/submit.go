package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/rmsgrad/rmsgrad/internal/cliflag"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
)

func cmdSubmit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("submit")
	var cf connFlags
	cf.register(fs)
	x := fs.String("x", "", "x: tensor URI (s3://bucket/key#name, file:///path#name) or a local safetensors file (path or path#name)")
	w := fs.String("w", "", "w: tensor URI or local file")
	dy := fs.String("dy", "", "dy: tensor URI or local file")
	out := fs.String("out", "", "output object: s3://bucket/key or file:///abs/path (no #name), or a local path under the file store root")
	eps := fs.Float64("eps", 1e-6, "epsilon added to the mean square")
	outputs := fs.String("outputs", "dx,dw", "outputs to write: any of dx,dw,r")
	id := fs.String("id", "", "task id: re-submitting the same job under its id is a no-op (safe retries); another job under a taken id is an error")
	wait := fs.Bool("wait", false, "wait for the result and exit non-zero if the job fails")
	gradDType := fs.String("grad-dtype", "", "dtype of dx and dw: f32, bf16 or f16 (the inputs may each be F32, BF16 or F16); default: dx like x, dw like w")
	pinW := fs.Bool("pin-w", false, "pin w to its bytes as read now (w_sha256): the worker checks w against them and keeps it in memory for the jobs that pin the same w (docs/jobs.md#pinned-w)")
	wSHA := fs.String("w-sha256", "", "pin w to this SHA-256 of its tensor data (64 lowercase hex digits), e.g. one a pipeline recorded")
	if err := cliflag.Parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	if *pinW && *wSHA != "" {
		return cliflag.Usagef("--pin-w and --w-sha256 both pin w: give one")
	}
	for _, f := range []struct{ name, v string }{{"x", *x}, {"w", *w}, {"dy", *dy}, {"out", *out}} {
		if f.v == "" {
			return cliflag.Usagef("--%s is required (enqueue submit --help shows the flags)", f.name)
		}
	}
	if fs.NArg() > 0 {
		return cliflag.Usagef("unexpected arguments %q: every input is a flag (--x, --w, --dy, --out)", fs.Args())
	}
	var grad string
	if *gradDType != "" {
		dt, err := parseDType("grad-dtype", *gradDType)
		if err != nil {
			return &cliflag.UsageError{Err: err}
		}
		grad = string(dt)
	}
	c, err := loadConfig(&cf)
	if err != nil {
		return err
	}
	// What the command line and the local disk can tell comes first: a
	// typo is reported before Redis or storage is touched.
	j := jobs.Job{V: jobs.Version, Eps: *eps, GradDType: grad, WSHA256: *wSHA}
	if j.Out, err = resolveOut(c, *out); err != nil {
		return err
	}
	if *outputs != "" {
		j.Outputs = strings.Split(*outputs, ",")
	}
	ins := []struct {
		name, v string
		dst     *string
		in      input
	}{{name: "x", v: *x, dst: &j.X}, {name: "w", v: *w, dst: &j.W}, {name: "dy", v: *dy, dst: &j.DY}}
	for i := range ins {
		if ins[i].in, err = checkInput(c, ins[i].name, ins[i].v); err != nil {
			return err
		}
	}
	// Redis next: an unreachable queue should fail before any upload.
	client, err := openClient(c)
	if err != nil {
		return err
	}
	defer client.Close()
	router, err := openStorage(ctx, c)
	if err != nil {
		return err
	}
	for _, in := range ins {
		if *in.dst, err = in.in.resolve(ctx, router, c); err != nil {
			return err
		}
	}
	// Then what the CLI's own stores can tell: each input exists and
	// holds its tensor.
	for _, in := range ins {
		if err := checkExists(ctx, router, c, in.name, *in.dst); err != nil {
			return err
		}
	}
	if *pinW {
		if j.WSHA256, err = pinOf(ctx, router, c, j.W); err != nil {
			return err
		}
	}
	noteConnection(stderr, c)
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

// input is one of submit's input flags, checked: a URI to pass on, or a
// local file to upload.
type input struct {
	name string // "x", "w", "dy"
	uri  string // set when the value is a URI, or a file under the file store root
	path string // otherwise: the local file to upload, absolute
	frag string // its #name, if any
}

// underRoot reports whether the absolute path abs lies under the file
// store root (when one is configured).
func underRoot(c config, abs string) bool {
	if c.Storage.FileRoot == "" {
		return false
	}
	root, err := filepath.Abs(c.Storage.FileRoot)
	if err != nil {
		return false
	}
	rel, err := filepath.Rel(root, abs)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// checkInput checks an input flag without touching Redis or storage: a
// URI must parse; a local file must exist, and lie under the file store
// root or have an upload prefix to go to.
func checkInput(c config, name, v string) (input, error) {
	if strings.Contains(v, "://") {
		if _, err := storage.ParseRef(v); err != nil {
			return input{}, fmt.Errorf("--%s: %w", name, err)
		}
		return input{name: name, uri: v}, nil
	}
	path, frag, _ := strings.Cut(v, "#")
	abs, err := filepath.Abs(path)
	if err != nil {
		return input{}, fmt.Errorf("--%s: %w", name, err)
	}
	fi, err := os.Stat(abs)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return input{}, fmt.Errorf("--%s %s: no such file", name, v)
	case err != nil:
		return input{}, fmt.Errorf("--%s: %w", name, err)
	case !fi.Mode().IsRegular():
		return input{}, fmt.Errorf("--%s %s: not a regular file (want a safetensors file, or a URI)", name, v)
	}
	in := input{name: name, path: abs, frag: frag}
	if underRoot(c, abs) {
		in.uri = "file://" + abs
		if frag != "" {
			in.uri += "#" + frag
		}
		return in, nil
	}
	if c.Storage.UploadPrefix != "" {
		return in, nil
	}
	const upload = "storage.upload_prefix (RMSGRAD_UPLOAD_PREFIX, --upload-prefix) to have it uploaded first, e.g. --upload-prefix s3://BUCKET/uploads/"
	if c.Storage.FileRoot == "" {
		return input{}, fmt.Errorf("--%s %s: a local file, and neither a file store root nor an upload prefix is configured, so no worker could read it: set %s, or start worker --dev in this directory (enqueue then uses its store)", name, v, upload)
	}
	return input{}, fmt.Errorf("--%s %s: outside the file store root %s, the only local files a worker reads: move it under the root, or set %s", name, v, c.Storage.FileRoot, upload)
}

// resolve returns the input's URI, uploading a local file outside the file
// store root under upload_prefix, named by its content hash so that
// submitting it again uploads nothing new.
func (in input) resolve(ctx context.Context, r *storage.Router, c config) (string, error) {
	if in.uri != "" {
		return in.uri, nil
	}
	f, err := os.Open(in.path)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", in.name, err)
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return "", fmt.Errorf("--%s: read %s: %w", in.name, in.path, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	uri := strings.TrimRight(c.Storage.UploadPrefix, "/") + "/" + hex.EncodeToString(h.Sum(nil))[:16] + "-" + filepath.Base(in.path)
	if err := r.Put(ctx, uri, f, size); err != nil {
		return "", fmt.Errorf("--%s: upload %s to %s: %w", in.name, in.path, uri, err)
	}
	if in.frag != "" {
		uri += "#" + in.frag
	}
	return uri, nil
}

// checkExists reads an input's header through the CLI's own stores, when
// it has one for the URI's scheme, and reports what the worker would only
// find later: a missing object or tensor name, or a file that is not
// safetensors. What the CLI cannot judge (a bucket outside its own list,
// credentials, a store that is down) is left to the worker.
func checkExists(ctx context.Context, r *storage.Router, c config, name, uri string) error {
	ref, err := storage.ParseRef(uri)
	if err != nil {
		return fmt.Errorf("--%s: %w", name, err)
	}
	if (ref.Scheme == "file" && c.Storage.FileRoot == "") || (ref.Scheme == "s3" && c.Storage.S3.Endpoint == "") {
		return nil
	}
	_, err = r.Head(ctx, uri)
	if errors.Is(err, storage.ErrNotFound) || errors.Is(err, storage.ErrFormat) {
		return fmt.Errorf("--%s: %w (nothing was enqueued)", name, err)
	}
	return nil
}

// pinOf reads w through the CLI's own stores and returns the hex SHA-256
// of its tensor data: the pin --pin-w sets.
func pinOf(ctx context.Context, r *storage.Router, c config, uri string) (string, error) {
	ref, err := storage.ParseRef(uri)
	if err != nil {
		return "", fmt.Errorf("--w: %w", err)
	}
	if (ref.Scheme == "file" && c.Storage.FileRoot == "") || (ref.Scheme == "s3" && c.Storage.S3.Endpoint == "") {
		return "", fmt.Errorf("--pin-w: the CLI has no %s store configured to read w from (set it, or give --w-sha256)", ref.Scheme)
	}
	t, err := r.Head(ctx, uri)
	if err != nil {
		return "", fmt.Errorf("--pin-w: read w: %w (nothing was enqueued)", err)
	}
	b := make([]byte, t.Size)
	if err := r.Fetch(ctx, t, b); err != nil {
		return "", fmt.Errorf("--pin-w: read w: %w (nothing was enqueued)", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// resolveOut checks --out and returns the output object's URI: an s3:// or
// file:// URI without #name, or a local path under the file store root,
// which becomes a file:// URI. Each error says what to type instead.
func resolveOut(c config, v string) (string, error) {
	obj, frag, hasFrag := strings.Cut(v, "#")
	if hasFrag {
		return "", fmt.Errorf("--out %s: an output names an object, not a tensor: drop \"#%s\" (the outputs are stored in it under their own names: dx, dw, r), e.g. --out %s", v, frag, obj)
	}
	if strings.Contains(v, "://") {
		if _, err := storage.ParseRef(v); err != nil {
			return "", fmt.Errorf("--out: %w", err)
		}
		return v, nil
	}
	abs, err := filepath.Abs(v)
	if err != nil {
		return "", fmt.Errorf("--out: %w", err)
	}
	if underRoot(c, abs) {
		return "file://" + abs, nil
	}
	if c.Storage.FileRoot == "" {
		return "", fmt.Errorf("--out %s: a local path, and no file store root is configured (storage.file_root, RMSGRAD_FILE_ROOT, --root): give the output object's URI, e.g. --out s3://BUCKET/run1/%s, or --out file:///ABS/PATH/%s under the worker's storage.file_root, or start worker --dev in this directory", v, filepath.Base(abs), filepath.Base(abs))
	}
	return "", fmt.Errorf("--out %s: outside the file store root %s, where the worker writes local files: use e.g. --out %s, or an s3:// URI", v, c.Storage.FileRoot, filepath.Join(c.Storage.FileRoot, filepath.Base(abs)))
}
