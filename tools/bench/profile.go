package main

// The profile: where a start's time goes, and a run's, under new-key starts on
// serve + worker, from the processes' own histograms (/metrics before and
// after the window); CPU per start, and the top of the API's CPU profile.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// histStat is a histogram's observations over a window: their count and mean.
type histStat struct {
	Count float64
	Mean  time.Duration
}

type profileResult struct {
	Clients, Starts int
	Window          time.Duration
	Failed          string
	// A start: its HTTP request, its wait for a writer, its statement (and
	// how many starts a statement carried), its hand-off from the commit;
	// a run: from its start to the queue, to a worker, to its final state.
	HTTP, Waiting, Statement, Handoff, Queued, Picked, Final histStat
	BatchMean                                                float64
	Client                                                   time.Duration // the mean latency the load saw
	APICPU, WorkerCPU                                        time.Duration // per start
	Top                                                      []string      // `go tool pprof -top -cum` of the API
}

// measureProfile measures one run at clients, serve started with its pprof.
func (e *env) measureProfile(ctx context.Context, clients int, t timing, scratch string) profileResult {
	r := profileResult{Clients: clients}
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", e.port+3)
	r.Failed = failed("profile", e.onRig(ctx, []string{"serve"}, []string{"PPROF_ADDR=" + pprofAddr}, func(rg *rig, ps []*proc) error {
		worker, err := rg.start(ctx, "worker")
		if err != nil {
			return err
		}
		api, wrk := rg.base+"/metrics", fmt.Sprintf("http://127.0.0.1:%d/metrics", e.port+2)
		next := newKeys(rg.base, e.orgs[0], e.orgs[0].Token)
		var apiBefore, wrkBefore metricsText
		top, errs := make(chan error, 1), []error(nil)
		scrape := func(url string) metricsText {
			m, err := scrape(url)
			errs = append(errs, err)
			return m
		}
		sm, wm := &usageMeter{pid: ps[0].cmd.Process.Pid}, &usageMeter{pid: worker.cmd.Process.Pid}
		res := runLoad(ctx, r.Clients, t.Warm, t.Dur, next, loadOptions{OnWindow: func(open bool) {
			sm.window(open)
			wm.window(open)
			if open {
				apiBefore, wrkBefore = scrape(api), scrape(wrk)
				// pprof fetches the profile itself and keeps it in PPROF_TMPDIR.
				go func() {
					cmd := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-cum", "-nodecount=25",
						"-seconds", strconv.Itoa(max(int(t.Dur/time.Second)-1, 1)), e.bin, "http://"+pprofAddr+"/debug/pprof/profile")
					cmd.Env = append(os.Environ(), "PPROF_TMPDIR="+scratch)
					out, err := cmd.Output()
					for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
						if !strings.HasPrefix(l, "File:") && !strings.HasPrefix(l, "Build ID:") && !strings.HasPrefix(l, "Time:") {
							r.Top = append(r.Top, l)
						}
					}
					top <- err
				}()
				return
			}
			apiAfter, wrkAfter := scrape(api), scrape(wrk)
			r.HTTP = apiAfter.hist(apiBefore, "valruns_http_request_duration_seconds", `route="/api/workflows/:id/start"`)
			r.Waiting = apiAfter.hist(apiBefore, "valruns_start_phase_seconds", `phase="waiting_writer"`)
			r.Statement = apiAfter.hist(apiBefore, "valruns_start_phase_seconds", `phase="statement"`)
			if batches := apiAfter.hist(apiBefore, "valruns_start_batch_starts", ""); batches.Count > 0 {
				r.BatchMean = r.Waiting.Count / batches.Count
			}
			r.Handoff = apiAfter.hist(apiBefore, "valruns_run_handoff_seconds", "")
			r.Queued = apiAfter.hist(apiBefore, "valruns_run_start_to_queued_seconds", "")
			r.Picked = wrkAfter.hist(wrkBefore, "valruns_run_start_to_picked_seconds", "")
			r.Final = wrkAfter.hist(wrkBefore, "valruns_run_start_to_final_seconds", `status="passed"`)
		}})
		if err := <-top; err != nil {
			r.Top = []string{"no CPU profile: " + err.Error()}
		}
		if r.Window, r.Starts = res.Duration, res.Requests; r.Starts > 0 {
			for _, d := range res.Latencies {
				r.Client += d
			}
			n := time.Duration(r.Starts)
			r.APICPU, r.WorkerCPU, r.Client = sm.CPU/n, wm.CPU/n, r.Client/n
		}
		return errors.Join(errs...)
	}))
	return r
}

// metricsText is a /metrics page: its sample lines.
type metricsText []string

func scrape(url string) (metricsText, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	var lines metricsText
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines, sc.Err()
}

// value sums the samples named name whose labels hold every one of labels
// (a comma-separated list of label="value").
func (m metricsText) value(name, labels string) float64 {
	var sum float64
	for _, l := range m {
		metric, val, _ := strings.Cut(l, " ")
		n, lbls, _ := strings.Cut(metric, "{")
		if n != name || slices.ContainsFunc(strings.Split(labels, ","), func(w string) bool { return !strings.Contains(lbls, w) }) {
			continue
		}
		if f, err := strconv.ParseFloat(strings.Fields(val + " ")[0], 64); err == nil {
			sum += f
		}
	}
	return sum
}

// hist is what the histogram name{labels} observed between before and m.
func (m metricsText) hist(before metricsText, name, labels string) histStat {
	count := m.value(name+"_count", labels) - before.value(name+"_count", labels)
	if count <= 0 {
		return histStat{}
	}
	sum := m.value(name+"_sum", labels) - before.value(name+"_sum", labels)
	return histStat{Count: count, Mean: time.Duration(sum / count * float64(time.Second))}
}

// profileStage is a line of the profile's tables: what it covers, its figure.
type profileStage struct {
	what   string
	figure func(p profileResult) string
}

// profileSection is where the time goes at each count profiled, a column
// each: a start's stages, a run's, and the API's CPU profile.
func profileSection(ps []profileResult) section {
	var b strings.Builder
	mean := func(in func(time.Duration) string) func(histStat) string {
		return func(h histStat) string {
			if h.Count == 0 {
				return "-"
			}
			return in(h.Mean)
		}
	}
	d, d3 := mean(ms), mean(ms3) // a lone start's stages take fractions of a millisecond
	profileTable(&b, "a start, ms", ps, []profileStage{
		{"the window: starts measured (per second)", func(p profileResult) string {
			return fmt.Sprintf("%d in %s (%.0f/s)", p.Starts, p.Window.Round(time.Second), perSec(p.Starts, p.Window))
		}},
		{"the request as its client sees it, sent to answer read", func(p profileResult) string { return ms3(p.Client) }},
		{"the HTTP request, in the API (`valruns_http_request_duration_seconds`): the two below and the rest", func(p profileResult) string { return d3(p.HTTP) }},
		{"waiting for a writer (`valruns_start_phase_seconds{phase=\"waiting_writer\"}`): from the start's submission to its statement being sent", func(p profileResult) string { return d3(p.Waiting) }},
		{"its statement (`phase=\"statement\"`): a connection, PostgreSQL, the commit; starts per statement", func(p profileResult) string {
			return fmt.Sprintf("%s (%.1f)", d3(p.Statement), p.BatchMean)
		}},
		{"the rest of the request (the request less the two above): authentication, decoding, the key, the answer", func(p profileResult) string {
			if p.HTTP.Count == 0 || p.Waiting.Count == 0 || p.Statement.Count == 0 {
				return "-"
			}
			return ms3(p.HTTP.Mean - p.Waiting.Mean - p.Statement.Mean)
		}},
		{"the hand-off to the queue (`valruns_run_handoff_seconds`): from the commit, the dispatcher's buffer, the gate's script, the push", func(p profileResult) string { return d3(p.Handoff) }},
		{"CPU per start: API / worker", func(p profileResult) string { return ms3(p.APICPU) + " / " + ms3(p.WorkerCPU) }},
	})
	b.WriteString("\n")
	profileTable(&b, "a run, from its created_at until, ms", ps, []profileStage{
		{"it is queued for a worker", func(p profileResult) string { return d(p.Queued) }},
		{"a worker begins it", func(p profileResult) string { return d(p.Picked) }},
		{"it is final", func(p profileResult) string { return d(p.Final) }},
	})
	for _, p := range ps {
		if p.Failed == "" {
			fmt.Fprintf(&b, "\n**The API's CPU profile at %s** over the window (`go tool pprof -top -cum`; the profile is kept in the scratch directory):\n\n", clientsText(p.Clients))
			b.WriteString("```\n" + strings.Join(p.Top, "\n") + "\n```\n")
		}
	}
	intro := "A closed loop of new-key starts on `serve` + `worker` at each count, one run each. Each figure is a mean over the window, " +
		"from the processes' own histograms read before and after it (the client's from the load's latencies); " +
		"the hand-off runs after the commit, while the answer is sent: no request waits for it."
	return section{Heading: "## Where the time goes", Intro: intro, Body: b.String()}
}

// profileTable writes stages as a table, a column per run: FAILED and why if failed.
func profileTable(b *strings.Builder, head string, ps []profileResult, stages []profileStage) {
	fmt.Fprintf(b, "| %s |", head)
	for _, p := range ps {
		fmt.Fprintf(b, " %s |", clientsText(p.Clients))
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(ps)) + "\n")
	for _, st := range stages {
		b.WriteString("| " + cell(st.what) + " |")
		for _, p := range ps {
			f := "FAILED: " + short(p.Failed, 200)
			if p.Failed == "" {
				f = st.figure(p)
			}
			b.WriteString(" " + cell(f) + " |")
		}
		b.WriteString("\n")
	}
}
