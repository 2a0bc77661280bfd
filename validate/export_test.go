package validate

import "time"

// SetEvalTimeout lets tests reach the evaluation time limit without waiting EvalTimeout.
func SetEvalTimeout(p *Program, d time.Duration) { p.evalTimeout = d }

// SetSchemaTimeout lets tests reach the schema time limit without waiting SchemaTimeout.
func SetSchemaTimeout(p *Program, d time.Duration) { p.schemaTimeout = d }
