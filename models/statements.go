package models

import (
	"embed"
	"fmt"
	"regexp"
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
	shape := placeholderShape(text)
	if other, ok := statementNames[shape]; ok && other != name {
		panic(fmt.Sprintf("models: statements %q and %q differ only in their placeholders", other, name))
	}
	statementNames[shape] = name
	return text
}

// StatementName is the name of the file (sql/NAME.sql) whose statement sql
// is, as the models package sends it; "" for any other SQL. Tracing names
// a statement's span by it, rather than sending its text with every span.
// A statement sent through GORM reaches the driver with its placeholders
// rewritten (? and @name as $1, $2..., a slice's ? as ($1,$2)): it is
// found by its text with every placeholder alike (placeholderShape).
func StatementName(sql string) string {
	if name, ok := statementNames[sql]; ok {
		return name
	}
	if !strings.ContainsAny(sql, "$@?") {
		return ""
	}
	return statementNames[placeholderShape(sql)]
}

// placeholderShape is sql with each placeholder ($1, ?, @name) written ?,
// and a parenthesised list of them, as GORM expands a slice, as one.
func placeholderShape(sql string) string {
	var b strings.Builder
	b.Grow(len(sql))
	for i := 0; i < len(sql); i++ {
		c := sql[i]
		j := i + 1
		switch {
		case c == '$' && j < len(sql) && isDigit(sql[j]):
			for j < len(sql) && isDigit(sql[j]) {
				j++
			}
		case c == '@' && j < len(sql) && (sql[j] == '_' || sql[j] >= 'a' && sql[j] <= 'z' || sql[j] >= 'A' && sql[j] <= 'Z'):
			for j < len(sql) && (sql[j] == '_' || isDigit(sql[j]) || sql[j] >= 'a' && sql[j] <= 'z' || sql[j] >= 'A' && sql[j] <= 'Z') {
				j++
			}
		case c == '?':
		default:
			b.WriteByte(c)
			continue
		}
		b.WriteByte('?')
		i = j - 1
	}
	return placeholderList.ReplaceAllString(b.String(), "?")
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// placeholderList is a parenthesised list of placeholders.
var placeholderList = regexp.MustCompile(`\(\s*\?(?:\s*,\s*\?)*\s*\)`)

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
