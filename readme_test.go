package main

import (
	"os"
	"strings"
	"testing"

	"github.com/valruns/valruns/config"
)

// TestREADMEConfigTable keeps the README's configuration table true: every
// setting config reads is a row, with its default.
func TestREADMEConfigTable(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		rows[strings.Trim(strings.TrimSpace(cells[1]), "`")] = strings.Trim(strings.TrimSpace(cells[2]), "`")
	}
	for _, v := range config.Vars {
		def, ok := rows[v.Name]
		if !ok {
			t.Errorf("README configuration table has no row for %s", v.Name)
			continue
		}
		if def != v.Default {
			t.Errorf("README says %s defaults to %q, config says %q", v.Name, def, v.Default)
		}
	}
}
