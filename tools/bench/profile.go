package main

// The profile: where a start's time goes, and a run's, under a closed loop
// of new-key starts on `valruns serve` + `valruns worker`, from the
// processes' own histograms (/metrics before and after the window); the
// CPU per start of each, and the top of the API's CPU profile.

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
	// how many starts a statement carried); a run: from its start to the
	// queue, to a worker, to its final state.
	HTTP, Waiting, Statement, Queued, Picked, Final histStat
	BatchMean                                       float64
	APICPU, WorkerCPU                               time.Duration // per start
	Top                                             []string      // `go tool pprof -top -cum` of the API
}

func (e *env) measureProfile(ctx context.Context, clients int, warm, dur time.Duration, scratch string) profileResult {
	r := profileResult{Clients: clients}
	if err := e.profile(ctx, &r, warm, dur, scratch); err != nil {
		r.Failed = err.Error()
		say("profile: %v", err)
	}
	return r
}

func (e *env) profile(ctx context.Context, r *profileResult, warm, dur time.Duration, scratch string) error {
	rg, err := e.newRig(ctx)
	if err != nil {
		return err
	}
	defer rg.close()
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", e.port+3)
	srv, err := rg.start(ctx, "serve", "PPROF_ADDR="+pprofAddr)
	if err != nil {
		return err
	}
	worker, err := rg.start(ctx, "worker")
	if err != nil {
		return err
	}
	api, wrk := rg.base+"/metrics", fmt.Sprintf("http://127.0.0.1:%d/metrics", e.port+2)
	org, run := e.orgs[0], time.Now().UnixNano()
	next := func(c, i int) request {
		return request{http.MethodPost, rg.base + org.startPath(), headerFor(org.Token, fmt.Sprintf("profile-%d-%d-%d", run, c, i)), []byte(startBody)}
	}
	var (
		apiBefore, wrkBefore metricsText
		top                  = make(chan error, 1)
		errs                 []error
	)
	scrape := func(url string) metricsText {
		m, err := scrape(url)
		errs = append(errs, err)
		return m
	}
	sm, wm := &usageMeter{pid: srv.cmd.Process.Pid}, &usageMeter{pid: worker.cmd.Process.Pid}
	res := runLoad(ctx, r.Clients, warm, dur, next, loadOptions{OnWindow: func(open bool) {
		sm.window(open)
		wm.window(open)
		if open {
			apiBefore, wrkBefore = scrape(api), scrape(wrk)
			// pprof fetches the profile itself and keeps it in PPROF_TMPDIR.
			go func() {
				cmd := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-cum", "-nodecount=25",
					"-seconds", strconv.Itoa(max(int(dur/time.Second)-1, 1)), e.bin, "http://"+pprofAddr+"/debug/pprof/profile")
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
		r.Queued = apiAfter.hist(apiBefore, "valruns_run_start_to_queued_seconds", "")
		r.Picked = wrkAfter.hist(wrkBefore, "valruns_run_start_to_picked_seconds", "")
		r.Final = wrkAfter.hist(wrkBefore, "valruns_run_start_to_final_seconds", `status="passed"`)
	}})
	if err := <-top; err != nil {
		r.Top = []string{"no CPU profile: " + err.Error()}
	}
	if r.Window, r.Starts = res.Duration, res.Requests; r.Starts > 0 {
		n := time.Duration(r.Starts)
		r.APICPU, r.WorkerCPU = sm.CPU/n, wm.CPU/n
	}
	return errors.Join(append(errs, rg.exited())...)
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

func (p *profileResult) section() section {
	s := section{Heading: "## Where the time goes"}
	if p.Failed != "" {
		s.Body = "FAILED: " + short(p.Failed, 300) + "\n"
		return s
	}
	var b strings.Builder
	d := func(h histStat) string {
		if h.Count == 0 {
			return "-"
		}
		return ms(h.Mean)
	}
	fmt.Fprintf(&b, "A closed loop of new-key starts on `serve` + `worker`, %s, %s measured: %d starts (%.0f/s). "+
		"Each figure is the mean over the window, from the processes' own histograms read before and after it.\n\n",
		clientsText(p.Clients), p.Window.Round(time.Second), p.Starts, float64(p.Starts)/max(p.Window.Seconds(), 1e-9))
	b.WriteString("| a start | ms |\n|---|---|\n")
	fmt.Fprintf(&b, "| the HTTP request, in the API | %s |\n| waiting for a writer | %s |\n", d(p.HTTP), d(p.Waiting))
	fmt.Fprintf(&b, "| its statement (a connection, PostgreSQL, the commit; %.1f starts per statement) | %s |\n", p.BatchMean, d(p.Statement))
	b.WriteString("\n| a run, from its created_at until | ms |\n|---|---|\n")
	fmt.Fprintf(&b, "| it is queued for a worker | %s |\n| a worker begins it | %s |\n| it is final | %s |\n", d(p.Queued), d(p.Picked), d(p.Final))
	fmt.Fprintf(&b, "\n**CPU per start**: API %s ms, worker %s ms.\n", ms(p.APICPU), ms(p.WorkerCPU))
	b.WriteString("\n**The API's CPU profile** over the window (`go tool pprof -top -cum`; the profile is kept in the scratch directory):\n\n")
	b.WriteString("```\n" + strings.Join(p.Top, "\n") + "\n```\n")
	s.Body = b.String()
	return s
}
