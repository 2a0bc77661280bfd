// Package lint lints the API's OpenAPI documents with a linter that is not
// ours: Redocly CLI (pinned in package.json, installed with npm ci by
// scripts/install-bench-tools.sh speclint), with its recommended rules.
// kin-openapi's own validation, which make docs runs, lets through what the
// linters call errors (nullable without a type, issue 29).
package lint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/proctest"
)

// accepted are the findings of the recommended rules that the documents
// keep, each for a reason. Every other finding, error or warning, fails.
var accepted = map[string]string{
	// The paths of workflows, runs and webhook endpoints end with a slash on
	// purpose (their canonical form; every route answers with and without
	// it, no redirect). The documents say so: info.description and
	// x-trailing-slash, checked below.
	"no-path-trailing-slash": "deliberate trailing slashes",
	// /, /healthz and /metrics answer no 4xx: they take no input.
	"operation-4xx-response": "public routes without input",
	// The project has chosen no licence for the API description.
	"info-license": "no licence named",
}

// TestOpenAPIDocumentsLint lints docs/openapi.json (OpenAPI 3.0) and
// docs/swagger.json (Swagger 2.0, served to Swagger UI): no finding but the
// accepted ones, and a document that has trailing slashes says they are
// deliberate.
func TestOpenAPIDocumentsLint(t *testing.T) {
	t.Parallel()
	proctest.NeedNodePackages(t, "speclint", "the spec lint test (Redocly CLI)")
	here, err := os.Getwd()
	require.NoError(t, err)
	redocly := filepath.Join(here, "node_modules", ".bin", "redocly")
	for _, name := range []string{"openapi.json", "swagger.json"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			doc := filepath.Join(here, "..", "..", "..", "docs", name)
			// --format=json: the findings on stdout, whatever the exit status
			// (1 when there are errors, such as the accepted trailing slashes).
			cmd := exec.Command(redocly, "lint", doc, "--format=json")
			cmd.Dir = t.TempDir() // no redocly.yaml: the recommended rules
			// Nothing to send home, no update check: a test talks to no one.
			cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			runErr := cmd.Run()
			var report struct {
				Totals   struct{ Errors, Warnings int }
				Problems []struct {
					RuleID   string `json:"ruleId"`
					Severity string
					Message  string
					Location []struct{ Pointer string }
				}
			}
			require.NoError(t, json.Unmarshal(stdout.Bytes(), &report), "redocly lint %s (%v):\n%s%s", name, runErr, stdout.String(), stderr.String())
			require.Equal(t, report.Totals.Errors+report.Totals.Warnings, len(report.Problems), "every finding is listed")
			var unaccepted []string
			slashes := 0
			for _, p := range report.Problems {
				if p.RuleID == "no-path-trailing-slash" {
					slashes++
				}
				if _, ok := accepted[p.RuleID]; ok {
					continue
				}
				where := ""
				if len(p.Location) > 0 {
					where = p.Location[0].Pointer
				}
				unaccepted = append(unaccepted, fmt.Sprintf("%s %s at %s: %s", p.Severity, p.RuleID, where, p.Message))
			}
			require.Empty(t, unaccepted, "redocly lint %s: fix the annotations or internal/apispec, then make docs", name)

			if slashes > 0 {
				b, err := os.ReadFile(doc)
				require.NoError(t, err)
				var d struct {
					Info          struct{ Description string }
					TrailingSlash struct{ Canonical, Optional, Redirect bool } `json:"x-trailing-slash"`
				}
				require.NoError(t, json.Unmarshal(b, &d))
				require.True(t, d.TrailingSlash.Canonical && d.TrailingSlash.Optional && !d.TrailingSlash.Redirect,
					"%s has paths with a trailing slash: x-trailing-slash says they are deliberate", name)
				require.Contains(t, d.Info.Description, "Trailing slashes are deliberate")
			}
		})
	}
}
