package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/rmsgrad/rmsgrad/internal/cliflag"
	"github.com/rmsgrad/rmsgrad/jobs"
)

// outcome is one waited-for job.
type outcome struct {
	ID      string       `json:"id"`
	State   string       `json:"state"`
	Result  *jobs.Result `json:"result,omitempty"`
	Error   string       `json:"error,omitempty"`
	Elapsed float64      `json:"wait_ms"`
}

func cmdWait(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("wait")
	var cf connFlags
	cf.register(fs)
	timeout := fs.Duration("timeout", 0, "give up after this long (0: wait until done or interrupted)")
	if err := cliflag.Parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	ids := fs.Args()
	if len(ids) == 0 {
		return cliflag.Usagef("no job ids given")
	}
	c, err := loadConfig(&cf)
	if err != nil {
		return err
	}
	client, err := openClient(c)
	if err != nil {
		return err
	}
	defer client.Close()
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	outs := waitAll(ctx, client, ids, progressTo(stderr, cf.json))
	return report(stdout, cf.json, outs)
}

// waitAll waits for every id with bounded concurrency, calling progress
// after each one ends.
func waitAll(ctx context.Context, client *jobs.Client, ids []string, progress func(done, failed, total int)) []outcome {
	outs := make([]outcome, len(ids))
	var mu sync.Mutex
	done, failed := 0, 0
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	start := time.Now()
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			res, err := client.Wait(ctx, id)
			o := outcome{ID: id, State: "completed", Result: res, Elapsed: ms(time.Since(start))}
			var fe *jobs.JobFailedError
			switch {
			case errors.As(err, &fe):
				o.State, o.Error = "failed", fe.Msg
			case err != nil:
				o.State, o.Error = "unknown", err.Error()
			}
			mu.Lock()
			outs[i] = o
			done++
			if o.State != "completed" {
				failed++
			}
			progress(done, failed, len(ids))
			mu.Unlock()
		}()
	}
	wg.Wait()
	return outs
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// progressTo returns a progress printer: a bar redrawn in place on a
// terminal, a line every 10% otherwise, nothing in JSON mode.
func progressTo(w io.Writer, quiet bool) func(done, failed, total int) {
	if quiet {
		return func(int, int, int) {}
	}
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	last := -1
	return func(done, failed, total int) {
		if tty {
			const width = 30
			n := done * width / total
			fmt.Fprintf(w, "\r[%s%s] %d/%d done, %d failed", strings.Repeat("#", n), strings.Repeat(" ", width-n), done, total, failed)
			if done == total {
				fmt.Fprintln(w)
			}
			return
		}
		if step := done * 10 / total; step != last {
			last = step
			fmt.Fprintf(w, "progress: %d/%d done, %d failed\n", done, total, failed)
		}
	}
}

// report prints the outcomes as a table (or JSON) and fails if any job did.
func report(stdout io.Writer, asJSON bool, outs []outcome) error {
	nFailed := 0
	for _, o := range outs {
		if o.State != "completed" {
			nFailed++
		}
	}
	if asJSON {
		if err := json.NewEncoder(stdout).Encode(outs); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tROWSxDIM\tBATCH/JOBS\tTOTAL_MS\tERROR")
		for _, o := range outs {
			shape, batch, total := "-", "-", "-"
			if r := o.Result; r != nil {
				shape = fmt.Sprintf("%dx%d", r.Rows, r.Dim)
				batch = fmt.Sprintf("%s/%d", r.BatchID, r.BatchJobs)
				total = fmt.Sprintf("%.1f", r.Timings.Total)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", o.ID, o.State, shape, batch, total, o.Error)
		}
		tw.Flush()
		fmt.Fprintf(stdout, "%d jobs: %d completed, %d failed\n", len(outs), len(outs)-nFailed, nFailed)
	}
	if nFailed > 0 {
		return &exitError{1, fmt.Errorf("%d of %d jobs did not complete", nFailed, len(outs))}
	}
	return nil
}

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return oneJob(ctx, "status", args, stdout, stderr, func(st *jobs.Status, asJSON bool) error {
		if asJSON {
			return json.NewEncoder(stdout).Encode(st)
		}
		fmt.Fprintf(stdout, "job %s in queue %s: %s (retried %d of %d)", st.ID, st.Queue, st.State, st.Retried, st.MaxRetry)
		if st.LastErr != "" {
			fmt.Fprintf(stdout, "; last error: %s", st.LastErr)
		}
		fmt.Fprintln(stdout)
		return nil
	})
}

func cmdResult(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return oneJob(ctx, "result", args, stdout, stderr, func(st *jobs.Status, asJSON bool) error {
		switch st.State {
		case jobs.StateCompleted:
			return printOutcome(stdout, asJSON, st.ID, st.Result, nil)
		case jobs.StateFailed:
			return printOutcome(stdout, asJSON, st.ID, nil, &jobs.JobFailedError{ID: st.ID, Retried: st.Retried, Msg: st.LastErr})
		}
		return &exitError{3, fmt.Errorf("job %s is %s: no result yet", st.ID, st.State)}
	})
}

func oneJob(ctx context.Context, name string, args []string, stdout, stderr io.Writer, show func(*jobs.Status, bool) error) error {
	fs := newFlags(name)
	var cf connFlags
	cf.register(fs)
	if err := cliflag.Parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return cliflag.Usagef("want exactly one job id, got %d", fs.NArg())
	}
	c, err := loadConfig(&cf)
	if err != nil {
		return err
	}
	client, err := openClient(c)
	if err != nil {
		return err
	}
	defer client.Close()
	st, err := client.Status(ctx, fs.Arg(0))
	if err != nil {
		return err
	}
	return show(st, cf.json)
}

// percentile returns the p-th percentile (0..100) of xs, sorting them.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	i := int(p / 100 * float64(len(xs)-1))
	return xs[i]
}
