package problem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/problem"
)

// Every code has one page, with a status and the parts a reader needs.
func TestPagesComplete(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, p := range problem.Pages() {
		name := p.Code.String()
		require.Regexp(t, `^[a-z]+(_[a-z]+)*$`, name)
		require.False(t, seen[name], "%s is declared twice", name)
		seen[name] = true
		require.NotEmpty(t, p.Statuses, name)
		for _, st := range p.Statuses {
			require.True(t, st >= 400 && st < 600, "%s: status %d", name, st)
		}
		require.NotEmpty(t, p.Title, name)
		require.Contains(t, p.Markdown, "\n\n", "%s: say what it means, then what to do", name)
		got, ok := problem.Lookup(name)
		require.True(t, ok, name)
		require.Equal(t, p.Code, got.Code)
		require.Equal(t, "/problems/"+name, problem.New(p.Statuses[0], p.Code, "d").Type)
	}
	_, ok := problem.Lookup("no_such_code")
	require.False(t, ok)
}

// A problem's code is a problem.Code, which only this package can make, so
// every code answered has a page. The one way around it is to build the
// document by hand: the service's code never writes a problem.Details
// literal outside this package (a test may, for a code of its own).
func TestNoDetailsLiterals(t *testing.T) {
	t.Parallel()
	root := ".."
	fset := token.NewFileSet()
	var bad []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// Other modules, generated docs, and this package.
			switch rel, _ := filepath.Rel(root, path); rel {
			case "client", "docs", "tools", "problem", ".git", "bin", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.CompositeLit); ok && isDetails(lit.Type) {
				bad = append(bad, fset.Position(lit.Pos()).String())
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, bad, "build problem documents with problem.New, whose code has a page, not a problem.Details literal")
}

// isDetails is whether a composite literal's type is problem.Details.
func isDetails(e ast.Expr) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "problem" && sel.Sel.Name == "Details"
}

// ReplaceTable replaces what is between the markers, keeps the rest, and
// refuses a document without them.
func TestReplaceTable(t *testing.T) {
	t.Parallel()
	doc := "# The API\n\n" + problem.TableBegin + "\nstale\n" + problem.TableEnd + "\nafter\n"
	got, err := problem.ReplaceTable([]byte(doc))
	require.NoError(t, err)
	require.Equal(t, "# The API\n\n"+problem.TableBegin+"\n"+problem.Table()+problem.TableEnd+"\nafter\n", string(got))
	again, err := problem.ReplaceTable(got)
	require.NoError(t, err)
	require.Equal(t, string(got), string(again), "a current table is left as it is")
	for _, bad := range []string{"# The API\n", problem.TableBegin + "\nno end\n", problem.TableEnd + "\n" + problem.TableBegin + "\n"} {
		_, err := problem.ReplaceTable([]byte(bad))
		require.Error(t, err, "%q", bad)
	}
}
