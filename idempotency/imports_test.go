package idempotency_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImportsNoService: the wrapper is generic. Besides the problem
// documents and the canonical JSON form, it imports no package of the
// service (models implements its Store, not the other way round) and no
// database driver, so any service can take it for any route.
func TestImportsNoService(t *testing.T) {
	t.Parallel()
	allowed := []string{"github.com/valruns/valruns/problem", "github.com/valruns/valruns/internal/canonjson"}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		require.NoError(t, err)
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err)
			service := strings.HasPrefix(path, "github.com/valruns/valruns/") && !slices.Contains(allowed, path)
			driver := strings.HasPrefix(path, "gorm.io/") || strings.HasPrefix(path, "github.com/jackc/") || path == "database/sql"
			require.False(t, service || driver, "%s imports %s", name, path)
		}
	}
}
