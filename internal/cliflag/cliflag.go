// Package cliflag holds the command-line conventions every rmsgrad program
// follows (cmd/worker, cmd/enqueue, and any program added beside them):
//
//   - -h or --help prints the usage on stdout and exits 0;
//   - a usage error (an unknown flag, a bad value) prints the error and the
//     usage on stderr and exits 2;
//   - any other error exits 1.
//
// A program parses its flags with Parse and ends with
// os.Exit(cliflag.ExitCode(err)).
package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// UsageError is bad usage: the command line could not be parsed, or a
// flag's value or a required flag is wrong. ExitCode maps it to 2.
type UsageError struct {
	Err     error
	printed bool // by Parse, with the usage
}

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a UsageError with a formatted message.
func Usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// Parse parses args into fs. With -h or --help it writes the usage (fs.Usage
// when set, else a list of the flags) to stdout and returns flag.ErrHelp;
// on a parse error the flag package's message and the usage go to stderr
// and the error returned is a *UsageError. fs's output is left at stderr.
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	usage := fs.Usage
	fs.Usage = func() {} // printed below, to the stream the outcome calls for
	defer func() { fs.Usage = usage }()
	fs.SetOutput(stderr)
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		printUsage(fs, usage, stdout)
		fs.SetOutput(stderr)
		return flag.ErrHelp
	default:
		printUsage(fs, usage, stderr)
		return &UsageError{Err: err, printed: true}
	}
}

func printUsage(fs *flag.FlagSet, usage func(), w io.Writer) {
	fs.SetOutput(w)
	if usage != nil {
		usage()
		return
	}
	fmt.Fprintf(w, "usage: %s [flags]\n\nflags:\n", fs.Name())
	fs.PrintDefaults()
}

// ExitCode is the process exit status for err: 0 for nil and flag.ErrHelp,
// 2 for a *UsageError, 1 otherwise.
func ExitCode(err error) int {
	var ue *UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		return 2
	default:
		return 1
	}
}

// Printed reports whether err has been written out already, so that the
// program does not print it again: help, and the parse errors Parse
// printed with the usage.
func Printed(err error) bool {
	var ue *UsageError
	return errors.Is(err, flag.ErrHelp) || (errors.As(err, &ue) && ue.printed)
}
