// Package deploy_test checks what deploy/ ships for operators: the alert
// rules and their promtool unit tests, the Grafana dashboard, the
// Prometheus and OpenTelemetry Collector configurations that
// docker-compose.yml mounts. Every expression must name metrics valruns
// exports; every rule's threshold must be pinned by a test.
package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/tasks"
)

const (
	rulesFile     = "prometheus/valruns-alerts.yml"
	rulesTestFile = "prometheus/valruns-alerts_test.yml"
	promConfig    = "prometheus/prometheus.yml"
	dashboardFile = "grafana/valruns-dashboard.json"
)

// promtool finds promtool with the project's scripts/install-promtool.sh
// (which installs Debian's prometheus package when missing and running as
// root, and prints its path), once per test binary. It skips the test,
// loudly, when there is none: a skipped rules test must never pass
// unnoticed.
func promtool(t *testing.T) string {
	t.Helper()
	path, skip := findPromtool()
	if skip != "" {
		t.Skip(skip)
	}
	return path
}

var findPromtool = sync.OnceValues(func() (path, skip string) {
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p, ""
	}
	cmd := exec.Command("bash", "../scripts/install-promtool.sh")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	path = strings.TrimSpace(lines[len(lines)-1])
	if err == nil && path != "" {
		if _, statErr := os.Stat(path); statErr == nil {
			return path, ""
		}
		err = fmt.Errorf("it printed %q, which does not exist", path)
	}
	msg := fmt.Sprintf("\n%s\nSKIPPING the alert rules' tests: no promtool.\n"+
		"scripts/install-promtool.sh failed (%v): %s\n"+
		"Install it (apt-get install prometheus) or set PROMTOOL=/path/to/promtool.\n%s",
		strings.Repeat("!", 72), err, strings.TrimSpace(stderr.String()), strings.Repeat("!", 72))
	fmt.Fprintln(os.Stderr, msg)
	return "", msg
})

func runPromtool(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The rules and the Prometheus configuration load, and the rules' unit
// tests pass.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	out, err := runPromtool(t, ".", "check", "config", promConfig)
	require.NoError(t, err, "promtool check config (and its rule files):\n%s", out)
	out, err = runPromtool(t, ".", "test", "rules", rulesTestFile)
	require.NoError(t, err, "promtool test rules:\n%s", out)
}

// Each rule's threshold is pinned by its tests: moved a little either way,
// the rules' unit tests fail, and say which alert.
func TestAlertRuleTestsCatchABrokenThreshold(t *testing.T) {
	t.Parallel()
	rules, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	tests, err := os.ReadFile(rulesTestFile)
	require.NoError(t, err)
	for _, m := range []struct{ alert, from, to string }{
		{"ValrunsBacklogOld", "valruns_runs_oldest_unfinished_seconds) > 300", "valruns_runs_oldest_unfinished_seconds) > 302"},
		{"ValrunsBacklogOld", "valruns_runs_oldest_unfinished_seconds) > 300", "valruns_runs_oldest_unfinished_seconds) > 299"},
		{"ValrunsStartToFinalSlow", "[5m]))) > 30", "[5m]))) > 33"},
		{"ValrunsStartToFinalSlow", "[5m]))) > 30", "[5m]))) > 29.9"},
		{"ValrunsHTTP5xxHigh", "[5m])) > 0.05", "[5m])) > 0.052"},
		{"ValrunsHTTP5xxHigh", "[5m])) > 0.05", "[5m])) > 0.048"},
		{"ValrunsWebhookDeliveryStuck", "valruns_webhook_oldest_pending_seconds) > 3600", "valruns_webhook_oldest_pending_seconds) > 3602"},
		{"ValrunsWebhookDeliveryStuck", "valruns_webhook_oldest_pending_seconds) > 3600", "valruns_webhook_oldest_pending_seconds) > 3599"},
		{"ValrunsNoWorkerRunning", "or vector(0)) < 1", "or vector(0)) < 2"},
		{"ValrunsNoWorkerRunning", "or vector(0)) < 1", "or vector(0)) < 0"},
	} {
		t.Run(m.alert+": "+m.to, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, 1, strings.Count(string(rules), m.from), "the rule's threshold %q occurs once in %s", m.from, rulesFile)
			dir := filepath.Join(t.TempDir(), "prometheus")
			require.NoError(t, os.Mkdir(dir, 0o755))
			broken := strings.Replace(string(rules), m.from, m.to, 1)
			require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(rulesFile)), []byte(broken), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(rulesTestFile)), tests, 0o644))
			out, err := runPromtool(t, dir, "test", "rules", filepath.Base(rulesTestFile))
			require.Error(t, err, "the tests pass with the threshold moved (%s):\n%s", m.to, out)
			require.Contains(t, out, "alertname: "+m.alert, "the failure names the alert")
		})
	}
}

// Every expression of the dashboard and of the alert rules names only
// metrics that valruns exports: the metrics registered by the API's
// router, the worker and the hand-off, as `serve --worker` registers them.
func TestDeployNamesExportedMetrics(t *testing.T) {
	t.Parallel()
	exported := exportedMetrics(t)

	var exprs []string
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash dashboard
	require.NoError(t, json.Unmarshal(raw, &dash), dashboardFile)
	for _, p := range dash.all() {
		for _, target := range p.Targets {
			exprs = append(exprs, target.Expr)
		}
	}
	require.NotEmpty(t, exprs, "the dashboard has queries")
	raw, err = os.ReadFile(rulesFile)
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules), rulesFile)
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
			alerts = append(alerts, r.Alert)
		}
	}
	require.Subset(t, alerts, []string{"ValrunsBacklogOld", "ValrunsStartToFinalSlow", "ValrunsHTTP5xxHigh",
		"ValrunsWebhookDeliveryStuck", "ValrunsNoWorkerRunning"})

	for _, e := range exprs {
		names := metricNames(e)
		require.NotEmpty(t, names, "%q names no metric", e)
		for _, n := range names {
			require.True(t, exported(n), "%q names %s, which valruns does not export", e, n)
		}
	}
}

// docker-compose.yml is valid YAML, runs the collector, Jaeger and
// Prometheus beside valruns, and every file it mounts from the repository
// exists.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docker-compose.yml")
	require.NoError(t, err)
	var compose struct {
		Services map[string]struct {
			Volumes []string
		}
	}
	require.NoError(t, yaml.Unmarshal(raw, &compose), "docker-compose.yml")
	for _, s := range []string{"api", "worker", "otel-collector", "jaeger", "prometheus"} {
		require.Contains(t, compose.Services, s)
	}
	mounts := 0
	for name, s := range compose.Services {
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if !strings.HasPrefix(src, "./") {
				continue // a named volume
			}
			mounts++
			_, err := os.Stat(filepath.Join("..", src))
			require.NoError(t, err, "service %s mounts %s", name, src)
		}
	}
	require.GreaterOrEqual(t, mounts, 2, "the collector's and Prometheus's configurations are mounted")
	require.Contains(t, compose.Services["prometheus"].Volumes, "./deploy/prometheus:/etc/prometheus:ro")
}

// dashboard is what the test reads of a Grafana dashboard.
type dashboard struct {
	Panels []panel `json:"panels"`
}

type panel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// all lists the panels, those inside rows included.
func (d dashboard) all() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

var (
	// notNames is what of a PromQL expression cannot be a metric name: string
	// literals, label matchers, ranges and the label lists of aggregations
	// and vector matching.
	notNames = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|\{[^}]*\}|\[[^\]]*\]|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	// identifier is a name, with the "(" that makes it a function's.
	identifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	keywords   = []string{"and", "or", "unless", "bool", "offset", "inf", "nan", "Inf", "NaN"}
)

// metricNames lists the metric names in a PromQL expression.
func metricNames(expr string) []string {
	var names []string
	for _, m := range identifier.FindAllStringSubmatch(notNames.ReplaceAllString(expr, " "), -1) {
		if m[1] == "" && !slices.Contains(keywords, m[0]) {
			names = append(names, m[0])
		}
	}
	return names
}

// exportedMetrics builds the registry `serve --worker` serves (the router,
// the worker, the hand-off, on a real database) and returns a test of
// whether a name is one of its metrics, or one of a histogram's series.
func exportedMetrics(t *testing.T) func(string) bool {
	t.Helper()
	db, _ := testdb.New(t, testdb.Options{MaxOpenConns: 2})
	cfg, err := config.Load(func(string) (string, bool) { return "", false })
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	idle := asynq.RedisClientOpt{Addr: "127.0.0.1:1"} // never started: nothing connects
	_, err = tasks.NewWorker(tasks.Config{DB: db, Redis: idle, Registry: reg})
	require.NoError(t, err)
	d := tasks.NewDispatcher(tasks.DispatcherConfig{Redis: idle, Registry: reg})
	t.Cleanup(d.Close)
	handlers.NewRouter(handlers.Deps{Config: cfg, DB: db, Registry: reg})

	// A registry tells whether it holds a name only by refusing a second
	// collector of that name: a probe registers only if the name is free.
	registered := func(name string) bool {
		probe := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "probe"})
		if err := reg.Register(probe); err != nil {
			return true
		}
		reg.Unregister(probe)
		return false
	}
	return func(name string) bool {
		if registered(name) {
			return true
		}
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && registered(base) {
				return true
			}
		}
		return false
	}
}
