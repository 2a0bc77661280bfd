package main

// Horizontal scale (issue 17): the end-to-end loop against 1, 2 and 4 API
// processes and 1 and 2 workers on this one machine, the load spread over
// the APIs by client. The processes share nothing but PostgreSQL and Redis,
// so on one machine more of them add no CPU: the table shows what they cost
// and that nothing else is shared (no coordination, no process that must be
// the only one), not a speed-up two cores cannot give.

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// scaleTopology is one row of the table: API processes and workers.
type scaleTopology struct{ APIs, Workers int }

var (
	scaleFull  = []scaleTopology{{1, 1}, {2, 1}, {4, 1}, {1, 2}, {2, 2}, {4, 2}}
	scaleQuick = []scaleTopology{{1, 1}, {2, 2}}
)

// measureScale runs the loop of side s at each topology.
func (e *env) measureScale(ctx context.Context, s *side, tops []scaleTopology, clients int, warm, dur time.Duration) []e2eResult {
	var out []e2eResult
	for _, top := range tops {
		if ctx.Err() != nil {
			break
		}
		t := e2eTarget{side: s, mode: modeSeparate, apis: top.APIs, workers: top.Workers}
		r := e.measureE2E(ctx, t, clients, warm, dur, dur+30*time.Second)
		out = append(out, r)
		if r.Failed == "" {
			say("scale %d API + %d worker: %5.0f started/s %5.0f finished/s (%.2f), start-to-final p50 %s p99 %s ms, %d connections",
				r.APIs, r.Workers, r.StartedPerSec(), r.FinishedPerSec(), r.Ratio(), ms(r.FinalP50), ms(r.FinalP99), r.DBConns)
		}
	}
	return out
}

func (x *experimentLog) writeScale(b *strings.Builder) {
	fmt.Fprintf(b, "\n### Horizontal scale\n\n")
	fmt.Fprintf(b, "The end-to-end loop (new-key starts, %d clients, %s measured, a fresh database each) against N `valruns serve` and M `valruns worker` processes of this binary on this one machine, "+
		"client i sending to API i mod N (each API its own port: what a load balancer does). The processes share only PostgreSQL and Redis: no leader, no sticky session, no process that must be alone; "+
		"any of them may be added or killed (the fault suite does). On two cores more processes add no CPU, so this measures what they cost, not a speed-up. "+
		"CPU is per run started, summed over the processes of a kind; RSS is the largest API process's; connections the most PostgreSQL saw.\n\n", x.Clients, x.ScaleDur)
	b.WriteString("| APIs | workers | started/s | finished/s | finished / started | start-to-final p50 ms | p99 ms | start answer p50 / p99 ms | API CPU ms/run | worker CPU ms/run | API peak RSS MB | DB connections | errors |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range x.Scale {
		if r.Failed != "" {
			fmt.Fprintf(b, "| %d | %d | FAILED: %s ||||||||||\n", r.APIs, r.Workers, cell(short(r.Failed, 300)))
			continue
		}
		fmt.Fprintf(b, "| %d | %d | %.0f | %.0f | %.2f | %s | %s | %s / %s | %s | %s | %s | %d | %d |\n",
			r.APIs, r.Workers, r.StartedPerSec(), r.FinishedPerSec(), r.Ratio(), ms(r.FinalP50), ms(r.FinalP99),
			ms(r.StartP50), ms(r.StartP99), ms3(r.ServerCPU), ms3(r.WorkerCPU), mb(r.PeakRSSKB), r.DBConns, r.Errors)
	}
}
