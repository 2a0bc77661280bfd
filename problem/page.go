package problem

import (
	"bytes"
	"fmt"
	"html"
	"regexp"
	"strconv"
	"strings"
)

// Document is the page of p in Markdown, as GET /problems/<code> serves it.
func (p Page) Document() string {
	return fmt.Sprintf("# %s: %s\n\nAnswered with HTTP %s, `\"code\": %q`.\n\n%s\n\n[Every problem code](%s)\n",
		p.Code.name, p.Title, p.statuses(), p.Code.name, p.Markdown, TypeBase)
}

// statuses is "400" or "400 or 409".
func (p Page) statuses() string {
	s := make([]string, len(p.Statuses))
	for i, st := range p.Statuses {
		s[i] = strconv.Itoa(st)
	}
	return strings.Join(s, " or ")
}

// Index is the list of every code in Markdown, as GET /problems/ serves it.
func Index() string {
	var b strings.Builder
	b.WriteString("# Problem codes\n\n" +
		"Every error of the API is a problem document (RFC 9457, `application/problem+json`) whose `code` is one of these, " +
		"and whose `type` is the path of the code's page.\n\n")
	for _, p := range pages {
		fmt.Fprintf(&b, "- [`%s`](%s%s) (%s): %s\n", p.Code.name, TypeBase, p.Code.name, p.statuses(), p.Title)
	}
	return b.String()
}

// Table is the table of errors of docs/api.md: every code, its statuses
// and title, and each code's page under a heading of its own.
func Table() string {
	var b strings.Builder
	b.WriteString("| Code | Status | Meaning |\n|---|---|---|\n")
	for _, p := range pages {
		fmt.Fprintf(&b, "| [`%s`](#%s) | %s | %s |\n", p.Code.name, p.Code.name, p.statuses(), p.Title)
	}
	for _, p := range pages {
		fmt.Fprintf(&b, "\n### %s\n\n%s: HTTP %s.\n\n%s\n", p.Code.name, p.Title, p.statuses(), p.Markdown)
	}
	return b.String()
}

// RenderHTML renders the Markdown of a page as a plain HTML document:
// "# " headings, "- " lists and paragraphs, with `code` and [links](url)
// inside them; everything else is text.
func RenderHTML(title, markdown string) string {
	var b strings.Builder
	b.WriteString("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
		html.EscapeString(title) + "</title>\n</head>\n<body>\n")
	for _, block := range strings.Split(strings.TrimSpace(markdown), "\n\n") {
		switch lines := strings.Split(block, "\n"); {
		case strings.HasPrefix(block, "# "):
			b.WriteString("<h1>" + inline(strings.TrimPrefix(block, "# ")) + "</h1>\n")
		case strings.HasPrefix(block, "- "):
			b.WriteString("<ul>\n")
			for _, l := range lines {
				b.WriteString("<li>" + inline(strings.TrimPrefix(l, "- ")) + "</li>\n")
			}
			b.WriteString("</ul>\n")
		default:
			b.WriteString("<p>" + inline(block) + "</p>\n")
		}
	}
	b.WriteString("</body>\n</html>\n")
	return b.String()
}

// span is a code span or a link of Markdown text.
var span = regexp.MustCompile("`([^`]*)`|\\[([^\\]]*)\\]\\(([^)\\s]*)\\)")

// inline renders the code spans and links of one block of text.
func inline(text string) string {
	var b strings.Builder
	last := 0
	for _, m := range span.FindAllStringSubmatchIndex(text, -1) {
		b.WriteString(html.EscapeString(text[last:m[0]]))
		if m[2] >= 0 {
			b.WriteString("<code>" + html.EscapeString(text[m[2]:m[3]]) + "</code>")
		} else {
			b.WriteString(`<a href="` + html.EscapeString(text[m[6]:m[7]]) + `">` + inline(text[m[4]:m[5]]) + "</a>")
		}
		last = m[1]
	}
	b.WriteString(html.EscapeString(text[last:]))
	return b.String()
}

// The markers around the table of errors in docs/api.md.
const (
	TableBegin = "<!-- problems:begin -->"
	TableEnd   = "<!-- problems:end -->"
)

// ReplaceTable is doc with the lines between its markers replaced by Table.
func ReplaceTable(doc []byte) ([]byte, error) {
	before, rest, ok := bytes.Cut(doc, []byte(TableBegin+"\n"))
	if !ok {
		return nil, fmt.Errorf("no line %s", TableBegin)
	}
	_, after, ok := bytes.Cut(rest, []byte(TableEnd+"\n"))
	if !ok {
		return nil, fmt.Errorf("no line %s after %s", TableEnd, TableBegin)
	}
	var b bytes.Buffer
	b.Write(before)
	b.WriteString(TableBegin + "\n" + Table() + TableEnd + "\n")
	b.Write(after)
	return b.Bytes(), nil
}
