package main

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// errNoWorker says the end-to-end runs were skipped because the worker
// binary is missing.
var errNoWorker = errors.New("end to end not run")

func benchE2E(ctx context.Context, e *env, o options, shapes []shape, q queueResult, st map[string]storageResult) ([]row, []string, error) {
	if _, err := os.Stat(o.worker); err != nil {
		return nil, nil, fmt.Errorf("%w: worker binary %s: %w", errNoWorker, o.worker, err)
	}
	return nil, nil, fmt.Errorf("%w: not implemented yet", errNoWorker)
}
