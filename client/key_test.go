package client_test

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/valruns/valruns/client"
)

// uuidV4 is the canonical lower-case form of a UUID of version 4 and the
// RFC 4122 variant.
var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestNewKey: keys are UUIDv4 and do not repeat.
func TestNewKey(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 10000 {
		k := client.NewKey()
		isTrue(t, uuidV4.MatchString(k), "%q is not a canonical UUIDv4", k)
		isFalse(t, seen[k], "%s repeated", k)
		seen[k] = true
	}
}

// TestNoServerDependencies: a program embedding the client pulls in
// nothing outside the standard library, in particular none of the
// server's dependencies (gin, gorm, pgx, asynq).
func TestNoServerDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps",
		"-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "github.com/valruns/valruns/client").CombinedOutput()
	noError(t, err, "%s", out)
	equal(t, []string{"github.com/valruns/valruns/client"}, strings.Fields(string(out)))
}
