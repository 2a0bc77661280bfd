package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// TestMarkdownLinks keeps the manual's links true: every relative link and
// #anchor of every Markdown file of the repository names a file that exists
// and, into a Markdown file, a heading it has (its slug as GitHub makes it)
// or an <a id> / <a name> anchor. External http(s) and mailto links are not
// fetched.
func TestMarkdownLinks(t *testing.T) {
	t.Parallel()
	files := markdownFiles(t, ".")
	if len(files) == 0 {
		t.Fatal("no Markdown file found")
	}
	anchors := map[string]map[string]bool{} // file -> its anchors, read once
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := markdownAnchors(string(b))
		anchors[path] = a
		return a
	}
	checked := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range markdownLinks(string(b)) {
			target := l.target
			if isExternalLink(target) {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			resolved := file
			if path != "" {
				resolved = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s:%d: link to %q: %s does not exist", file, l.line, target, resolved)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(resolved, ".md") {
				continue
			}
			if !anchorsOf(resolved)[anchor] {
				t.Errorf("%s:%d: link to %q: %s has no heading with the anchor #%s", file, l.line, target, resolved, anchor)
			}
		}
	}
	t.Logf("%d relative links checked in %d Markdown files", checked, len(files))
}

// TestMarkdownAnchorSlugs pins the slug rule to examples of GitHub's own.
func TestMarkdownAnchorSlugs(t *testing.T) {
	t.Parallel()
	doc := "# Title\n## Waiting instead of 409: `Prefer: wait=N`\n## Tracing (OpenTelemetry)\n" +
		"## The Go client and `valruns start`\n## Did my request go through?\n## Title\n" +
		"```sh\n# not a heading\n```\n## [Linked](x.md) text\n## Über **bold** ß\n<a id=\"custom\"></a>\n"
	got := markdownAnchors(doc)
	for _, want := range []string{"title", "waiting-instead-of-409-prefer-waitn", "tracing-opentelemetry",
		"the-go-client-and-valruns-start", "did-my-request-go-through", "title-1", "linked-text", "über-bold-ß", "custom"} {
		if !got[want] {
			t.Errorf("no anchor #%s among %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a comment in a code block is not a heading")
	}
}

// markdownFiles lists the Markdown files under root, leaving out hidden
// directories (.git, .dev), installed packages and build output.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "bin" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

type markdownLink struct {
	target string
	line   int
}

var (
	inlineLink    = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	referenceLink = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	codeSpan      = regexp.MustCompile("`+[^`]*`+")
	htmlAnchor    = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
)

// markdownLinks returns the link targets of a Markdown document, outside
// fenced code blocks and code spans.
func markdownLinks(doc string) []markdownLink {
	var links []markdownLink
	forEachProseLine(doc, func(n int, line string) {
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			links = append(links, markdownLink{m[1], n})
		}
		if m := referenceLink.FindStringSubmatch(line); m != nil {
			links = append(links, markdownLink{m[1], n})
		}
	})
	return links
}

// markdownAnchors returns the anchors of a Markdown document: each ATX
// heading's slug as GitHub makes it (lower case; every character but
// letters, marks, digits, '_', '-' and spaces dropped; spaces to '-'; a
// repeated slug gets -1, -2...), and the ids of <a id> and <a name>.
func markdownAnchors(doc string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	forEachProseLine(doc, func(_ int, line string) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		trimmed := strings.TrimLeft(line, " ")
		if len(line)-len(trimmed) > 3 || !strings.HasPrefix(trimmed, "#") {
			return
		}
		text := strings.TrimLeft(trimmed, "#")
		if level := len(trimmed) - len(text); level > 6 || (text != "" && text[0] != ' ' && text[0] != '\t') {
			return
		}
		text = strings.TrimSpace(text)
		text = strings.TrimSpace(strings.TrimRight(text, "#")) // a closing sequence
		slug := headingSlug(text)
		if n, ok := seen[slug]; ok {
			seen[slug] = n + 1
			anchors[fmt.Sprintf("%s-%d", slug, n+1)] = true
			return
		}
		seen[slug] = 0
		anchors[slug] = true
	})
	return anchors
}

var linkText = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)

func headingSlug(text string) string {
	text = linkText.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// forEachProseLine calls f with each line (numbered from 1) outside fenced
// code blocks.
func forEachProseLine(doc string, f func(n int, line string)) {
	fence := ""
	for i, line := range strings.Split(doc, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.TrimSpace(strings.TrimLeft(trimmed, fence[:1])) == "" {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			for _, c := range trimmed[3:] {
				if string(c) != fence[:1] {
					break
				}
				fence += fence[:1]
			}
			continue
		}
		f(i+1, line)
	}
}

func isExternalLink(target string) bool {
	lower := strings.ToLower(target)
	return strings.HasPrefix(lower, "http://") || strings.HasPrefix(lower, "https://") || strings.HasPrefix(lower, "mailto:")
}
