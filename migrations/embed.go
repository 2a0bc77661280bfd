// Package migrations embeds the versioned SQL migrations (goose format) that
// `valruns migrate` applies. Files are NNNN_name.sql and never change once
// released: a schema change is a new file.
package migrations

import "embed"

// FS holds every migration file.
//
//go:embed *.sql
var FS embed.FS
