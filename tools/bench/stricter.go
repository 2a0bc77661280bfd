package main

// Issue 48's targets for starts: valruns beside the stricter peer, the
// peer without its BullMQ enqueue (express-idempotency on Redis and `pg`
// doing one INSERT), at 1 and 8 clients, and at 1 client beside the
// database's limit of that INSERT (pgbench of the peer's script).

import (
	"fmt"
	"strings"
	"time"
)

// strictCounts are the counts the stricter peer runs at.
var strictCounts = []int{1, 8}

// strictGoal is issue 48's target at clients: at least ratio times the
// stricter peer's rps, at 1 client a p50 below its, and at least limit
// times pgbench of the peer's INSERT (0: no target).
func strictGoal(clients int) (ratio float64, p50 bool, limit float64) {
	switch clients {
	case 1:
		return 1.2, true, 0.6
	case 8:
		return 1.5, false, 0
	}
	return 0, false, 0
}

// strictCheck is issue 48's target of scenario at clients beside the
// stricter peer p, and when there is one, beside the limit lim.
func strictCheck(scenario string, clients int, v, p, lim *row) (peer check, limit *check) {
	bound, p50, atLeast := strictGoal(clients)
	what := fmt.Sprintf("%s, %s: valruns vs ", scenario, clientsText(clients))
	peer = check{Name: what + "the peer without its enqueue (issue 48)", Target: ">= " + times(bound) + " it"}
	var below func(a, b time.Duration) bool
	if p50 {
		peer.Target += ", p50 < its"
		below = func(a, b time.Duration) bool { return a < b }
	}
	peer = versus(peer, bound, v, p, below)
	if atLeast > 0 {
		c := ratio(check{Name: what + "the limit of the peer's INSERT (issue 48)", Target: ">= " + times(atLeast) + " the limit"},
			measured(v) && measured(lim), rpsOf(v), rpsOf(lim), atLeast, false, fmt.Sprintf("%.0f rps / %.0f tps", rpsOf(v), rpsOf(lim)))
		limit = &c
	}
	return peer, limit
}

// strictRows are the starts issue 48 names, at each of its counts.
func (r *results) strictRows(each func(scenario string, clients int, v, p, lim *row)) {
	for _, sc := range []string{noKey, newKey} {
		for _, n := range strictCounts {
			each(sc, n, r.rowAt(valrunsSide, sc, n), r.rowAt(strictSide, sc, n), r.rowAt("pgbench", pgbenchPeerScenario, n))
		}
	}
}

// strictChecks are issue 48's targets of starts.
func (r *results) strictChecks() []check {
	var out []check
	r.strictRows(func(sc string, n int, v, p, lim *row) {
		peer, limit := strictCheck(sc, n, v, p, lim)
		if out = append(out, peer); limit != nil {
			out = append(out, *limit)
		}
	})
	return out
}

// strictTable is issue 48's table: starts beside the stricter peer, and
// beside the limit.
func (r *results) strictTable() string {
	var b strings.Builder
	b.WriteString("\n### Issue 48: against the stricter peer\n\n" +
		"The peer without its enqueue (`PEER_ENQUEUE=0`: express-idempotency on Redis and `pg` doing one `INSERT`, no BullMQ job), " +
		"in the same rounds as valruns and the peer above, at 1 and 8 clients; the limit is the tables' limit, pgbench of that `INSERT`.\n\n")
	b.WriteString("| scenario | clients | valruns rps | stricter peer rps | valruns / it | valruns p50 / p99 ms | its p50 / p99 ms | target | result | valruns / limit | target | result |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	r.strictRows(func(sc string, n int, v, p, lim *row) {
		peer, limit := strictCheck(sc, n, v, p, lim)
		versusLimit := "- | -"
		if limit != nil {
			versusLimit = cell(limit.Target) + " | " + limit.result()
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", sc, n, rpsCell(v), rpsCell(p), fraction(rpsOf(v), rpsOf(p)),
			latCell(v), latCell(p), cell(peer.Target), peer.result(), fraction(rpsOf(v), rpsOf(lim)), versusLimit)
	})
	return b.String()
}
