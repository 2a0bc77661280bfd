// Command problems writes the table of errors of docs/api.md from the
// problem codes' pages (package problem): the lines between the markers
// <!-- problems:begin --> and <!-- problems:end --> are replaced. With
// -check it writes nothing and fails when the file is not what it would
// write. `make docs` runs it, `make docs-check` runs it with -check.
//
//	go run ./internal/apispec/problems [-check] docs/api.md
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/valruns/valruns/problem"
)

func main() {
	check := flag.Bool("check", false, "fail when the file is stale instead of writing it")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: problems [-check] docs/api.md")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *check); err != nil {
		fmt.Fprintln(os.Stderr, "problems:", err)
		os.Exit(1)
	}
}

func run(path string, check bool) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	updated, err := problem.ReplaceTable(old)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case bytes.Equal(old, updated):
		return nil
	case check:
		return fmt.Errorf("%s: the table of errors is stale: run make docs", path)
	}
	return os.WriteFile(path, updated, 0o644)
}
