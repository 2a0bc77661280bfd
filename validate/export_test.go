package validate

import "time"

// SetEvalTimeout lets tests reach the evaluation time limit without waiting EvalTimeout.
func SetEvalTimeout(p *Program, d time.Duration) { p.evalTimeout = d }

// SetSchemaTimeout lets tests reach the schema time limit without waiting SchemaTimeout.
func SetSchemaTimeout(p *Program, d time.Duration) { p.schemaTimeout = d }

// SetStallTimeout lets tests reach StallTimeout without waiting it.
func SetStallTimeout(p *Program, d time.Duration) { p.stallTimeout = d }

// SetLostTime makes p call f at each look at the clocks during Run: f stands in for the
// worker being stopped (sleeping loses wall time and uses no CPU time).
func SetLostTime(p *Program, f func()) { p.lostTime = f }

// NewCELEnv builds a fresh CEL environment as Compile's is built.
var NewCELEnv = newCELEnv
