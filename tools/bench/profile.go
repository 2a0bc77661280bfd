package main

// The profile: where a start's time goes, and a run's, under a closed
// loop of new-key starts at one client count (-profile-clients), on
// `valruns serve` + `valruns worker`. From the processes' own histograms
// (their /metrics, read before and after the window): a start's HTTP
// request, its wait for a writer of the start batcher and the statement
// that carried it (connection, PostgreSQL, commit); a run's time to its
// task in the queue, to a worker beginning it, and to its final state.
// Beside them: the PostgreSQL backends' states and wait events, sampled
// every 10 ms (pg_stat_activity), the CPU per start of the API, the worker
// and the database's backends, and the top of the API's CPU profile
// (pprof, `go tool pprof -top`).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// histStat is a histogram's observations over a window: their count, mean
// and median (interpolated in its bucket).
type histStat struct {
	Count     float64
	Mean, P50 time.Duration
}

// waitShare is a state of the database's backends and the share of the
// samples that saw a backend in it.
type waitShare struct {
	State string
	Share float64 // of the backend samples
}

type profileResult struct {
	Clients int
	Window  time.Duration
	Starts  int
	RPS     float64
	Failed  string
	// The start: the HTTP request (the start route), its wait for a
	// writer, its statement; the batch size.
	HTTP, Waiting, Statement histStat
	BatchMean                float64
	// The run: from its start to its task in the queue, to a worker
	// beginning it, to its final state.
	Queued, Picked, Final histStat
	// CPU per start.
	APICPU, WorkerCPU, PGCPU time.Duration
	// The backends' states, over Samples samples of every backend of the
	// database.
	Waits   []waitShare
	Samples int
	// Top lines of the API's CPU profile (cumulative), and the profile's
	// file.
	Top     []string
	Pprof   string
	TopNote string
}

// measureProfile runs the profile: new-key starts of orgs[0] from clients,
// on serve + worker.
func (e *env) measureProfile(ctx context.Context, clients int, warm, dur time.Duration, scratch string) (r profileResult) {
	r.Clients = clients
	fail := func(err error) profileResult {
		r.Failed = err.Error()
		say("profile: %v", err)
		return r
	}
	db, err := e.fresh(ctx)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", e.pprofPort())
	srv, base, err := e.startServer(ctx, e.dbURL(db), false, "PPROF_ADDR="+pprofAddr)
	if err != nil {
		return fail(err)
	}
	defer srv.Stop(20 * time.Second)
	worker, err := e.startWorker(ctx, e.dbURL(db))
	if err != nil {
		return fail(err)
	}
	defer worker.Stop(20 * time.Second)
	workerMetrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", e.workerPort())
	conn, err := e.connect(ctx, db)
	if err != nil {
		return fail(err)
	}
	defer conn.Close(context.Background())

	org := e.orgs[0]
	body := []byte(startBody)
	run := time.Now().UnixNano()
	next := func(c, i int) request {
		return request{"POST", base + org.startPath(), headerFor(org.Token, fmt.Sprintf("profile-%d-%d-%d", run, c, i)), body}
	}
	var (
		apiBefore, workerBefore metricsText
		sampler                 *waitSampler
		pgBefore                time.Duration
		profile                 chan error
		errs                    []error
	)
	sm, wm := &usageMeter{pid: srv.Pid()}, &usageMeter{pid: worker.Pid()}
	pprofFile := filepath.Join(scratch, "profile-api.pprof")
	res := runLoad(ctx, clients, warm, dur, next, nil, nil, func(open bool) {
		sm.window(open)
		wm.window(open)
		if open {
			apiBefore, err = scrape(base + "/metrics")
			errs = append(errs, err)
			workerBefore, err = scrape(workerMetrics)
			errs = append(errs, err)
			pgBefore, err = backendsCPU(ctx, conn, db)
			errs = append(errs, err)
			sampler = e.sampleWaits(ctx, db)
			profile = make(chan error, 1)
			go func() {
				profile <- fetchProfile(ctx, "http://"+pprofAddr, max(dur-time.Second, time.Second), pprofFile)
			}()
			return
		}
		sampler.finish()
		pgAfter, err := backendsCPU(ctx, conn, db)
		errs = append(errs, err)
		r.PGCPU = pgAfter - pgBefore
		apiAfter, err := scrape(base + "/metrics")
		errs = append(errs, err)
		workerAfter, err := scrape(workerMetrics)
		errs = append(errs, err)
		r.HTTP = apiAfter.hist(apiBefore, "valruns_http_request_duration_seconds", `route="/api/workflows/:id/start"`)
		r.Waiting = apiAfter.hist(apiBefore, "valruns_start_phase_seconds", `phase="waiting_writer"`)
		r.Statement = apiAfter.hist(apiBefore, "valruns_start_phase_seconds", `phase="statement"`)
		if batches := apiAfter.hist(apiBefore, "valruns_start_batch_starts", ""); batches.Count > 0 {
			r.BatchMean = r.Waiting.Count / batches.Count
		}
		r.Queued = apiAfter.hist(apiBefore, "valruns_run_start_to_queued_seconds", "")
		r.Picked = workerAfter.hist(workerBefore, "valruns_run_start_to_picked_seconds", "")
		r.Final = workerAfter.hist(workerBefore, "valruns_run_start_to_final_seconds", `status="passed"`)
	})
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	r.Window, r.Starts = res.Duration, res.Requests
	r.RPS = res.RPS()
	if r.Starts > 0 {
		n := time.Duration(r.Starts)
		r.APICPU, r.WorkerCPU, r.PGCPU = sm.usage.CPU/n, wm.usage.CPU/n, r.PGCPU/n
	}
	r.Waits, r.Samples = sampler.shares()
	if err := <-profile; err != nil {
		r.TopNote = "no CPU profile: " + err.Error()
	} else {
		r.Pprof = pprofFile
		if r.Top, err = pprofTop(ctx, e.bin, pprofFile, 25); err != nil {
			r.TopNote = "the profile could not be read: " + err.Error()
		}
	}
	return r
}

// backendsCPU sums the CPU time of the backends on db other than this
// connection's: they were all started for the measured processes (read
// from /proc, so PostgreSQL must run on this machine).
func backendsCPU(ctx context.Context, conn *pgx.Conn, db string) (time.Duration, error) {
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db)
	if err != nil {
		return 0, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	var sum time.Duration
	for _, pid := range pids {
		if c, err := cpuTime(pid); err == nil {
			sum += c
		}
	}
	return sum, err
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

// value sums the samples named name whose labels hold every one of
// labels (a comma-separated list of label="value"), and for a bucket the
// label le="le".
func (m metricsText) value(name, labels, le string) float64 {
	var want []string
	if labels != "" {
		want = strings.Split(labels, ",")
	}
	if le != "" {
		want = append(want, `le="`+le+`"`)
	}
	var sum float64
	for _, l := range m {
		metric, val, ok := strings.Cut(l, " ")
		if !ok {
			continue
		}
		n, lbls, _ := strings.Cut(metric, "{")
		if n != name || slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(lbls, w) }) {
			continue
		}
		if f, err := strconv.ParseFloat(strings.Fields(val)[0], 64); err == nil {
			sum += f
		}
	}
	return sum
}

// bucketBound is a histogram bucket's le label.
var bucketBound = regexp.MustCompile(`le="([^"]+)"`)

// hist is the histogram name{labels} observed between before and m.
func (m metricsText) hist(before metricsText, name, labels string) histStat {
	count := m.value(name+"_count", labels, "") - before.value(name+"_count", labels, "")
	sum := m.value(name+"_sum", labels, "") - before.value(name+"_sum", labels, "")
	if count <= 0 {
		return histStat{}
	}
	h := histStat{Count: count, Mean: time.Duration(sum / count * float64(time.Second))}
	type bound struct {
		v  float64
		le string
	}
	var bounds []bound
	seen := map[string]bool{}
	for _, l := range m {
		if !strings.HasPrefix(l, name+"_bucket") {
			continue
		}
		if mm := bucketBound.FindStringSubmatch(l); mm != nil && !seen[mm[1]] && mm[1] != "+Inf" {
			seen[mm[1]] = true
			if f, err := strconv.ParseFloat(mm[1], 64); err == nil {
				bounds = append(bounds, bound{f, mm[1]})
			}
		}
	}
	sort.Slice(bounds, func(i, j int) bool { return bounds[i].v < bounds[j].v })
	prevBound, prevCum := 0.0, 0.0
	for _, b := range bounds {
		cum := m.value(name+"_bucket", labels, b.le) - before.value(name+"_bucket", labels, b.le)
		if cum >= count/2 {
			frac := 0.0
			if cum > prevCum {
				frac = (count/2 - prevCum) / (cum - prevCum)
			}
			h.P50 = time.Duration((prevBound + frac*(b.v-prevBound)) * float64(time.Second))
			return h
		}
		prevBound, prevCum = b.v, cum
	}
	h.P50 = time.Duration(prevBound * float64(time.Second)) // past the last bound
	return h
}

// waitSampler samples the states of a database's backends every 10 ms.
type waitSampler struct {
	stop, done chan struct{}
	counts     map[string]int
	samples    int
}

func (e *env) sampleWaits(ctx context.Context, db string) *waitSampler {
	s := &waitSampler{stop: make(chan struct{}), done: make(chan struct{}), counts: map[string]int{}}
	go func() {
		defer close(s.done)
		conn, err := e.connect(ctx, db)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rows, err := conn.Query(ctx, `SELECT coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, '')
				FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'`, db)
			if err != nil {
				continue
			}
			states, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
				var state, typ, event string
				err := row.Scan(&state, &typ, &event)
				return waitLabel(state, typ, event), err
			})
			if err != nil {
				continue
			}
			s.samples++
			for _, st := range states {
				s.counts[st]++
			}
		}
	}()
	return s
}

// waitLabel names a backend's state: active on the CPU, active waiting (on
// what), idle, or idle in a transaction (waiting for its client).
func waitLabel(state, typ, event string) string {
	switch {
	case state == "active" && typ == "":
		return "active: on CPU"
	case state == "active":
		return "active: waiting " + typ + "/" + event
	case typ != "":
		return state + " (" + typ + "/" + event + ")"
	default:
		return state
	}
}

func (s *waitSampler) finish() {
	close(s.stop)
	<-s.done
}

// shares are the states by their share of the backend samples, largest
// first, and the number of samples.
func (s *waitSampler) shares() ([]waitShare, int) {
	total := 0
	for _, n := range s.counts {
		total += n
	}
	var out []waitShare
	for st, n := range s.counts {
		out = append(out, waitShare{State: st, Share: float64(n) / float64(max(total, 1))})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Share != out[j].Share {
			return out[i].Share > out[j].Share
		}
		return out[i].State < out[j].State
	})
	return out, s.samples
}

// fetchProfile saves a CPU profile of d from a pprof server at base.
func fetchProfile(ctx context.Context, base string, d time.Duration, file string) error {
	url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, max(int(d/time.Second), 1))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// pprofTop is `go tool pprof -top -cum` of a profile: its header and the
// first n functions.
func pprofTop(ctx context.Context, bin, file string, n int) ([]string, error) {
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-cum", fmt.Sprintf("-nodecount=%d", n), bin, file).Output()
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasPrefix(l, "File:") || strings.HasPrefix(l, "Build ID:") || strings.HasPrefix(l, "Time:") {
			continue
		}
		lines = append(lines, l)
	}
	return lines, nil
}

// section is the profile's section of the results.
func (p *profileResult) section() section {
	s := section{Heading: "## Where the time goes"}
	if p.Failed != "" {
		s.Body = "FAILED: " + short(p.Failed, 300) + "\n"
		return s
	}
	var sb strings.Builder
	b := &sb
	fmt.Fprintf(b, "A closed loop of new-key starts on `serve` + `worker`, %d clients, %s measured: %d starts (%.0f/s). Each figure is the mean over the window (the median, interpolated in its histogram bucket, in brackets), read from the processes' own histograms before and after it.\n\n",
		p.Clients, p.Window.Round(time.Second), p.Starts, p.RPS)
	d := func(h histStat) string {
		if h.Count == 0 {
			return "-"
		}
		return fmt.Sprintf("%s (%s)", ms(h.Mean), ms(h.P50))
	}
	b.WriteString("**A start** (ms)\n\n| phase | mean (median) | what |\n|---|---|---|\n")
	fmt.Fprintf(b, "| the HTTP request | %s | the start route's whole request in the API: what the client waits, less the network |\n", d(p.HTTP))
	fmt.Fprintf(b, "| waiting for a writer | %s | from the start's submission to the batcher to its statement being sent |\n", d(p.Waiting))
	fmt.Fprintf(b, "| its statement | %s | taking a connection, the statements (PostgreSQL), the commit; %.1f starts per statement on average |\n", d(p.Statement), p.BatchMean)
	if p.HTTP.Count > 0 {
		rest := p.HTTP.Mean - p.Waiting.Mean - p.Statement.Mean
		fmt.Fprintf(b, "| the rest of the request | %s | middleware, authentication, reading and decoding the body, the key's hash, rendering and writing the answer (the mean of the request less the two above) |\n", ms(rest))
	}
	b.WriteString("\n**A run** (ms, from its start: `created_at`)\n\n| until | mean (median) | what happened on the way |\n|---|---|---|\n")
	fmt.Fprintf(b, "| it is in the queue | %s | the commit, the API's dispatch buffer, the fair-share gate (a Redis script), the push: onto the direct hand-off's list when a worker waits there, else into asynq's queue |\n", d(p.Queued))
	fmt.Fprintf(b, "| a worker begins it | %s | from the list, a worker's pop that was already waiting; from asynq's queue, an idle worker's poll (`RUN_POLL_INTERVAL`) or the tasks ahead of it |\n", d(p.Picked))
	fmt.Fprintf(b, "| it is final | %s | validating it, then the batched final write (the worker's finisher) |\n", d(p.Final))
	fmt.Fprintf(b, "\n**CPU per start**: API %s ms, worker %s ms, PostgreSQL backends %s ms.\n", ms(p.APICPU), ms(p.WorkerCPU), ms(p.PGCPU))
	fmt.Fprintf(b, "\n**PostgreSQL's backends** of the database, sampled every 10 ms (`pg_stat_activity`, %d samples): the share of backend samples in each state.\n\n| state | share |\n|---|---|\n", p.Samples)
	for _, w := range p.Waits {
		fmt.Fprintf(b, "| %s | %.1f%% |\n", w.State, 100*w.Share)
	}
	b.WriteString("\n**The API's CPU profile** over the window (`go tool pprof -top -cum`")
	if p.Pprof != "" {
		fmt.Fprintf(b, ", saved as `%s`", filepath.Base(p.Pprof))
	}
	b.WriteString("):\n\n")
	if p.TopNote != "" {
		b.WriteString(p.TopNote + "\n")
	} else {
		b.WriteString("```\n" + strings.Join(p.Top, "\n") + "\n```\n")
	}
	s.Body = b.String()
	return s
}
