package main

// Idle: what an idle `valruns worker`, and an idle `valruns serve
// --worker` (`make run`), cost on a Redis and a database of their own: the
// Redis commands per second (the change in INFO commandstats), and
// PostgreSQL's transactions per second (pg_stat_database;
// pg_stat_statements would need a library the server preloads).

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// idleMost is issue 47's target: Redis commands per second, at most.
const idleMost = 5.0

// idleSettle is how long a process runs before the window opens: its
// start-up is not idling.
const idleSettle = 3 * time.Second

type idleResult struct {
	Mode     string // what runs: worker, serve --worker
	Window   time.Duration
	Commands float64            // Redis commands per second
	Top      map[string]float64 // per second, by command
	Xacts    float64            // PostgreSQL transactions per second
	Failed   string
}

// measureIdle measures each idle process for dur.
func measureIdle(ctx context.Context, e *env, dur time.Duration) []idleResult {
	var out []idleResult
	for _, what := range []string{"worker", "serve --worker"} {
		r := idleResult{Mode: what}
		r.Failed = failed("idle "+what, e.onRig(ctx, []string{what}, nil, func(rg *rig, _ []*proc) error {
			return e.idle(ctx, rg, &r, dur)
		}))
		say("idle %s: %.1f Redis commands/s, %.1f PostgreSQL transactions/s %s", what, r.Commands, r.Xacts, r.Failed)
		out = append(out, r)
	}
	return out
}

// idle measures r on rg, its process started.
func (e *env) idle(ctx context.Context, rg *rig, r *idleResult, dur time.Duration) (err error) {
	opt, _ := redis.ParseURL(rg.redisURL)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	sleep(ctx, idleSettle)
	xacts := func() (n int64) {
		if err == nil {
			err = e.admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, rg.db).Scan(&n)
		}
		return n
	}
	before, x0 := commandStats(ctx, rdb, &err), xacts()
	t0 := time.Now()
	sleep(ctx, dur)
	after, x1 := commandStats(ctx, rdb, &err), xacts()
	r.Window = time.Since(t0)
	secs := r.Window.Seconds()
	after["info"]-- // the harness's own first INFO
	r.Top = map[string]float64{}
	for name, n := range after {
		if d := float64(n - before[name]); d > 0 {
			r.Top[name] = d / secs
			r.Commands += d / secs
		}
	}
	r.Xacts = float64(x1-x0) / secs
	return err
}

// commandStats is INFO commandstats: the calls of each command so far,
// from lines such as cmdstat_evalsha:calls=230,usec=33580,... A failure
// is kept in *errp.
func commandStats(ctx context.Context, rdb *redis.Client, errp *error) map[string]int64 {
	info, err := rdb.Info(ctx, "commandstats").Result()
	*errp = cmp.Or(*errp, err)
	out := map[string]int64{}
	for _, l := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(l), "cmdstat_"), ":calls=")
		calls, _, _ := strings.Cut(rest, ",")
		if n, err := strconv.ParseInt(calls, 10, 64); ok && err == nil {
			out[name] = n
		}
	}
	return out
}

func idleSection(rs []idleResult) section {
	var b strings.Builder
	var cs []check
	b.WriteString("| process | Redis commands/s | the most sent, per second | PostgreSQL transactions/s |\n|---|---|---|---|\n")
	for _, r := range rs {
		c := check{Name: fmt.Sprintf("idle `valruns %s`: Redis commands per second", r.Mode), Target: fmt.Sprintf("<= %.0f/s", idleMost)}
		if r.Failed != "" {
			cs = append(cs, notMeasured(c))
			fmt.Fprintf(&b, "| `valruns %s` | FAILED: %s | | |\n", r.Mode, cell(short(r.Failed, 300)))
			continue
		}
		c.Measured, c.Pass = fmt.Sprintf("%.1f/s over %s", r.Commands, r.Window.Round(time.Second)), r.Commands <= idleMost
		cs = append(cs, c)
		names := slices.SortedFunc(maps.Keys(r.Top), func(a, b string) int { return cmp.Or(cmp.Compare(r.Top[b], r.Top[a]), strings.Compare(a, b)) })
		var top []string
		for _, n := range names[:min(len(names), 5)] {
			top = append(top, fmt.Sprintf("%s %.1f", strings.ToUpper(n), r.Top[n]))
		}
		fmt.Fprintf(&b, "| `valruns %s` | %.1f | %s | %.1f |\n", r.Mode, r.Commands, strings.Join(top, ", "), r.Xacts)
	}
	intro := fmt.Sprintf("Each process idle for its window, after %s to start, on a Redis and a database of its own: the Redis commands it sent "+
		"per second (the change in `INFO commandstats`, less the harness's one INFO), the most sent, and PostgreSQL's transactions per second "+
		"for its database (`pg_stat_database`).", idleSettle)
	return section{Heading: "## Idle", Intro: intro, Checks: cs, Body: b.String()}
}
