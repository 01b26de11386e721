// Command enqueue posts RMSNorm-backward jobs to a rmsgrad queue and waits
// for their results.
//
//	enqueue submit --x URI|FILE --w URI|FILE --dy URI|FILE --out URI [--eps E] [--outputs dx,dw,r] [--grad-dtype f32|bf16|f16] [--id ID] [--wait] [--json]
//	enqueue synth  --count N --shape ROWSxDIM[,ROWSxDIM...] [--dtype f32|bf16|f16|X/W/DY[,...]] [--grad-dtype f32|bf16|f16] [--wait]
//	enqueue wait   ID...
//	enqueue status ID
//	enqueue result ID
//	enqueue shards
//	enqueue reshard --to N
//
// Connection settings come from flags, the environment (RMSGRAD_REDIS_ADDR,
// RMSGRAD_REDIS_PASSWORD, ...) or configs/enqueue.yaml; with no Redis
// address set, from a dev worker's state file (internal/devstate).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/rmsgrad/rmsgrad/internal/cliflag"
)

const usage = `usage: enqueue <command> [flags]

commands:
  submit   enqueue one job (local input files are uploaded first)
  synth    enqueue random jobs for load and smoke tests, optionally verify them
  wait     wait for jobs to finish, with progress, and print a summary
  status   print a job's state
  result   print a completed job's result
  shards   print the queue's shards, their Redis Cluster nodes and counts
  reshard  move the queue to another number of shards (drains the old ones)

Run 'enqueue <command> -h' for its flags. Every command takes --json.

Connection settings: flags, then the environment (RMSGRAD_REDIS_ADDR,
RMSGRAD_REDIS_CLUSTER_ADDRS, RMSGRAD_QUEUE, RMSGRAD_SHARDS, RMSGRAD_FILE_ROOT,
RMSGRAD_UPLOAD_PREFIX, RMSGRAD_S3_ENDPOINT),
then the config file (--config, RMSGRAD_ENQUEUE_CONFIG, else
configs/enqueue.yaml when present). When none of them sets a Redis address,
a dev worker (worker --dev) started in this directory is found through
./rmsgrad-dev/dev.json; --dev-dir DIR or RMSGRAD_DEV_DIR name another.
Secrets only from the environment (RMSGRAD_REDIS_PASSWORD,
RMSGRAD_S3_ACCESS_KEY, RMSGRAD_S3_SECRET_KEY, RMSGRAD_SIGNING_KEY) or files
the config names. Every key: docs/configuration.md.

Exit status: 0 success; 1 a job failed, or an error (Redis unreachable,
storage, invalid job); 2 bad usage; 3 'result' of a job not finished yet.
`

// quietRedis drops go-redis's own log lines ("connection pool: failed to
// dial after 5 attempts"): the CLI reports the failed call itself, once,
// with the address and where it was configured.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func main() {
	redis.SetLogger(quietRedis{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// exitError carries a process exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "submit":
		err = cmdSubmit(ctx, args[1:], stdout, stderr)
	case "synth":
		err = cmdSynth(ctx, args[1:], stdout, stderr)
	case "wait":
		err = cmdWait(ctx, args[1:], stdout, stderr)
	case "status":
		err = cmdStatus(ctx, args[1:], stdout, stderr)
	case "result":
		err = cmdResult(ctx, args[1:], stdout, stderr)
	case "shards":
		err = cmdShards(ctx, args[1:], stdout, stderr)
	case "reshard":
		err = cmdReshard(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "enqueue: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if !cliflag.Printed(err) {
		fmt.Fprintf(stderr, "enqueue %s: %v\n", args[0], err)
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return cliflag.ExitCode(err)
}

// subcommands' synopses, the first lines of their --help.
var synopses = map[string]string{
	"submit": `usage: enqueue submit --x X --w W --dy DY --out OUT [flags]

Enqueue one job. X, W, DY: tensor URIs (s3://bucket/key#name,
file:///abs/path#name) or local safetensors files (path or path#name): a
file under the file store root is passed as a file:// URI, any other is
uploaded under the upload prefix first. OUT: the output object, an
s3://bucket/key or file:///abs/path URI (no #name: the outputs are stored
in it under their own names), or a local path under the file store root.
Inputs are checked to exist before the job is enqueued.
`,
	"synth":  "usage: enqueue synth --count N --shape ROWSxDIM[,...] [flags]\n\nEnqueue seeded random jobs; with --wait, check every output against the float64 oracle.\n",
	"wait":   "usage: enqueue wait [flags] ID...\n\nWait for jobs to finish, with progress, then print a table and a summary.\n",
	"status": "usage: enqueue status [flags] ID\n\nPrint a job's state, retries and last error.\n",
	"result": "usage: enqueue result [flags] ID\n\nPrint a completed job's result (exit 1 if it failed, 3 if it has not finished).\n",
}

// newFlags makes a subcommand's flag set: its --help prints the synopsis,
// then the flags.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "%s\nflags:\n", synopses[name])
		fs.PrintDefaults()
	}
	return fs
}
