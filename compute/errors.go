package compute

import (
	"errors"
	"fmt"
)

// Sentinel errors; every error returned by this package and by backends
// wraps one of them.
var (
	// ErrInvalidArgument: a dispatch's arguments are wrong (shape, count,
	// dtype, params, aliasing, missing barrier). Permanent.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrUnsupported: the backend cannot run this (no device, no driver).
	ErrUnsupported = errors.New("unsupported")
	// ErrDevice: the device failed while executing a command buffer. The
	// same work may succeed when retried.
	ErrDevice = errors.New("device error")
	// ErrCommitted: the command buffer was already committed.
	ErrCommitted = errors.New("command buffer already committed")
)

// ArgError describes one invalid argument of one kernel dispatch.
type ArgError struct {
	Kernel Kernel // the kernel being dispatched
	Arg    string // the argument: "x", "rows", "params", ...
	Want   string // what was expected
	Got    string // what was given
}

func (e *ArgError) Error() string {
	return fmt.Sprintf("%s: %s: want %s, got %s", e.Kernel, e.Arg, e.Want, e.Got)
}

// Is makes errors.Is(err, ErrInvalidArgument) true for an *ArgError.
func (e *ArgError) Is(target error) bool { return target == ErrInvalidArgument }

func argErr(k Kernel, arg, want string, got any) error {
	return &ArgError{Kernel: k, Arg: arg, Want: want, Got: fmt.Sprint(got)}
}
