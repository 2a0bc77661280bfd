package main

// The sides of the experiment log: the valruns binary being measured
// ("now") and a baseline built from a git ref in the same run, each with a
// template database made by its own binary (its own `migrate up`, its own
// `org create` and `token create`), so a baseline with an older schema is
// measured on that schema.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// defaultBaseline is the commit the experiment log compares with unless
// -baseline or BENCH_BASELINE says otherwise: the bench of the start before
// the lean-run work (issue 15).
const defaultBaseline = "0b107b5"

// side is one valruns build under measurement.
type side struct {
	Name string // "now" or "baseline"
	Ref  string // the git commit it was built from ("" for now: the working tree)
	bin  string
	tmpl string
	org  benchOrg
}

// buildBaseline builds `valruns` from ref into dir/baseline-<commit>/valruns
// (kept between runs: a commit's binary does not change), from a `git
// archive` of the ref, so no worktree of the repository is touched.
func buildBaseline(ctx context.Context, root, dir, ref string) (bin, commit string, err error) {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--verify", ref+"^{commit}").Output()
	if err != nil {
		return "", "", fmt.Errorf("baseline %q is not a commit of this repository: %v", ref, err)
	}
	commit = strings.TrimSpace(string(out))
	bdir := filepath.Join(dir, "baseline-"+commit[:12])
	bin = filepath.Join(bdir, "valruns")
	if _, err := os.Stat(bin); err == nil {
		return bin, commit, nil
	}
	src := filepath.Join(bdir, "src")
	_ = os.RemoveAll(bdir)
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", "", err
	}
	script := fmt.Sprintf("git -C %q archive --format=tar %s | tar -x -C %q", root, commit, src)
	if b, err := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", script).CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("git archive %s: %v\n%s", ref, err, b)
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = src
	if b, err := build.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build of %s: %v\n%s", ref, err, b)
	}
	_ = os.RemoveAll(src)
	return bin, commit, nil
}

var orgCreated = regexp.MustCompile(`slug=(\S+) id=(\S+)`)

// parseOrgCreate reads `valruns org create`'s answer: slug=SLUG id=UUID.
func parseOrgCreate(out string) (slug, id string, err error) {
	m := orgCreated.FindStringSubmatch(out)
	if m == nil {
		return "", "", fmt.Errorf("valruns org create said %q, not slug=... id=...", short(out, 200))
	}
	return m[1], m[2], nil
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	var last string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); t != "" {
			last = t
		}
	}
	return last
}

// makeSide creates the side's template database with its own binary: the
// schema, one organisation with a token, the bench workflow (through the
// API) and one start (the organisation's usage slots exist, as for an
// active tenant).
func (e *env) makeSide(ctx context.Context, name, ref, bin string) (*side, error) {
	s := &side{Name: name, Ref: ref, bin: bin, tmpl: e.prefix + "_" + name + "_tmpl"}
	if err := e.createDB(ctx, s.tmpl, ""); err != nil {
		return nil, err
	}
	url := e.dbURL(s.tmpl)
	cli := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = childEnv("DATABASE_URL="+url, "REDIS_URL="+e.redisURL)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("%s valruns %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
		}
		return string(out), nil
	}
	if _, err := cli("migrate", "up"); err != nil {
		return nil, err
	}
	out, err := cli("org", "create", "bench e2e "+name)
	if err != nil {
		return nil, err
	}
	if s.org.Slug, s.org.ID, err = parseOrgCreate(out); err != nil {
		return nil, err
	}
	if out, err = cli("token", "create", "--org", s.org.Slug); err != nil {
		return nil, err
	}
	if s.org.Token = lastLine(out); s.org.Token == "" {
		return nil, errors.New("valruns token create printed no token")
	}
	srv, base, err := e.startServerBin(ctx, bin, url, false)
	if err != nil {
		return nil, err
	}
	defer srv.Stop(10 * time.Second)
	hc := &http.Client{Timeout: 30 * time.Second}
	if s.org.Workflow, err = createWorkflow(hc, base, s.org.Token); err != nil {
		return nil, err
	}
	if err := sendOnce(ctx, hc, base+s.org.startPath(), []byte(startBody), headerFor(s.org.Token, "")); err != nil {
		return nil, fmt.Errorf("%s: first start: %w", name, err)
	}
	return s, nil
}

// fresh clones the side's template for one measurement.
func (e *env) freshFrom(ctx context.Context, tmpl string) (string, error) {
	e.seq++
	name := fmt.Sprintf("%s_%d", e.prefix, e.seq)
	return name, e.createDB(ctx, name, tmpl)
}
