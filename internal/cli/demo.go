package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/validate"
)

// The demo workflow `make run` creates: an invoice needs a customer and a
// positive total, and large totals are flagged.
var (
	DemoSchema = json.RawMessage(`{"type":"object","required":["customer","total"],` +
		`"properties":{"customer":{"type":"string","minLength":1},"total":{"type":"number"}}}`)
	DemoAssertions = []validate.Assertion{
		{Name: "positive_total", Expr: "submission.total > 0", Severity: "error", Message: "total must be positive"},
		{Name: "large_total", Expr: "submission.total < 10000", Severity: "warning", Message: "total is unusually large"},
	}
)

// cmdDemo makes sure the demo organisation, a demo token (kept in a file,
// since a token is shown only once) and the demo workflow exist, and prints
// them as shell assignments. Running it again reuses what exists.
func cmdDemo(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("demo", "demo [--token-file PATH]", out,
		"Makes sure the demo organisation (slug demo), an API token of it and its workflow \"demo invoice\"\n"+
			"(a customer and a positive total; a total of 10000 or more is flagged) exist, and prints them as\n"+
			"shell assignments for eval: DEMO_ORG, DEMO_TOKEN, DEMO_WORKFLOW. make run runs it. A token is\n"+
			"shown only once, so the demo token is kept in --token-file; running demo again reuses all three\n"+
			"(and replaces a kept token that no longer works, as after a database reset).")
	tokenFile := fs.String("token-file", ".dev/demo-token", "`PATH` of the file the demo token is kept in between runs")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()

	orgs := models.NewOrgStore(a.db)
	org, err := orgs.BySlug(ctx, "demo")
	if errors.Is(err, models.ErrNotFound) {
		org, err = orgs.Create(ctx, "demo")
	}
	if err != nil {
		return err
	}

	tokens := models.NewTokenStore(a.db)
	token := ""
	if b, err := os.ReadFile(*tokenFile); err == nil {
		token = strings.TrimSpace(string(b))
		if p, err := tokens.Authenticate(ctx, token); err != nil || p.OrgID != org.ID {
			token = "" // the database was reset: issue a new one
		}
	}
	if token == "" {
		if token, _, err = tokens.Create(ctx, org.ID); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(*tokenFile), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(*tokenFile, []byte(token+"\n"), 0o600); err != nil {
			return err
		}
	}

	workflows := models.NewWorkflowStore(a.db)
	wf, err := workflows.ByName(ctx, org.ID, "demo invoice")
	if errors.Is(err, models.ErrNotFound) {
		_, assertions, cerr := validate.Compile(DemoSchema, DemoAssertions)
		if cerr != nil {
			return cerr
		}
		ab, _ := json.Marshal(assertions)
		wf = &models.Workflow{OrgID: org.ID, Name: "demo invoice", Schema: models.JSON(DemoSchema), Assertions: ab}
		err = workflows.Create(a.db.WithContext(ctx), wf)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "DEMO_ORG=%s\nDEMO_TOKEN=%s\nDEMO_WORKFLOW=%s\n", org.Slug, token, wf.ID)
	return nil
}
