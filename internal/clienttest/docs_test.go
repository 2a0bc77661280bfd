package clienttest

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goBlock is a fenced Go block of a Markdown file.
var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// TestDocsClientExamplesCompile: every Go block of the docs that uses the
// client (README.md and docs/*.md, wherever the client's page is) type-checks
// against the client as it is. A block is a fragment: it is checked as the body
// of a function given ctx and workflowID, with the imports it may use, and a
// variable it declares and leaves unused is not an error.
func TestDocsClientExamplesCompile(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	pages = append(pages, "../../README.md")
	dir, err := filepath.Abs(".")
	require.NoError(t, err)
	fset := token.NewFileSet()
	// "source" type-checks the imports from their source: the client through
	// go.mod's replace, as the service builds it.
	imp := importer.ForCompiler(fset, "source", nil)
	found := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		require.NoError(t, err)
		for i, m := range goBlock.FindAllStringSubmatch(string(b), -1) {
			if !strings.Contains(m[1], "client.New(") {
				continue
			}
			found++
			name := filepath.Join(dir, fmt.Sprintf("%s-block%d.go", filepath.Base(page), i+1))
			src := `package example

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/valruns/valruns/client"
)

var _, _, _, _, _ = errors.Is, fmt.Println, os.Getenv, time.Second, client.New

func example(ctx context.Context, workflowID string) {
` + m[1] + `}
`
			f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
			require.NoError(t, err, "%s: Go block %d does not parse", page, i+1)
			var errs []string
			conf := types.Config{Importer: imp, Error: func(err error) {
				if msg := err.Error(); !strings.Contains(msg, "declared and not used") {
					errs = append(errs, msg)
				}
			}}
			_, _ = conf.Check("example", fset, []*ast.File{f}, nil)
			require.Empty(t, errs, "%s: Go block %d does not compile against the client:\n%s", page, i+1, m[1])
		}
	}
	require.NotZero(t, found, "no Go block of the docs uses client.New: the test looks in README.md and docs/*.md")
}
