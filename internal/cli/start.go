package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/valruns/valruns/client"
)

// startSynopsis is how `valruns start` is called, after its name.
const startSynopsis = "--workflow ID (--file PATH | -) [--metadata JSON] [--key K] [--wait] [--url URL] [--token T]"

// startDoc is the usage of `valruns start` after its synopsis.
const startDoc = `Starts a validation run of a workflow over a JSON submission (the file, or
stdin with -) and prints the run as the API sent it (indented JSON). The
start is idempotent: one Idempotency-Key per invocation (--key to choose
it), kept across the client's retries, so a flaky network never starts
the run twice.

With --wait it polls the run until it is passed, failed or error (showing
its status and the elapsed time on a terminal) and prints the final run.

The URL and the token also come from VALRUNS_URL and VALRUNS_TOKEN; a
flag wins, so an empty one (--token '') is refused, as is --key ''.
When nothing could connect (connection refused), no run was started;
when requests went out unanswered, run again with the same --key.

Exit codes: 0 passed (without --wait: started), 3 failed, 4 error,
1 any other failure (such as an unknown workflow), 2 bad usage.`

// Exit codes of `valruns start` besides Run's 0, 1 and 2.
const (
	exitFailed   = 3
	exitRunError = 4
)

const defaultAPIURL = "http://127.0.0.1:8080"

// maxSubmissionBytes bounds what start reads from the file or stdin; the
// server's own limit (MAX_BODY_BYTES, 1 MiB by default) is far lower.
const maxSubmissionBytes = 64 << 20

// exitCodeError is an error of a command that chooses the exit code (see
// exitCoder in cli.go).
type exitCodeError struct {
	code int
	msg  string
}

func (e *exitCodeError) Error() string { return e.msg }
func (e *exitCodeError) ExitCode() int { return e.code }

// startCmd is `valruns start` with its process dependencies made explicit,
// so tests can give it stdin, stderr, an environment and a terminal.
type startCmd struct {
	stdin  io.Reader
	stderr io.Writer
	getenv func(string) string
	// tty: show the progress line on stderr while waiting.
	tty bool
	// poll bounds WaitRun's polling; zero values take the client's defaults.
	pollMin, pollMax time.Duration
}

// cmdStart is `valruns start`: the Go client (package client) from the
// shell.
func cmdStart(ctx context.Context, args []string, out io.Writer) error {
	stderr := stderrOf(out)
	s := startCmd{stdin: os.Stdin, stderr: stderr, getenv: os.Getenv, tty: isTerminal(out) && isTerminal(stderr)}
	return s.run(ctx, args, out)
}

// startArgs is a parsed command line.
type startArgs struct {
	workflow, file, metadata, key, url, token string
	stdin, wait                               bool
	// urlFrom says where url came from, for messages that name it.
	urlFrom string
}

func (s startCmd) parse(args []string, out io.Writer) (startArgs, error) {
	var a startArgs
	fs := flags("start", "start "+startSynopsis, out, startDoc)
	fs.StringVar(&a.workflow, "workflow", "", "the workflow to run (required)")
	fs.StringVar(&a.file, "file", "", "the submission: a `PATH` to a file holding any JSON value (\"-\": stdin)")
	fs.StringVar(&a.metadata, "metadata", "", "metadata, a `JSON` object visible to CEL as metadata")
	fs.StringVar(&a.key, "key", "", "the Idempotency-Key `K` (default: a new UUID for this invocation)")
	fs.BoolVar(&a.wait, "wait", false, "wait for the run to finish, and exit by its status")
	fs.StringVar(&a.url, "url", "", "the API's `URL` (default $VALRUNS_URL, else "+defaultAPIURL+")")
	fs.StringVar(&a.token, "token", "", "the API token `T` (default $VALRUNS_TOKEN)")
	// Flags may come after "-": parse reads them wherever they are.
	pos, err := parse(fs, args)
	if err != nil {
		return a, err
	}
	for _, p := range pos {
		if p != "-" {
			return a, badUsage("unexpected argument %q", p)
		}
	}
	if len(pos) > 1 {
		return a, badUsage("- given more than once")
	}
	a.stdin = len(pos) == 1
	if a.file == "-" {
		if a.stdin {
			return a, badUsage("give the submission once: --file - and - both read stdin")
		}
		a.file, a.stdin = "", true
	}
	switch {
	case strings.TrimSpace(a.workflow) == "":
		return a, badUsage("--workflow ID is required")
	case a.file != "" && a.stdin:
		return a, badUsage("give the submission either with --file PATH or with - (stdin), not both")
	case a.file == "" && !a.stdin:
		return a, badUsage("give the submission with --file PATH or - (stdin)")
	}
	if !validKey(a.key) {
		return a, badUsage("--key must be 1 to 255 printable ASCII characters")
	}
	if a.metadata != "" {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(a.metadata), &m); err != nil || m == nil {
			return a, badUsage("--metadata must be a JSON object, such as '{\"source\":\"ci\"}'")
		}
	}
	// An explicitly empty --url or --token is refused by parse: a flag
	// wins over the environment, an empty one included.
	urlFrom := "--url"
	if a.url == "" {
		a.url, urlFrom = s.getenv("VALRUNS_URL"), "VALRUNS_URL"
	}
	if a.url == "" {
		a.url, urlFrom = defaultAPIURL, ""
	}
	if err := client.CheckBaseURL(a.url); err != nil {
		return a, badUsage("%s %q: %v", urlFrom, a.url, err)
	}
	a.urlFrom = "from " + urlFrom
	if urlFrom == "" {
		a.urlFrom = "the default: neither --url nor VALRUNS_URL is set"
	}
	tokenFrom := "--token"
	if a.token == "" {
		a.token, tokenFrom = s.getenv("VALRUNS_TOKEN"), "VALRUNS_TOKEN"
	}
	if a.token == "" {
		return a, badUsage("no API token: pass --token or set VALRUNS_TOKEN")
	}
	// A token is one word (vr_ and base64url); a space or a newline in it
	// is a copy-paste slip, which net/http would refuse to send anyway.
	if i := strings.IndexFunc(a.token, func(r rune) bool { return r <= ' ' || r == 0x7f }); i >= 0 {
		return a, badUsage("%s holds whitespace or a control character (byte %d is %#x): a token is one word, such as vr_...", tokenFrom, i, a.token[i])
	}
	return a, nil
}

// validKey reports whether k is "" (no key given) or a key the server
// accepts: printable ASCII, at most 255 characters unless quoted (the
// server unquotes "abc" to abc and judges the length then).
func validKey(k string) bool {
	if len(k) > 255 && !strings.HasPrefix(k, `"`) {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// readSubmission reads the submission and checks that it is JSON.
func (s startCmd) readSubmission(a startArgs) (json.RawMessage, error) {
	name := a.file
	var r io.Reader
	if a.stdin {
		name, r = "stdin", s.stdin
	} else {
		f, err := os.Open(a.file)
		if err != nil {
			return nil, fmt.Errorf("read the submission: %w", err)
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxSubmissionBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read the submission from %s: %w", name, err)
	}
	if len(b) > maxSubmissionBytes {
		return nil, badUsage("the submission in %s exceeds %d bytes", name, maxSubmissionBytes)
	}
	if !json.Valid(b) {
		return nil, badUsage("the submission in %s is not valid JSON", name)
	}
	return b, nil
}

func (s startCmd) run(ctx context.Context, args []string, out io.Writer) error {
	a, err := s.parse(args, out)
	if err != nil {
		return err
	}
	sub, err := s.readSubmission(a)
	if err != nil {
		return err
	}
	// The CLI chooses the key itself so that it can name it when the start
	// cannot be confirmed: the same key again is safe.
	key := a.key
	if key == "" {
		key = client.NewKey()
	}
	// Prefer: wait: a retry that finds its own first attempt still in flight
	// waits for its answer instead of a 409 and another retry.
	opts := []client.StartOption{client.WithKey(key), client.WithWait(10 * time.Second)}
	if a.metadata != "" {
		opts = append(opts, client.WithMetadata(json.RawMessage(a.metadata)))
	}
	c := client.New(a.url, a.token, client.WithUserAgent("valruns-cli/1"))
	res, err := c.StartRun(ctx, a.workflow, sub, opts...)
	if err != nil {
		re, retried := errors.AsType[*client.RetryError](err)
		if retried && re.NotSent {
			why := re.Last
			if op, ok := errors.AsType[*net.OpError](why); ok {
				why = op // "dial tcp ...: connection refused", without the request's URL
			}
			attempts := "1 attempt"
			if re.Attempts != 1 {
				attempts = fmt.Sprintf("%d attempts", re.Attempts)
			}
			return fmt.Errorf("no run was started: nothing reached the API at %s (%s) in %s: %v", a.url, a.urlFrom, attempts, why)
		}
		if _, answered := errors.AsType[*client.Error](err); retried || !answered {
			return fmt.Errorf("%s; whether the run started is unknown: run again with --key %s, which never starts it twice",
				strings.TrimPrefix(err.Error(), "valruns: "), key)
		}
		return err
	}
	run := res.Run
	if a.wait {
		final, err := s.wait(ctx, c, run.ID)
		if err != nil {
			return fmt.Errorf("run %s was started, but waiting for it failed: %w", run.ID, err)
		}
		run = *final
	}
	if err := printRun(out, run); err != nil {
		return err
	}
	if !a.wait {
		return nil
	}
	switch run.Status {
	case client.StatusFailed:
		n := 0
		for _, f := range run.Findings {
			if f.Severity == "error" {
				n++
			}
		}
		return &exitCodeError{code: exitFailed, msg: fmt.Sprintf("run %s failed: %d finding(s) of severity error", run.ID, n)}
	case client.StatusError:
		why := "no reason given"
		if run.Error != nil {
			why = *run.Error
		}
		return &exitCodeError{code: exitRunError, msg: fmt.Sprintf("run %s ended in error: %s", run.ID, oneLine(errors.New(why)))}
	}
	return nil
}

// printRun prints the run as the API sent it, indented: fields the API
// left out (a queued run's findings) stay out.
func printRun(out io.Writer, run client.Run) error {
	var b bytes.Buffer
	if err := json.Indent(&b, run.Raw, "", "  "); err != nil {
		return fmt.Errorf("the API's answer is not JSON: %w", err)
	}
	b.WriteByte('\n')
	_, err := out.Write(b.Bytes())
	return err
}

// wait polls the run until it is final; on a terminal it keeps one line
// on stderr up to date with the status and the elapsed time.
func (s startCmd) wait(ctx context.Context, c *client.Client, id string) (*client.Run, error) {
	var (
		mu     sync.Mutex
		status = client.StatusQueued
	)
	opts := []client.WaitOption{client.WithPollInterval(s.pollMin, s.pollMax), client.WithProgress(func(r client.Run) {
		mu.Lock()
		status = r.Status
		mu.Unlock()
	})}
	if !s.tty {
		return c.WaitRun(ctx, id, opts...)
	}
	began := time.Now()
	width := 0
	draw := func(end string) {
		mu.Lock()
		line := fmt.Sprintf("run %s: %-7s %5.1fs", id, status, time.Since(began).Seconds())
		mu.Unlock()
		// Pad over a longer previous line: \r only moves the cursor.
		fmt.Fprintf(s.stderr, "\r%-*s%s", width, line, end)
		width = len(line)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			draw("")
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	r, err := c.WaitRun(ctx, id, opts...)
	close(done)
	wg.Wait()
	draw("\n")
	return r, err
}

// isTerminal reports whether w is a terminal (a character device other
// than /dev/null), with the standard library only.
func isTerminal(w any) bool {
	if c, ok := w.(*console); ok {
		w = c.Writer
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	if null, err := os.Stat(os.DevNull); err == nil && os.SameFile(st, null) {
		return false
	}
	return true
}
