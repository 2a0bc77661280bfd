package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/models"
)

func cmdOrgCreate(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("org create", "org create NAME [--slug SLUG]", out,
		"Creates an organisation and prints its slug and id. The slug addresses the organisation in the\n"+
			"other commands; it is derived from NAME unless --slug is given: lowercase, accents dropped\n"+
			"(\"Ünïcödé Shop\": unicode-shop), runs of other characters become -. A NAME with letters that\n"+
			"have no ASCII spelling (東京) is refused: give its slug with --slug. A slug that is taken is\n"+
			"refused: nothing is created.")
	slug := fs.String("slug", "", "the `SLUG` to address the organisation by: 1 to 63 of a-z, 0-9 and -, starting with a letter or digit\n(default: derived from NAME)")
	operands, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(operands) == 0:
		return badUsage("missing NAME")
	case len(operands) > 1:
		return badUsage("want one NAME, got %d words (quote a name with spaces: \"Acme Corp\")", len(operands))
	}
	name := operands[0]
	if err := models.CheckName(name); err != nil {
		return badUsage("NAME: %v", err)
	}
	if *slug != "" {
		if err := models.CheckSlug(*slug); err != nil {
			return badUsage("--slug: %v", err)
		}
	} else if _, err := models.Slugify(name); err != nil {
		return badUsage("NAME: %v: give the slug with --slug SLUG (a-z, 0-9 and -)", err)
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	org, err := models.NewOrgStore(a.db).CreateWithSlug(ctx, name, *slug)
	if taken, ok := errors.AsType[*models.SlugTakenError](err); ok {
		if *slug == "" {
			return &exitError{fmt.Sprintf("slug %q, derived from the name, is taken by another organisation (see `valruns org list`): "+
				"nothing created; choose a slug with --slug SLUG", taken.Slug)}
		}
		return &exitError{fmt.Sprintf("slug %q is taken by another organisation (see `valruns org list`): nothing created", taken.Slug)}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "slug=%s id=%s\n", org.Slug, org.ID)
	return nil
}

// orgJSON is an organisation in `org list --json`.
type orgJSON struct {
	Slug string `json:"slug"`
	ID   string `json:"id"`
	Name string `json:"name"`
	// MonthlyRunQuota: null means DEFAULT_MONTHLY_RUN_QUOTA applies, 0 unlimited.
	MonthlyRunQuota *int64 `json:"monthly_run_quota"`
	// StartRate (starts per second) and RunShare (runs in the queue at
	// once): null means ORG_START_RATE / ORG_RUN_SHARE apply, 0 unlimited.
	StartRate *int      `json:"start_rate"`
	RunShare  *int      `json:"run_share"`
	CreatedAt time.Time `json:"created_at"`
}

func cmdOrgList(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("org list", "org list [--json]", out,
		"Lists every organisation, oldest first. QUOTA is the organisation's monthly run quota, RATE\n"+
			"its starts per second, SHARE its runs in the queue at once: \"default\" when\n"+
			"DEFAULT_MONTHLY_RUN_QUOTA, ORG_START_RATE or ORG_RUN_SHARE applies, \"unlimited\" when it is 0.")
	asJSON := fs.Bool("json", false, "print a JSON array (monthly_run_quota: null = default, 0 = unlimited)")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	orgs, err := models.NewOrgStore(a.db).List(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		list := make([]orgJSON, len(orgs))
		for i, o := range orgs {
			list[i] = orgJSON{Slug: o.Slug, ID: o.ID, Name: o.Name, MonthlyRunQuota: o.MonthlyRunQuota, StartRate: o.StartRate, RunShare: o.RunShare, CreatedAt: o.CreatedAt.UTC()}
		}
		return writeJSON(out, list)
	}
	if len(orgs) == 0 {
		fmt.Fprintln(out, "no organisations yet: create one with `valruns org create NAME`")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SLUG\tID\tQUOTA\tRATE\tSHARE\tCREATED\tNAME")
	for _, o := range orgs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", o.Slug, o.ID, limitText(o.MonthlyRunQuota, ""),
			limitText(o.StartRate, "/s"), limitText(o.RunShare, ""), timeText(o.CreatedAt), o.Name)
	}
	return tw.Flush()
}

// orgLimits are the organisation's own limits `org quota`, `org rate` and
// `org share` set: one command, orgLimit.run, for the three.
var (
	orgQuota = orgLimit[int64]{
		name: "quota", what: "monthly run quota", unit: " runs a month",
		env: "DEFAULT_MONTHLY_RUN_QUOTA", appliedBy: "the API processes",
		help: "Sets how many runs the organisation may start per calendar month (UTC); past it a start is\n" +
			"answered 429 quota_exceeded.",
		def: func(c config.Config) int64 { return c.DefaultMonthlyRunQuota },
		max: math.MaxInt64,
		set: (*models.OrgStore).SetQuota,
	}
	orgRate = orgLimit[int]{
		name: "rate", what: "start rate", unit: " starts per second",
		env: "ORG_START_RATE", appliedBy: "the running processes",
		help: "Sets how many starts per second the organisation may make, across every API process (a\n" +
			"token bucket in Redis whose burst is one second's worth); past it a start is answered 429\n" +
			"rate_limited with Retry-After, and nothing is stored against its Idempotency-Key.",
		def: func(c config.Config) int { return c.OrgStartRate },
		max: math.MaxInt32,
		set: (*models.OrgStore).SetStartRate,
	}
	orgShare = orgLimit[int]{
		name: "share", what: "run share", unit: " runs in the queue at once",
		env: "ORG_RUN_SHARE", appliedBy: "the running processes",
		help: "Sets how many of the organisation's runs may wait in the queue (Redis) at once: another\n" +
			"organisation's run waits behind at most this many of them. The organisation's other runs\n" +
			"wait their turn in PostgreSQL, in order, and enter the queue as its runs finish.",
		def:       func(c config.Config) int { return c.OrgRunShare },
		zeroMeans: "adaptive: 0.5 s of its runs on the worker slots alive",
		max:       math.MaxInt32,
		set:       (*models.OrgStore).SetRunShare,
	}
)

// orgLimit is one of an organisation's own limits, as `org NAME SLUG
// N|default` sets it: a whole number from 0 to max (0 or "unlimited":
// none), or "default" for the setting env of the processes.
type orgLimit[T int | int64] struct {
	// name is the subcommand; what and unit name the limit and its value
	// in messages ("start rate", " starts per second").
	name, what, unit string
	// env is the setting that applies by default, appliedBy who reads it.
	env, appliedBy string
	// help is the usage's first paragraph: what the limit limits.
	help string
	def  func(config.Config) T
	// max is the largest value the database column holds.
	max T
	// zeroMeans: what a default of 0 means, when not unlimited.
	zeroMeans string
	set       func(*models.OrgStore, context.Context, string, *T) error
}

func (l orgLimit[T]) run(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("org "+l.name, "org "+l.name+" SLUG N|default", out, l.help,
		"  N        a whole number; 0 (or \"unlimited\") means unlimited\n"+
			"  default  "+l.env+" of "+l.appliedBy+" applies\n\n"+
			"An API process trusts what it read with a token for AUTH_CACHE_TTL, so running servers apply\n"+
			"the change within AUTH_CACHE_TTL.")
	operands, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(operands) != 2 {
		return badUsage("want SLUG and N|default, got %d argument(s)", len(operands))
	}
	slug, value := operands[0], operands[1]
	limit, err := l.parse(value)
	if err != nil {
		return err
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	orgs := models.NewOrgStore(a.db)
	org, err := orgBySlug(ctx, orgs, slug)
	if err != nil {
		return err
	}
	if err := l.set(orgs, ctx, org.ID, limit); err != nil {
		return err
	}
	effective := limitText(limit, l.unit)
	if limit == nil {
		def := l.def(a.cfg)
		text := limitText(&def, l.unit)
		if def == 0 && l.zeroMeans != "" {
			text = l.zeroMeans
		}
		effective = fmt.Sprintf("default: %s of %s applies (%s in this environment)", l.env, l.appliedBy, text)
	}
	fmt.Fprintf(out, "%s: %s is now %s\n", org.Slug, l.what, effective)
	fmt.Fprintf(out, "Running API processes apply it within AUTH_CACHE_TTL (%s in this environment); new ones at once.\n", a.cfg.AuthCacheTTL)
	return nil
}

// parse reads N, "unlimited" (0) or "default" (nil).
func (l orgLimit[T]) parse(value string) (*T, error) {
	switch value {
	case "default":
		return nil, nil
	case "unlimited":
		return new(T), nil
	}
	n, err := strconv.ParseInt(value, 10, 64)
	if err != nil || n < 0 || n > int64(l.max) {
		if int64(l.max) == math.MaxInt64 {
			return nil, badUsage("%s %q: want a whole number >= 0 (0: unlimited) or default", l.name, value)
		}
		return nil, badUsage("%s %q: want a whole number from 0 to %d (0: unlimited) or default", l.name, value, l.max)
	}
	return new(T(n)), nil
}

// limitText is a limit as the org commands show it.
func limitText[T int | int64](n *T, unit string) string {
	switch {
	case n == nil:
		return "default"
	case *n == 0:
		return "unlimited"
	}
	return fmt.Sprintf("%d%s", *n, unit)
}

// orgBySlug finds an organisation; an unknown slug is an error that says
// how to find the right one.
func orgBySlug(ctx context.Context, orgs *models.OrgStore, slug string) (*models.Organization, error) {
	org, err := orgs.BySlug(ctx, slug)
	if errors.Is(err, models.ErrNotFound) {
		return nil, &exitError{fmt.Sprintf("no organisation with slug %q (list them with `valruns org list`, create one with `valruns org create NAME`)", slug)}
	}
	return org, err
}
