package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/rmsgrad/rmsgrad/gateway"
	"github.com/rmsgrad/rmsgrad/internal/cliflag"
)

// cmdToken is `gateway token --name NAME [--append FILE]`: it makes a new
// token and prints it (the only time it is shown), and appends its hashed
// line to FILE (made 0600 when missing), or prints that line on stderr.
func cmdToken(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gateway token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: gateway token --name NAME [--append FILE]\n\nMakes a bearer token, prints it once on stdout, and appends its hashed\nline to FILE (or prints that line on stderr).\n\nflags:\n")
		fs.PrintDefaults()
	}
	name := fs.String("name", "", "the token's name in logs and rate limits (required); rotate a key by giving the new token the same name")
	appendTo := fs.String("append", "", "token file to append the hashed line to")
	if err := cliflag.Parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	if *name == "" {
		return cliflag.Usagef("token: --name is required")
	}
	tok, err := gateway.NewToken()
	if err != nil {
		return err
	}
	line, err := gateway.TokenLine(*name, tok)
	if err != nil {
		return err
	}
	if *appendTo == "" {
		fmt.Fprintf(stderr, "token file line (add it to a file in auth.token_files):\n%s\n", line)
	} else {
		f, err := os.OpenFile(*appendTo, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("token: %w", err)
		}
		_, err = fmt.Fprintln(f, line)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("token: %w", err)
		}
		fmt.Fprintf(stderr, "appended the hashed line for %q to %s (gateways reload it within auth.reload_interval)\n", *name, *appendTo)
	}
	_, err = fmt.Fprintln(stdout, tok)
	return err
}
