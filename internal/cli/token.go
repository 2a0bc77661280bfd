package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/valruns/valruns/models"
)

func cmdTokenCreate(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("token create", "token create --org SLUG", out,
		"Creates an API token for the organisation and prints it, alone on stdout (TOKEN=$(valruns token\n"+
			"create --org acme)). It is shown this once, and a reminder saying so goes to stderr: only its\n"+
			"SHA-256 and its first characters (the display prefix) are stored.")
	slug := fs.String("org", "", "`SLUG` of the organisation the token acts for (required)")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	a, org, err := openForOrg(ctx, *slug)
	if err != nil {
		return err
	}
	defer a.close()
	token, _, err := models.NewTokenStore(a.db).Create(ctx, org.ID)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, token) // alone on stdout: TOKEN=$(valruns token create --org acme)
	notice(out, "This token is shown once, now: only its SHA-256 is stored, so it cannot be shown again.\n"+
		"Keep it in your secret store; a lost token is replaced with a new one (and `valruns token revoke`).")
	return nil
}

// tokenJSON is a token in `token list --json`: never the token itself.
type tokenJSON struct {
	ID        string     `json:"id"`
	Prefix    string     `json:"prefix"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

func cmdTokenList(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("token list", "token list --org SLUG [--json]", out,
		"Lists the organisation's tokens, revoked ones included, oldest first. PREFIX is the start of\n"+
			"the token, which is all that is kept of it in clear; REVOKED is - while the token works.")
	slug := fs.String("org", "", "`SLUG` of the organisation (required)")
	asJSON := fs.Bool("json", false, "print a JSON array (revoked_at: null while the token works)")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	a, org, err := openForOrg(ctx, *slug)
	if err != nil {
		return err
	}
	defer a.close()
	tokens, err := models.NewTokenStore(a.db).List(ctx, org.ID)
	if err != nil {
		return err
	}
	if *asJSON {
		list := make([]tokenJSON, len(tokens))
		for i, t := range tokens {
			list[i] = tokenJSON{ID: t.ID, Prefix: t.Display, CreatedAt: t.CreatedAt.UTC(), RevokedAt: t.RevokedAt}
			if t.RevokedAt != nil {
				r := t.RevokedAt.UTC()
				list[i].RevokedAt = &r
			}
		}
		return writeJSON(out, list)
	}
	if len(tokens) == 0 {
		fmt.Fprintf(out, "%s has no tokens: create one with `valruns token create --org %s`\n", org.Slug, org.Slug)
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPREFIX\tCREATED\tREVOKED")
	for _, t := range tokens {
		revoked := "-"
		if t.RevokedAt != nil {
			revoked = timeText(*t.RevokedAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.ID, t.Display, timeText(t.CreatedAt), revoked)
	}
	return tw.Flush()
}

func cmdTokenRevoke(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("token revoke", "token revoke ID|PREFIX", out,
		"Revokes one token, named by its id, by its display prefix (or the start of it: vr_ and at least\n"+
			"one more character) as `valruns token list` shows it, or by the whole token. A prefix that\n"+
			"matches several tokens revokes none and lists their ids. Revoking a revoked token says so.\n"+
			"API processes started afterwards refuse the token at once; running ones within AUTH_CACHE_TTL,\n"+
			"for which they trust a token they have verified.")
	operands, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(operands) != 1 {
		return badUsage("want one ID or PREFIX, got %d", len(operands))
	}
	ref := operands[0]
	if err := models.CheckTokenRef(ref); err != nil {
		return badUsage("%v", err)
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	t, err := models.NewTokenStore(a.db).RevokeRef(ctx, ref)
	if amb, ok := errors.AsType[*models.AmbiguousTokenError](err); ok {
		return &exitError{amb.Error() + "; nothing revoked"}
	}
	switch {
	case errors.Is(err, models.ErrNotFound):
		return &exitError{fmt.Sprintf("no token matches %q (list an organisation's tokens with `valruns token list --org SLUG`)", ref)}
	case errors.Is(err, models.ErrAlreadyRevoked):
		fmt.Fprintf(out, "token %s (%s of %s) was already revoked at %s\n", t.ID, t.Display, t.OrgSlug, timeText(*t.RevokedAt))
		return nil
	case err != nil:
		return err
	}
	fmt.Fprintf(out, "revoked token %s (%s of %s) at %s\n", t.ID, t.Display, t.OrgSlug, timeText(*t.RevokedAt))
	fmt.Fprintf(out, "API processes started from now on refuse it; running ones within AUTH_CACHE_TTL (%s in this environment).\n", a.cfg.AuthCacheTTL)
	return nil
}

// openForOrg opens the database for work and finds the organisation that
// --org names (a usage error when it names none).
func openForOrg(ctx context.Context, slug string) (*app, *models.Organization, error) {
	if slug == "" {
		return nil, nil, badUsage("--org SLUG is required")
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return nil, nil, err
	}
	org, err := orgBySlug(ctx, models.NewOrgStore(a.db), slug)
	if err != nil {
		a.close()
		return nil, nil, err
	}
	return a, org, nil
}
