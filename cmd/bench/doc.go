// Command bench measures rmsgrad against the ceilings of the machine it runs
// on, in one run: the asynq queue with a no-op handler, raw minio-go GET and
// PUT against versitygw, a memory copy against each compute backend present,
// and (when bin/worker exists) the worker end to end with and without
// batching. It starts its own redis-server and versitygw on free loopback
// ports, prints a table of absolute figures and ratios (ours / ceiling), and
// writes the same table as Markdown plus a PNG chart into -out (report/).
//
// Ratios are what matter: the machine is shared, so absolute figures move
// from run to run, but every figure in one report comes from the same run.
//
// Run it through make bench (scripts/bench.sh), which installs or locates
// the servers first.
package main
