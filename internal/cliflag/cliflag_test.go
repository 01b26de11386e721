package cliflag

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
)

func newSet() *flag.FlagSet {
	fs := flag.NewFlagSet("prog", flag.ContinueOnError)
	fs.String("name", "", "a name")
	return fs
}

func TestParse(t *testing.T) {
	for _, c := range []struct {
		args              []string
		code              int
		printed           bool
		stdout, stderr    string // substrings; "" means the stream must be empty
		stdoutNot, errNot string
	}{
		{args: []string{"-name", "a"}, code: 0},
		{args: []string{"-h"}, code: 0, printed: true, stdout: "-name"},
		{args: []string{"--help"}, code: 0, printed: true, stdout: "Usage of prog"},
		{args: []string{"--nope"}, code: 2, printed: true, stderr: "flag provided but not defined: -nope", stdoutNot: "-name"},
		{args: []string{"-name"}, code: 2, printed: true, stderr: "flag needs an argument"},
	} {
		var out, errb bytes.Buffer
		err := Parse(newSet(), c.args, &out, &errb)
		if got := ExitCode(err); got != c.code {
			t.Errorf("%q: exit code %d, want %d (err %v)", c.args, got, c.code, err)
		}
		if got := Printed(err); got != c.printed {
			t.Errorf("%q: Printed = %v, want %v", c.args, got, c.printed)
		}
		for _, s := range []struct{ name, got, want string }{{"stdout", out.String(), c.stdout}, {"stderr", errb.String(), c.stderr}} {
			if s.want == "" && s.got != "" {
				t.Errorf("%q: %s %q, want nothing", c.args, s.name, s.got)
			}
			if !strings.Contains(s.got, s.want) {
				t.Errorf("%q: %s %q lacks %q", c.args, s.name, s.got, s.want)
			}
		}
		if c.code == 2 && !strings.Contains(errb.String(), "-name") {
			t.Errorf("%q: a usage error shows the flags on stderr: %q", c.args, errb.String())
		}
	}
}

func TestParseCustomUsage(t *testing.T) {
	fs := newSet()
	fs.Usage = func() { fmt.Fprintln(fs.Output(), "usage: prog submit --name N") }
	var out, errb bytes.Buffer
	if err := Parse(fs, []string{"-h"}, &out, &errb); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	if out.String() != "usage: prog submit --name N\n" || errb.Len() != 0 {
		t.Fatalf("help: stdout %q, stderr %q", out.String(), errb.String())
	}
}

func TestExitCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		code int
	}{
		{nil, 0},
		{flag.ErrHelp, 0},
		{fmt.Errorf("wrapped: %w", flag.ErrHelp), 0},
		{Usagef("--out is required"), 2},
		{fmt.Errorf("submit: %w", Usagef("bad")), 2},
		{errors.New("redis down"), 1},
	} {
		if got := ExitCode(c.err); got != c.code {
			t.Errorf("ExitCode(%v) = %d, want %d", c.err, got, c.code)
		}
	}
	if Printed(Usagef("x")) {
		t.Error("a Usagef error is not printed by Parse: the program must print it")
	}
}
