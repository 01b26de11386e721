package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/rmsgrad/rmsgrad/internal/cliflag"
	"github.com/rmsgrad/rmsgrad/jobs"
)

// cmdShards prints the queue's layout: its shards, the hash slot and
// Cluster node of each, and what each holds.
func cmdShards(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("shards", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: enqueue shards [flags]\n\nPrints the queue's layout: its shards, the hash slot and Cluster node of\neach, and what each holds.\n\nflags:\n")
		fs.PrintDefaults()
	}
	var cf connFlags
	cf.register(fs)
	if err := cliflag.Parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	c, err := loadConfig(&cf)
	if err != nil {
		return err
	}
	c.Shards = 0 // show what Redis records, whatever this CLI expects
	client, err := openClient(c)
	if err != nil {
		return err
	}
	defer client.Close()
	l, shards, err := client.Shards(ctx)
	if err != nil {
		return err
	}
	if cf.json {
		return json.NewEncoder(stdout).Encode(map[string]any{"layout": layoutJSON(l), "shards": shards})
	}
	fmt.Fprintln(stdout, l.String())
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tASYNQ QUEUE\tSLOT\tNODE\tPENDING\tACTIVE\tSCHEDULED\tRETRY\tARCHIVED\tCOMPLETED")
	perNode := map[string]int{}
	for _, s := range shards {
		node := s.Node
		if node == "" {
			node = "-"
		}
		perNode[s.Node]++
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", s.Index, s.Queue, s.Slot, node,
			s.Pending, s.Active, s.Scheduled, s.Retry, s.Archived, s.Completed)
	}
	tw.Flush()
	for node, n := range perNode {
		if node != "" && n > 1 && len(perNode) < len(shards) {
			fmt.Fprintf(stdout, "note: %d shards on node %s; to spread them, move a shard's slot to another master (docs/scaling.md, Placement)\n", n, node)
		}
	}
	return nil
}

func layoutJSON(l jobs.Layout) map[string]any {
	m := map[string]any{"queue": l.Queue, "shards": l.Shards, "asynq_queues": l.Queues()}
	if l.To != 0 {
		m["resharding_to"] = l.To
	}
	if l.Prev != 0 {
		m["prev"], m["prev_until"] = l.Prev, l.PrevUntil.UTC().Format(time.RFC3339)
	}
	return m
}

// cmdReshard moves the queue to another number of shards: it stops
// enqueues, waits until every client has seen that and the workers have
// drained the old shards, then records the new count (jobs.Client.Reshard).
func cmdReshard(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reshard", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: enqueue reshard --to N [flags]\n       enqueue reshard --abort\n\nSpreads the queue over N shards: stops enqueues, waits for the workers to\ndrain the old shards, then records the new count (docs/scaling.md).\n\nflags:\n")
		fs.PrintDefaults()
	}
	var cf connFlags
	cf.register(fs)
	to := fs.Int("to", 0, "the new number of shards (1 = unsharded)")
	settle := fs.Duration("settle", jobs.LayoutMaxAge+jobs.LayoutRefresh, "how long enqueues stay stopped before the drain check, so every client sees it; shorten only when no other client runs")
	drain := fs.Duration("drain", 10*time.Minute, "how long to wait for the workers to drain the old shards; after it nothing changes")
	abort := fs.Bool("abort", false, "cancel a reshard whose command died (enqueues resume under the current layout)")
	if err := cliflag.Parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	if !*abort && *to < 1 {
		return cliflag.Usagef("--to N (N >= 1) is required (enqueue reshard --help shows the flags)")
	}
	c, err := loadConfig(&cf)
	if err != nil {
		return err
	}
	c.Shards = 0
	client, err := openClient(c)
	if err != nil {
		return err
	}
	defer client.Close()
	if *abort {
		if err := client.AbortReshard(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "queue %q: reshard cancelled; enqueues resume\n", c.Queue)
		return nil
	}
	l, err := client.Reshard(ctx, *to, jobs.ReshardOptions{Settle: *settle, Drain: *drain, Retention: c.Retention,
		Progress: func(msg string) {
			if !cf.json {
				fmt.Fprintf(stderr, "reshard: %s\n", msg)
			}
		}})
	if err != nil {
		return err
	}
	if cf.json {
		return json.NewEncoder(stdout).Encode(layoutJSON(l))
	}
	fmt.Fprintf(stdout, "%s\nworkers that follow Redis (shards: 0) switch within %v; set shards: %d where a worker or client pins the count\n",
		l.String(), jobs.LayoutRefresh, l.Shards)
	return nil
}
