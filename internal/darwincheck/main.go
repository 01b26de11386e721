package main

import (
	"context"
	"flag"
	"fmt"
	"os"
)

func main() {
	var opts Options
	flag.StringVar(&opts.GOOS, "goos", "darwin", "target GOOS")
	flag.StringVar(&opts.GOARCH, "goarch", "arm64", "target GOARCH")
	flag.BoolVar(&opts.Tests, "test", true, "also check the packages' _test.go files")
	flag.StringVar(&opts.Overlay, "overlay", "", "a go build -overlay JSON file")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: darwincheck [flags] packages...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	opts.Patterns = flag.Args()
	if len(opts.Patterns) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	rep, err := Check(context.Background(), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(os.Stderr, "%s\n", e)
	}
	if len(rep.Errors) > 0 {
		fmt.Fprintf(os.Stderr, "darwincheck: %d type errors (%s/%s, cgo)\n", len(rep.Errors), opts.GOOS, opts.GOARCH)
		os.Exit(1)
	}
	fmt.Printf("darwincheck: %s/%s: %d packages type-check (targets: %v)\n", opts.GOOS, opts.GOARCH, len(rep.Checked), rep.Targets)
}
