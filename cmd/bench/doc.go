// Command bench measures rmsgrad against the ceilings of the machine it runs
// on, in one run: the asynq queue with a no-op handler, raw minio-go GET and
// PUT against versitygw, a memory copy against each compute backend present,
// and bin/worker end to end (its default settings, a separate process, its
// CPU from /proc) on small, medium and large jobs, with and without
// batching, optionally against a baseline worker binary. It then runs the
// small load in process on the worker's exact wiring under pprof and splits
// the CPU profile into network, compute and the worker's own per-job
// overhead. It starts its own redis-server and versitygw on free loopback
// ports, prints a table of absolute figures and ratios (ours / ceiling), and
// writes the same table as Markdown plus a PNG chart and the profiles into
// -out (report/).
//
// Ratios are what matter: the machine is shared, so absolute figures move
// from run to run; the small load's runs are alternated and repeated
// (-repeat) and the table gives medians.
//
// Run it through make bench (scripts/bench.sh), which installs or locates
// the servers and builds bin/worker first.
package main
