package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/client"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
)

// startBin runs the built binary (see proctest.Exec).
func startBin(t *testing.T, bin string, env []string, stdin string, args ...string) result {
	t.Helper()
	r := proctest.Exec(t, bin, env, stdin, args...)
	return result{code: r.Code, stdout: r.Stdout, stderr: r.Stderr}
}

// TestStartCommand runs `valruns start` as a process against the service
// started the way `make run` starts it (proctest.MakeRun).
func TestStartCommand(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t)
	dir := t.TempDir()
	db, addr, token, wf := proctest.MakeRun(t, bin, dir)
	apiURL := "http://" + addr

	env := []string{"VALRUNS_URL=" + apiURL, "VALRUNS_TOKEN=" + token}
	good := filepath.Join(dir, "good.json")
	require.NoError(t, os.WriteFile(good, []byte(`{"customer": "ACME", "total": 42}`), 0o600))
	start := func(stdin string, args ...string) result {
		t.Helper()
		return startBin(t, bin, env, stdin, append([]string{"start"}, args...)...)
	}
	decode := func(r result) client.Run {
		t.Helper()
		var run client.Run
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &run), "stdout: %s", r.stdout)
		return run
	}
	runs := func() int64 {
		t.Helper()
		var n int64
		require.NoError(t, db.Raw(`SELECT count(*) FROM validation_runs`).Scan(&n).Error)
		return n
	}
	oneStderrLine := func(r result) {
		t.Helper()
		require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line on stderr: %q", r.stderr)
	}

	t.Run("passed: exit 0, the final run on stdout", func(t *testing.T) {
		r := start("", "--workflow", wf, "--file", good, "--metadata", `{"source":"cli test"}`, "--wait")
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		run := decode(r)
		require.Equal(t, client.StatusPassed, run.Status)
		require.JSONEq(t, `{"source":"cli test"}`, string(run.Metadata))
		require.NotNil(t, run.FinishedAt)
		require.Empty(t, r.stderr, "no progress line when stdout is not a terminal")
		require.True(t, strings.HasPrefix(r.stdout, "{\n  \""), "indented JSON: %s", r.stdout)
		code, api := getRun(t, apiURL, token, run.ID)
		require.Equal(t, 200, code, api)
		require.Equal(t, compact(t, api), compact(t, r.stdout), "the final run as the API sent it")
	})

	t.Run("failed: exit 3, the findings on stdout", func(t *testing.T) {
		r := start(`{"customer": "ACME", "total": -5}`, "--wait", "-", "--workflow", wf)
		require.Equal(t, 3, r.code, "stderr: %s", r.stderr)
		run := decode(r)
		require.Equal(t, client.StatusFailed, run.Status)
		require.Contains(t, run.Findings, client.Finding{Step: "assertion:positive_total", Severity: "error", Message: "total must be positive"})
		oneStderrLine(r)
		require.Contains(t, r.stderr, "run "+run.ID+" failed")
	})

	t.Run("without --wait: exit 0, the queued run; the same --key again is the same run", func(t *testing.T) {
		r := start("", "--workflow", wf, "--file", good, "--key", "cli-key-1")
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		first := decode(r)
		require.Equal(t, client.StatusQueued, first.Status)
		// What the API answered, which it stored with the key: a queued run
		// has no findings field (not "findings": null).
		var answered string
		require.NoError(t, db.Raw(`SELECT convert_from(response_body, 'UTF8') FROM idempotency_keys WHERE key = 'cli-key-1'`).Scan(&answered).Error)
		require.NotContains(t, answered, "findings")
		require.Equal(t, compact(t, answered), compact(t, r.stdout), "the run as the API sent it")
		r = start("", "--workflow", wf, "--file", good, "--key", "cli-key-1")
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		require.Equal(t, first.ID, decode(r).ID)
		var n int64
		require.NoError(t, db.Raw(`SELECT count(*) FROM validation_runs r JOIN idempotency_keys k ON k.validation_run_id = r.id
			WHERE k.key = 'cli-key-1'`).Scan(&n).Error)
		require.EqualValues(t, 1, n)

		r = start(`{"customer": "ACME", "total": 43}`, "--workflow", wf, "--key", "cli-key-1", "-")
		require.Equal(t, 1, r.code)
		oneStderrLine(r)
		require.Contains(t, r.stderr, "idempotency_key_reused")
		require.Contains(t, r.stderr, "Idempotency key has already been used with a different request body.")
	})

	t.Run("unknown workflow: exit 1 naming not_found", func(t *testing.T) {
		r := start("", "--workflow", uuid.NewString(), "--file", good, "--wait")
		require.Equal(t, 1, r.code, "stdout: %s", r.stdout)
		require.Empty(t, r.stdout)
		oneStderrLine(r)
		require.Contains(t, r.stderr, "valruns start: 404 not_found: Workflow not found.")
	})

	t.Run("flags win over the environment", func(t *testing.T) {
		dead := "http://" + proctest.FreeAddr(t)
		r := startBin(t, bin, []string{"VALRUNS_URL=" + dead, "VALRUNS_TOKEN=" + token}, "", "start", "--url", apiURL, "--workflow", wf, "--file", good)
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		r = start("", "--token", "vr_wrong", "--workflow", wf, "--file", good)
		require.Equal(t, 1, r.code)
		require.Contains(t, r.stderr, "invalid_token")
	})

	t.Run("connection refused: exit 1, nothing started, naming the URL and where it came from", func(t *testing.T) {
		dead := "http://" + proctest.FreeAddr(t)
		for _, tc := range []struct {
			name, from string
			env        []string
			args       []string
		}{
			{"--url", "(from --url)", nil, []string{"--url", dead}},
			{"VALRUNS_URL", "(from VALRUNS_URL)", []string{"VALRUNS_URL=" + dead}, nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := startBin(t, bin, append(append([]string{}, env...), tc.env...), "",
					append([]string{"start", "--workflow", wf, "--file", good, "--key", "cli-refused"}, tc.args...)...)
				require.Equal(t, 1, r.code, "stdout: %s", r.stdout)
				require.Empty(t, r.stdout)
				oneStderrLine(r)
				require.Contains(t, r.stderr, "valruns start: no run was started: nothing reached the API at "+dead+" "+tc.from+" in 5 attempts")
				require.Contains(t, r.stderr, "connection refused")
				require.NotContains(t, r.stderr, "unknown")
			})
		}
	})

	t.Run("connection refused at the default URL: named", func(t *testing.T) {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:8080", time.Second); err == nil {
			_ = c.Close()
			t.Skip("SKIPPED: something listens on 127.0.0.1:8080 (the CLI's default URL), so it cannot be refused")
		}
		r := startBin(t, bin, []string{"VALRUNS_URL=", "VALRUNS_TOKEN=" + token}, "", "start", "--workflow", wf, "--file", good)
		require.Equal(t, 1, r.code, "stdout: %s", r.stdout)
		oneStderrLine(r)
		require.Contains(t, r.stderr, "no run was started: nothing reached the API at http://127.0.0.1:8080 (the default: neither --url nor VALRUNS_URL is set)")
	})

	t.Run("a server that hangs up: exit 1, the outcome unknown, naming the key to retry with", func(t *testing.T) {
		// It accepts each connection and closes it, request unanswered: the
		// request went out, and may have been processed.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, _ = c.Read(make([]byte, 1<<16))
				_ = c.Close()
			}
		}()
		r := start("", "--url", "http://"+ln.Addr().String(), "--workflow", wf, "--file", good, "--key", "cli-unsure")
		require.Equal(t, 1, r.code)
		oneStderrLine(r)
		require.Contains(t, r.stderr, "5 attempts")
		require.Contains(t, r.stderr, "whether the run started is unknown: run again with --key cli-unsure")
	})

	usage := []struct {
		name  string
		env   []string
		stdin string
		args  []string
		want  string
	}{
		{"missing --workflow", nil, "", []string{"--file", good}, "--workflow ID is required"},
		{"neither --file nor -", nil, "", []string{"--workflow", wf}, "--file PATH or - (stdin)"},
		{"both --file and -", nil, "{}", []string{"--workflow", wf, "--file", good, "-"}, "not both"},
		{"--file - and -", nil, "{}", []string{"--workflow", wf, "--file", "-", "-"}, "both read stdin"},
		{"bad --metadata JSON", nil, "", []string{"--workflow", wf, "--file", good, "--metadata", "{nope"}, "--metadata must be a JSON object"},
		{"--metadata not an object", nil, "", []string{"--workflow", wf, "--file", good, "--metadata", "[1]"}, "--metadata must be a JSON object"},
		{"submission not JSON", nil, "total=42", []string{"--workflow", wf, "-"}, "the submission in stdin is not valid JSON"},
		{"unexpected argument", nil, "", []string{"--workflow", wf, "--file", good, "extra"}, `unexpected argument "extra"`},
		{"unknown flag", nil, "", []string{"--workflow", wf, "--file", good, "--frob"}, "flag provided but not defined: -frob"},
		{"--key too long", nil, "", []string{"--workflow", wf, "--file", good, "--key", strings.Repeat("k", 256)}, "--key must be 1 to 255 printable ASCII"},
		{"--key not ASCII", nil, "", []string{"--workflow", wf, "--file", good, "--key", "clé"}, "--key must be 1 to 255 printable ASCII"},
		{"no token", []string{"VALRUNS_TOKEN="}, "", []string{"--workflow", wf, "--file", good}, "no API token"},
		// A flag wins over the environment and the defaults, an empty one
		// too: `--key "$ORDER_ID"` with the variable unset must not start a
		// run under a new key, nor --token '' use VALRUNS_TOKEN.
		{"--key ''", nil, "", []string{"--workflow", wf, "--file", good, "--key", ""}, "--key is empty"},
		{"--token ''", nil, "", []string{"--workflow", wf, "--file", good, "--token", ""}, "--token is empty"},
		{"--url ''", nil, "", []string{"--workflow", wf, "--file", good, "--url", ""}, "--url is empty"},
		{"--metadata ''", nil, "", []string{"--workflow", wf, "--file", good, "--metadata="}, "--metadata is empty"},
		// Nothing can be sent to these: bad usage, not "unknown".
		{"--url not a URL", nil, "", []string{"--workflow", wf, "--file", good, "--url", "not a url"}, `--url "not a url": no scheme`},
		{"--url ftp://", nil, "", []string{"--workflow", wf, "--file", good, "--url", "ftp://" + addr}, `--url "ftp://` + addr + `": scheme "ftp"`},
		{"--url without a scheme", nil, "", []string{"--workflow", wf, "--file", good, "--url", addr}, `--url "` + addr + `": no scheme`},
		{"VALRUNS_URL without a scheme", []string{"VALRUNS_URL=" + addr}, "", []string{"--workflow", wf, "--file", good}, `VALRUNS_URL "` + addr + `": no scheme`},
		{"--token with a newline", nil, "", []string{"--workflow", wf, "--file", good, "--token", token + "\n"}, "--token holds whitespace or a control character"},
		{"VALRUNS_TOKEN with a newline", []string{"VALRUNS_TOKEN=" + token + "\n"}, "", []string{"--workflow", wf, "--file", good}, "VALRUNS_TOKEN holds whitespace or a control character"},
	}
	for _, tt := range usage {
		t.Run("bad usage: exit 2: "+tt.name, func(t *testing.T) {
			before := runs()
			r := startBin(t, bin, append(append([]string{}, env...), tt.env...), tt.stdin, append([]string{"start"}, tt.args...)...)
			require.Equal(t, 2, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
			require.Empty(t, r.stdout)
			// One line, why and where the usage is (as every command does).
			line, rest, _ := strings.Cut(r.stderr, "\n")
			require.Contains(t, line, tt.want)
			require.True(t, strings.HasPrefix(line, "valruns start: "), "line %q", line)
			require.True(t, strings.HasSuffix(line, "; see valruns start --help"), "line %q", line)
			require.Empty(t, rest, "one line on stderr, not the usage: %q", r.stderr)
			require.Equal(t, before, runs(), "nothing started")
		})
	}

	for _, h := range []string{"--help", "-h"} {
		t.Run(h+": usage on stdout, exit 0, nothing started", func(t *testing.T) {
			var before int64
			require.NoError(t, db.Raw(`SELECT count(*) FROM validation_runs`).Scan(&before).Error)
			r := start("", "--workflow", wf, "--file", good, h)
			require.Equal(t, 0, r.code)
			require.Contains(t, r.stdout, "Usage: valruns start --workflow ID")
			require.Contains(t, r.stdout, "Exit codes:")
			require.Empty(t, r.stderr)
			var after int64
			require.NoError(t, db.Raw(`SELECT count(*) FROM validation_runs`).Scan(&after).Error)
			require.Equal(t, before, after)
		})
	}
}

// compact is JSON text without its insignificant whitespace.
func compact(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, json.Compact(&b, []byte(s)), s)
	return b.String()
}

// getRun reads a run from the API: its status and body, as sent.
func getRun(t *testing.T, apiURL, token, id string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, apiURL+"/api/runs/"+id+"/", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestStartWaitProgressAndError runs the command in-process against the
// real API (no worker: the test moves the run through its statuses in the
// database). A run ending in error exits 4; on a terminal the progress line
// is rewritten in place on stderr; off a terminal stderr stays empty.
func TestStartWaitProgressAndError(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("cli")
	wf := env.NewWorkflow(org, map[string]any{"name": "cli"})
	srv := env.Server()
	getenv := func(k string) string {
		return map[string]string{"VALRUNS_URL": srv.URL, "VALRUNS_TOKEN": org.Token}[k]
	}

	for _, tc := range []struct {
		name     string
		tty      bool
		final    string
		wantCode int
	}{
		{"terminal, run ends in error: exit 4", true, "error", 4},
		{"not a terminal, run passes: exit 0", false, "passed", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, stderr bytes.Buffer
			s := startCmd{stdin: strings.NewReader(`{"n": 1}`), stderr: &stderr, getenv: getenv, tty: tc.tty,
				pollMin: 5 * time.Millisecond, pollMax: 20 * time.Millisecond}
			key := uuid.NewString()
			done := make(chan error, 1)
			go func() { done <- s.run(t.Context(), []string{"--workflow", wf, "--wait", "--key", key, "-"}, &out) }()

			var id string
			apitest.Eventually(t, 10*time.Second, func() bool {
				return env.DB.Raw(`SELECT validation_run_id FROM idempotency_keys WHERE key = ?`, key).Scan(&id).Error == nil && id != ""
			}, "the run was started")
			require.NoError(t, env.DB.Exec(`UPDATE validation_runs SET status = 'running', started_at = now(), attempts = 1 WHERE id = ?`, id).Error)
			time.Sleep(250 * time.Millisecond) // let the progress line show "running" (not asserted if the machine is slow)
			if tc.final == "error" {
				require.NoError(t, env.DB.Exec(`UPDATE validation_runs SET status = 'error', finished_at = now(),
					error = 'validation exceeded its time limit' WHERE id = ?`, id).Error)
			} else {
				require.NoError(t, env.DB.Exec(`UPDATE validation_runs SET status = 'passed', finished_at = now() WHERE id = ?`, id).Error)
			}
			err := <-done

			var run client.Run
			require.NoError(t, json.Unmarshal(out.Bytes(), &run), out.String())
			require.Equal(t, id, run.ID)
			require.Equal(t, tc.final, run.Status)
			if tc.wantCode == 0 {
				require.NoError(t, err)
			} else {
				ec, ok := errors.AsType[exitCoder](err)
				require.True(t, ok, "%v", err)
				require.Equal(t, tc.wantCode, ec.ExitCode())
				require.Contains(t, err.Error(), "run "+id+" ended in error: validation exceeded its time limit")
			}
			if !tc.tty {
				require.Empty(t, stderr.String())
				return
			}
			p := stderr.String()
			require.True(t, strings.HasPrefix(p, "\rrun "+id+": "), "%q", p)
			require.True(t, strings.HasSuffix(p, "\n"), "the last line ends: %q", p)
			require.Equal(t, 1, strings.Count(p, "\n"), "one line, rewritten in place: %q", p)
			require.Greater(t, strings.Count(p, "\r"), 1, "rewritten: %q", p)
			last := p[strings.LastIndex(p, "\r")+1:]
			require.Regexp(t, `^run `+id+`: error\s+\d+\.\ds\n$`, last)
		})
	}
}
