package models

import (
	"embed"
	"fmt"
	"strings"
)

// sqlFiles holds every statement longer than a line, one per file under
// sql/, named for what it does. Each file starts with a comment saying what
// the statement does and what each parameter is ($1..$n for pgx; for GORM,
// ?1..?n for its ? placeholders in order and @name for its named ones), as
// asynq documents its Lua scripts; the comment is not sent.
//
//go:embed sql/*.sql
var sqlFiles embed.FS

// usedStatements records which files statement loaded: every one is, by a
// package-level variable, when the package starts (a test checks that none
// is left unused). statementNames maps each one's text back to its name.
var (
	usedStatements = map[string]bool{}
	statementNames = map[string]string{}
)

// statement is the statement of sql/name.sql, without its leading comment,
// for a package-level variable (it records the file as used). It panics
// on a name without a file: the package would not start.
func statement(name string) string {
	usedStatements[name] = true
	text := Statement(name)
	statementNames[text] = name
	return text
}

// StatementName is the name of the file (sql/NAME.sql) whose statement sql
// is, as the models package sends it; "" for any other SQL. Tracing names
// a statement's span by it, rather than sending its text with every span.
func StatementName(sql string) string { return statementNames[sql] }

// Statement is the statement named name as the models package sends it,
// for tests that check which statements a request sends. It only reads:
// tests may call it at once, and it does not count as a use of the file.
func Statement(name string) string {
	file, err := sqlFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic(fmt.Sprintf("models: statement %q: %v", name, err))
	}
	return statementOf(string(file))
}

// statementOf is the statement of a .sql file: its text after the leading
// comment lines.
func statementOf(file string) string {
	for strings.HasPrefix(file, "--") {
		_, file, _ = strings.Cut(file, "\n")
	}
	return strings.TrimSpace(file)
}
