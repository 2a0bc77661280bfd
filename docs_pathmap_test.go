package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDesignOpensWithThePathMap keeps docs/design.md's path map true: the
// page's first section is the map, with a start's files and a run's files,
// each in order, and every file or folder it links to exists. A file moved
// or removed without the map following fails here.
func TestDesignOpensWithThePathMap(t *testing.T) {
	t.Parallel()
	const page = "docs/design.md"
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	first := strings.Index(doc, "\n## ")
	if first < 0 || !strings.HasPrefix(doc[first+1:], "## Path map\n") {
		t.Fatalf("%s: the first section is not \"## Path map\"", page)
	}
	section := doc[first+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	for _, part := range []string{"\n### A start\n", "\n### A run\n"} {
		if !strings.Contains(section, part) {
			t.Errorf("%s: the path map has no %q", page, strings.TrimSpace(part))
		}
	}
	files := 0
	for _, l := range markdownLinks(section) {
		if isExternalLink(l.target) || strings.HasPrefix(l.target, "#") {
			continue
		}
		path, _, _ := strings.Cut(l.target, "#")
		resolved := filepath.Join(filepath.Dir(page), filepath.FromSlash(path))
		if _, err := os.Stat(resolved); err != nil {
			t.Errorf("%s: the path map names %s, which does not exist", page, resolved)
			continue
		}
		files++
	}
	if files < 20 {
		t.Errorf("%s: the path map links %d files; a start and a run pass through more", page, files)
	}
}
