package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/valruns/valruns/migrations"
	"github.com/valruns/valruns/models"
)

// migrateDoc says what each `migrate` action does, in its usage.
var migrateDoc = map[string]string{
	"up":     "Applies every pending migration (embedded in the binary) and prints the database's version.",
	"down":   "Rolls back the last applied migration.",
	"status": "Lists the migrations embedded in the binary, each applied (with the time) or pending.",
}

// cmdMigrate is the command `valruns migrate ACTION`.
func cmdMigrate(action string) func(context.Context, []string, io.Writer) error {
	return func(ctx context.Context, args []string, out io.Writer) error {
		fs := flags("migrate "+action, "migrate "+action, out, migrateDoc[action])
		if err := parseFlagsOnly(fs, args); err != nil {
			return err
		}
		a, err := open(ctx, forMigration)
		if err != nil {
			return err
		}
		defer a.close()
		p, err := migrations.NewProvider(models.SQLDB(a.db))
		if err != nil {
			return err
		}
		switch action {
		case "up":
			res, err := p.Up(ctx)
			if err != nil {
				return err
			}
			for _, r := range res {
				fmt.Fprintf(out, "applied %s (%s)\n", r.Source.Path, r.Duration.Round(time.Millisecond))
			}
			if err := a.makeKeyPartitions(ctx, a.db); err != nil {
				return err
			}
			v, _ := p.GetDBVersion(ctx)
			fmt.Fprintf(out, "database at version %d\n", v)
		case "down":
			r, err := p.Down(ctx)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "rolled back %s\n", r.Source.Path)
		case "status":
			st, err := p.Status(ctx)
			if err != nil {
				return err
			}
			for _, s := range st {
				applied := "pending"
				if s.State == "applied" {
					applied = "applied " + s.AppliedAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(out, "%-30s %s\n", s.Source.Path, applied)
			}
		default:
			return fmt.Errorf("unknown migrate action %q", action) // the command table names only the above
		}
		return nil
	}
}

func cmdCleanup(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("cleanup", "cleanup [--dry-run]", out,
		"Drops the idempotency keys' day partitions whose whole range has expired, and makes the partitions\n"+
			"ahead, as the worker's scheduled cleanup does, and prints how many keys went.")
	dry := fs.Bool("dry-run", false, "only count the keys that would go")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	keys := models.NewKeyStore(a.db)
	if *dry {
		n, err := keys.CountExpired(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%d expired idempotency keys would be deleted\n", n)
		return nil
	}
	// Logged once connected: where the work (what the worker's scheduled
	// cleanup does) begins, after the process's own start.
	a.log.InfoContext(ctx, "cleanup started", "ttl", a.cfg.IdempotencyTTL)
	c, err := keys.Clean(ctx, a.cfg.IdempotencyTTL)
	atLeast := ""
	if c.AtLeast {
		atLeast = "at least "
	}
	fmt.Fprintf(out, "deleted %s%d expired idempotency keys\n", atLeast, c.Keys)
	return err
}
