// Command enqueue posts RMSNorm-backward jobs to a rmsgrad queue and waits
// for their results.
//
//	enqueue submit --x URI|FILE --w URI|FILE --dy URI|FILE --out URI [--eps E] [--outputs dx,dw,r] [--id ID] [--wait] [--json]
//	enqueue synth  --count N --shape ROWSxDIM[,ROWSxDIM...] [--wait]
//	enqueue wait   ID...
//	enqueue status ID
//	enqueue result ID
//	enqueue shards
//	enqueue reshard --to N
//
// Connection settings come from flags, the environment (RMSGRAD_REDIS_ADDR,
// RMSGRAD_REDIS_PASSWORD, ...) or configs/enqueue.yaml.
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
configs/enqueue.yaml when present). Secrets only from the environment
(RMSGRAD_REDIS_PASSWORD, RMSGRAD_S3_ACCESS_KEY, RMSGRAD_S3_SECRET_KEY,
RMSGRAD_SIGNING_KEY) or files the config names.

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
		err = cmdStatus(ctx, args[1:], stdout)
	case "result":
		err = cmdResult(ctx, args[1:], stdout)
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
	fmt.Fprintf(stderr, "enqueue %s: %v\n", args[0], err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return 1
}
