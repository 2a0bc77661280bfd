// Command apply merges the recorded examples (internal/apispec/examples.json)
// into the spec swag generated: `go run ./internal/apispec/apply DIR`, where
// DIR is the output of swag init (docs/). See package apispec.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/valruns/valruns/internal/apispec"
)

func main() {
	examples := flag.String("examples", apispec.DefaultFile, "the recorded examples")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: apply [-examples FILE] DIR\n\nAdds the recorded examples to the spec swag wrote into DIR.")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	f, err := apispec.Load(*examples)
	if err == nil {
		err = apispec.ApplyDir(flag.Arg(0), f)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "apply:", err)
		os.Exit(1)
	}
}
