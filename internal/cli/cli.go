// Package cli is the valruns command line: the command table, its help and
// usage errors, flag parsing, and the commands themselves (serve, worker,
// migrate, cleanup, org, token, demo, start). main calls Run.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// command is one entry of the table Run dispatches on. The usage
// overview, every --help and the tests walk this one table, so a command
// added here is listed, answers --help and is tested with no other change.
type command struct {
	// name is the word on the command line.
	name string
	// args is what follows the name in the synopsis ("NAME [--slug SLUG]").
	args string
	// summary is the command's line in the overview.
	summary string
	// run executes the command with the arguments after its name. Given
	// ["-h"] it must print its usage (Usage: valruns NAME ARGS...) on out and
	// return flag.ErrHelp without acting: Run calls it so for --help and
	// to show the usage after a bad call. A bad call returns a *usageError.
	// nil for a group of subcommands.
	run func(ctx context.Context, args []string, out io.Writer) error
	// subs are the subcommands of a group.
	subs []command
}

// commands is every command of the binary, in the order the overview lists them.
var commands = []command{
	{name: "serve", args: "[--worker]", summary: "run the HTTP API (--worker: also the worker, single-node mode)", run: cmdServe},
	{name: "worker", summary: "run the worker: task server, cleanup schedule, stranded-run sweeper", run: cmdWorker},
	{name: "migrate", summary: "schema migrations", subs: []command{
		{name: "up", summary: "apply every pending migration", run: cmdMigrate("up")},
		{name: "down", summary: "roll back the last applied migration", run: cmdMigrate("down")},
		{name: "status", summary: "list the migrations, applied or pending", run: cmdMigrate("status")},
	}},
	{name: "cleanup", args: "[--dry-run]", summary: "delete expired idempotency keys once, print the count", run: cmdCleanup},
	{name: "org", summary: "organisations, their quotas and limits", subs: []command{
		{name: "create", args: "NAME [--slug SLUG]", summary: "create an organisation, print its slug and id", run: cmdOrgCreate},
		{name: "list", args: "[--json]", summary: "list the organisations: slug, id, monthly run quota, start rate, run share, created", run: cmdOrgList},
		{name: "quota", args: "SLUG N|default", summary: "set an organisation's monthly run quota (0: unlimited)", run: orgQuota.run},
		{name: "rate", args: "SLUG N|default", summary: "set an organisation's start rate, starts per second (0: unlimited)", run: orgRate.run},
		{name: "share", args: "SLUG N|default", summary: "set how many of an organisation's runs may wait in the queue at once (0: unlimited)", run: orgShare.run},
	}},
	{name: "token", summary: "API tokens", subs: []command{
		{name: "create", args: "--org SLUG", summary: "create an API token, print it once (only its SHA-256 is stored)", run: cmdTokenCreate},
		{name: "list", args: "--org SLUG [--json]", summary: "list an organisation's tokens: id, prefix, created, revoked", run: cmdTokenList},
		{name: "revoke", args: "ID|PREFIX", summary: "revoke a token, named by its id or its display prefix", run: cmdTokenRevoke},
	}},
	{name: "demo", args: "[--token-file PATH]", summary: "ensure a demo org, token and workflow (used by make run)", run: cmdDemo},
	{name: "start", args: startSynopsis,
		summary: "start a run through the Go client: one key per call, safe retries, --wait for the result", run: cmdStart},
	{name: "version", summary: "print the version: release, VCS revision, Go version (also --version)", run: cmdVersion},
}

// synopsis is how a command is called: "org create NAME [--slug SLUG]".
func synopsis(path []string, c command) string {
	return strings.TrimSpace(strings.Join(path, " ") + " " + c.args)
}

// listing is one line per runnable command under path, aligned:
// "valruns org create NAME [--slug SLUG]   create an organisation...".
func listing(path []string, cmds []command) []string {
	type row struct{ syn, summary string }
	var rows []row
	var walk func(path []string, cmds []command)
	walk = func(path []string, cmds []command) {
		for _, c := range cmds {
			p := append(slices.Clone(path), c.name)
			if c.subs != nil {
				walk(p, c.subs)
				continue
			}
			rows = append(rows, row{"valruns " + synopsis(p, c), c.summary})
		}
	}
	walk(path, cmds)
	// Summaries line up after the synopses, except that one too long to
	// leave room for its summary has it on the next line.
	const maxWidth = 44
	width := 0
	for _, r := range rows {
		if len(r.syn) <= maxWidth {
			width = max(width, len(r.syn))
		}
	}
	var lines []string
	for _, r := range rows {
		if len(r.syn) > maxWidth {
			lines = append(lines, r.syn, fmt.Sprintf("%-*s  %s", width, "", r.summary))
			continue
		}
		lines = append(lines, fmt.Sprintf("%-*s  %s", width, r.syn, r.summary))
	}
	return lines
}

// overview is the usage of the binary itself.
func overview() string {
	return "valruns: the idempotent job-start API\n\nUsage:\n  " +
		strings.Join(listing(nil, commands), "\n  ") +
		"\n\nConfiguration is environment variables; see the README.\n" +
		"Run any command with --help (or `valruns help COMMAND`) for its usage.\n"
}

// groupUsage is the usage of a group of subcommands such as `valruns org`.
func groupUsage(path []string, c command) string {
	name := strings.Join(path, " ")
	return fmt.Sprintf("Usage: valruns %s SUBCOMMAND\n\n%s, one of:\n  %s\n\nRun `valruns %s SUBCOMMAND --help` for its usage.\n",
		name, upperFirst(c.summary), strings.Join(listing(path[:len(path)-1], []command{c}), "\n  "), name)
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// exitError is an error whose message is the whole story: printed as one line.
type exitError struct{ msg string }

func (e *exitError) Error() string { return e.msg }

// exitCoder is an error that chooses the process's exit code (the default
// for an error is 1). A command whose outcome is more than success or
// failure, such as `valruns start` (3: the run failed, 4: it ended in
// error), returns one.
type exitCoder interface {
	error
	ExitCode() int
}

// usageError is a bad call of a command (a missing or extra argument, a bad
// flag or value): exit code 2, and Run prints the command's usage after it.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// ExitCode is 2, the conventional code of bad usage.
func (e *usageError) ExitCode() int { return 2 }

func badUsage(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// Exit codes of run.
const (
	exitOK    = 0
	exitFail  = 1 // the command failed
	exitUsage = 2 // the command was called wrongly
)

// Run executes the command args name and returns the process's exit code:
// 0 done (or usage asked for), 1 failed (one line on stderr: "valruns CMD:
// why"), 2 bad usage (one line on stderr: why, and where the usage is:
// "valruns CMD: why; see valruns CMD --help"), or the code an exitCoder
// error chooses. The usage itself is printed only when asked for.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "help" { // `valruns help org create` = `valruns org create --help`
		if len(args) == 1 {
			fmt.Fprint(stdout, overview())
			return exitOK
		}
		args = append(slices.Clone(args[1:]), "--help")
	}
	if len(args) == 0 {
		return usageLine(stderr, nil, "missing command")
	}
	if isHelp(args[0]) {
		fmt.Fprint(stdout, overview())
		return exitOK
	}
	if args[0] == "--version" || args[0] == "-version" { // the convention; `valruns version` is the command
		args = append([]string{"version"}, args[1:]...)
	}

	// Find the command: one word per level of the table.
	var (
		cmd   command
		path  []string
		table = commands
		rest  = args
	)
	for {
		i := slices.IndexFunc(table, func(c command) bool { return c.name == rest[0] })
		if i < 0 {
			if path == nil {
				return usageLine(stderr, nil, fmt.Sprintf("unknown command %q%s", rest[0], suggest(rest[0], table)))
			}
			return usageLine(stderr, path, fmt.Sprintf("unknown subcommand %q%s", rest[0], suggest(rest[0], table)))
		}
		cmd, path, rest = table[i], append(path, table[i].name), rest[1:]
		if cmd.subs == nil {
			break
		}
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") || rest[0] == "help" {
			if wantsHelp(rest) || (len(rest) > 0 && rest[0] == "help") {
				fmt.Fprint(stdout, groupUsage(path, cmd))
				return exitOK
			}
			return usageLine(stderr, path, "missing subcommand")
		}
		table = cmd.subs
	}
	name := strings.Join(path, " ")

	// --help anywhere (before a "--") shows the usage and nothing else runs:
	// `org create Acme --help` must not create Acme.
	if wantsHelp(rest) {
		rest = []string{"-h"}
	}
	err := cmd.run(ctx, rest, &console{Writer: stdout, stderr: stderr})
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, new(*usageError)):
		return usageLine(stderr, path, oneLine(err))
	}
	fmt.Fprintf(stderr, "valruns %s: %s\n", name, oneLine(err))
	if ec, ok := errors.AsType[exitCoder](err); ok {
		return ec.ExitCode()
	}
	return exitFail
}

// usageLine writes the one line of a bad call of the command path (nil:
// valruns itself), why and where its usage is, and is the exit code.
func usageLine(stderr io.Writer, path []string, why string) int {
	name := strings.Join(append([]string{"valruns"}, path...), " ")
	fmt.Fprintf(stderr, "%s: %s; see %s --help\n", name, why, name)
	return exitUsage
}

// suggest is ` (did you mean "X"?)` when word is a likely typo of a command
// of table (within two edits, or its start), else "".
func suggest(word string, table []command) string {
	best, bestDist := "", 3
	for _, c := range table {
		d := editDistance(strings.ToLower(word), c.name)
		if len(word) >= 2 && strings.HasPrefix(c.name, word) {
			d = 1
		}
		if d < bestDist {
			best, bestDist = c.name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance of a and b, in bytes (command
// names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// console is the out a command runs with: its standard output, which also
// knows the standard error that goes with it (see notice).
type console struct {
	io.Writer
	stderr io.Writer
}

// notice writes a line for the person at the terminal, not for a pipe
// reading out: on the standard error that goes with out (discarded when
// out has none, as while printing a usage).
func notice(out io.Writer, format string, a ...any) {
	fmt.Fprintf(stderrOf(out), format+"\n", a...)
}

// stderrOf is the standard error that goes with out (io.Discard when out
// is not a command's console).
func stderrOf(out io.Writer) io.Writer {
	if c, ok := out.(*console); ok {
		return c.stderr
	}
	return io.Discard
}

// isHelp reports whether a command-line word asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--h", "--help":
		return true
	}
	return false
}

// wantsHelp reports whether args ask for help before a "--" (after which
// every word is an operand: `org create -- --help` names an organisation).
func wantsHelp(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if isHelp(a) {
			return true
		}
	}
	return false
}

// flags returns the FlagSet of a command: synopsis is its usage line after
// "valruns ", doc optional paragraphs after it. The usage goes to out when
// asked for (-h); a bad flag prints nothing here, since parse turns it into
// a *usageError and Run prints it as one line on stderr.
func flags(name, synopsis string, out io.Writer, doc ...string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	failed := &flagFailure{}
	fs.SetOutput(failed)
	fs.Usage = func() {
		if failed.seen {
			return
		}
		fmt.Fprintf(out, "Usage: valruns %s\n", synopsis)
		for _, d := range doc {
			fmt.Fprintf(out, "\n%s\n", d)
		}
		printFlags(out, fs)
	}
	return fs
}

// printFlags lists a FlagSet's flags as the synopses spell them (--name),
// which the flag package accepts as well as -name.
func printFlags(out io.Writer, fs *flag.FlagSet) {
	first := true
	fs.VisitAll(func(f *flag.Flag) {
		if first {
			fmt.Fprint(out, "\nFlags:\n")
			first = false
		}
		value, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(out, "  --%s", f.Name)
		if value != "" {
			fmt.Fprintf(out, " %s", value)
		}
		fmt.Fprintf(out, "\n      %s", strings.ReplaceAll(usage, "\n", "\n      "))
		if f.DefValue != "" && f.DefValue != "false" {
			fmt.Fprintf(out, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(out)
	})
}

// flagFailure is a FlagSet's output: the flag package writes there only to
// report a bad flag, just before it calls Usage.
type flagFailure struct{ seen bool }

func (f *flagFailure) Write(p []byte) (int, error) {
	f.seen = true
	return len(p), nil
}

// parse parses the flags of args wherever they stand among the operands
// (`org create Acme --slug acme` as well as `org create --slug acme Acme`)
// and returns the operands; after a "--" every word is an operand, and so
// is a negative number (`org quota acme -5` is judged as a quota, not as a
// flag named 5). A bad flag is a *usageError, and so is a flag given
// explicitly empty (`--key ""`, `--token "$UNSET"`): a flag wins over its
// default and the environment, so an empty one is a mistake, never "use
// the default". -h is flag.ErrHelp, with the usage printed.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	operands, err := parseWords(fs, args)
	if err != nil {
		return nil, err
	}
	var empty []string
	fs.Visit(func(f *flag.Flag) {
		if f.Value.String() == "" {
			empty = append(empty, f.Name)
		}
	})
	if len(empty) > 0 {
		return nil, badUsage("--%s is empty (an unset variable?): give it a value, or leave the flag out", empty[0])
	}
	return operands, nil
}

func parseWords(fs *flag.FlagSet, args []string) ([]string, error) {
	var operands []string
	for {
		// The flag package would take a negative number for a flag: parse
		// the words before it on their own, and keep it as an operand.
		end := negativeNumberAt(fs, args)
		if err := fs.Parse(args[:end]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &usageError{err.Error()}
		}
		rest := fs.Args()
		if done := end - len(rest); done > 0 && args[done-1] == "--" {
			return slices.Concat(operands, rest, args[end:]), nil
		}
		switch {
		case len(rest) > 0:
			operands = append(operands, rest[0])
			args = slices.Concat(rest[1:], args[end:])
		case end < len(args):
			operands = append(operands, args[end])
			args = args[end+1:]
		default:
			return operands, nil
		}
	}
}

// negativeNumberAt is the index of the first word of args, before any
// "--", that is a negative number ("-5", "-1.5") and not the value of the
// flag before it; len(args) when there is none.
func negativeNumberAt(fs *flag.FlagSet, args []string) int {
	for i, a := range args {
		if a == "--" {
			break
		}
		if len(a) < 2 || a[0] != '-' || a[1] < '0' || a[1] > '9' {
			continue
		}
		if i > 0 && takesValue(fs, args[i-1]) {
			continue
		}
		return i
	}
	return len(args)
}

// takesValue reports whether word is a flag of fs that takes the next word
// as its value (`--quota -5`): not a bool flag, not written --name=value.
func takesValue(fs *flag.FlagSet, word string) bool {
	name, ok := strings.CutPrefix(word, "-")
	if !ok || strings.Contains(name, "=") {
		return false
	}
	name = strings.TrimPrefix(name, "-")
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	b, isBool := f.Value.(interface{ IsBoolFlag() bool })
	return !isBool || !b.IsBoolFlag()
}

// parseFlagsOnly is parse for a command that takes flags and no operands.
func parseFlagsOnly(fs *flag.FlagSet, args []string) error {
	operands, err := parse(fs, args)
	if err != nil {
		return err
	}
	return noOperands(operands)
}

// noOperands is a *usageError when a command that takes none got one.
func noOperands(operands []string) error {
	if len(operands) > 0 {
		return badUsage("unexpected argument %q", operands[0])
	}
	return nil
}
