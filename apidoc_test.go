package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apispec"
	"github.com/valruns/valruns/internal/cli"
	"github.com/valruns/valruns/validate"
)

// The spec's examples of the workflow create and the start (recorded by
// handlers' TestAPIExamples) are the demo workflow `make run` creates and
// the submission its curl line starts: what a reader sees in Swagger UI is
// what works against the demo.
func TestAPIExamplesAreTheDemo(t *testing.T) {
	f, err := apispec.Load(apispec.DefaultFile)
	require.NoError(t, err)

	create := f.Operations["POST /api/workflows/"]
	require.NotNil(t, create)
	var wf struct {
		Name       string
		Schema     json.RawMessage
		Assertions []validate.Assertion
	}
	require.NoError(t, json.Unmarshal(create.Request.Body, &wf))
	require.Equal(t, "demo invoice", wf.Name)
	require.JSONEq(t, string(cli.DemoSchema), string(wf.Schema))
	require.Equal(t, cli.DemoAssertions, wf.Assertions)

	start := f.Operations["POST /api/workflows/{id}/start/"]
	require.NotNil(t, start)
	var body bytes.Buffer
	require.NoError(t, json.Compact(&body, start.Request.Body))
	makefile, err := os.ReadFile("Makefile")
	require.NoError(t, err)
	require.Contains(t, strings.ReplaceAll(string(makefile), `\"`, `"`), "-d '"+body.String()+"'",
		"the start example is the request make run prints")

	// The key of make run's curl is its own: a step of the docs that
	// suggests a key to try (the Swagger UI's retry) must not suggest that
	// one, or the reader's first Execute is a replay of the curl.
	m := regexp.MustCompile(`Idempotency-Key: ([^'"\s]+)`).FindSubmatch(makefile)
	require.NotNil(t, m, "make run prints a start with an Idempotency-Key")
	docs, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	for _, file := range append([]string{"README.md"}, docs...) {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		require.NotContains(t, string(b), "`"+string(m[1])+"`", "%s suggests the key make run's curl uses", file)
	}
}
