package apispec

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Tighten writes into spec, a Swagger 2.0 document as swag generated it,
// the server's rules that swag's annotations cannot express. Each is written
// in the annotations as far as swag allows, and finished here:
//
//   - A pattern: swag (v1.16) has no pattern attribute, for parameters or
//     struct fields. Write it as the extension x-pattern (`extensions(x-pattern=...)`
//     on a @Param, `extensions:"x-pattern=..."` on a field); Tighten renames
//     it pattern.
//   - A list's least length: swag v1.16.6 reads no minItems struct tag (it
//     has the field, but never sets it: the tag is dropped silently). Write
//     it as the extension x-min-items (`extensions:"x-min-items=1"`);
//     Tighten renames it minItems, a number.
//   - Unknown members refused: every request body is decoded strictly (an
//     unknown member is a 400), so every definition a body parameter
//     reaches, through properties and items, gets additionalProperties:
//     false. A definition that is also a response's (validate.Assertion)
//     says the same of the answer, which holds.
//   - Public operations: an operation without @Security gets `security: []`,
//     which says "no authentication" explicitly rather than by omission.
//   - Free-form objects (metadata): a schema of type object with neither
//     properties nor additionalProperties gets additionalProperties: true.
//     It means the same, but generators read the bare form as "no members"
//     (openapi-typescript: Record<string, never>).
func Tighten(spec *Value) error {
	renamePattern(spec)
	if err := renameMinItems(spec); err != nil {
		return err
	}
	openFreeForm(spec.Get("definitions"))
	paths := spec.Get("paths")
	if paths == nil {
		return fmt.Errorf("the spec has no paths")
	}
	bodies := map[string]bool{}
	for _, p := range paths.Object {
		for _, m := range p.Value.Object {
			op := m.Value
			if op.Kind != '{' {
				continue
			}
			if op.Get("security") == nil {
				op.Set("security", &Value{Kind: '[', Array: []*Value{}})
			}
			for _, param := range op.Get("parameters").arrayItems() {
				if param.Get("in").Str() == "body" {
					if name, ok := definitionRef(param.Get("schema")); ok {
						bodies[name] = true
					}
				}
			}
		}
	}
	defs := spec.Get("definitions")
	closed := map[string]bool{}
	var close func(name string) error
	close = func(name string) error {
		if closed[name] {
			return nil
		}
		def := defs.Get(name)
		if def == nil {
			return fmt.Errorf("a body refers to definition %q, which is not in the spec", name)
		}
		closed[name] = true
		props := def.Get("properties")
		if props == nil {
			return nil // free-form: nothing to close
		}
		def.Set("additionalProperties", &Value{Raw: json.RawMessage("false")})
		for _, m := range props.Object {
			for _, s := range []*Value{m.Value, m.Value.Get("items")} {
				if ref, ok := definitionRef(s); ok {
					if err := close(ref); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
	names := make([]string, 0, len(bodies))
	for name := range bodies {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := close(name); err != nil {
			return err
		}
	}
	return nil
}

// renamePattern renames every member x-pattern of v, at any depth, pattern.
func renamePattern(v *Value) {
	if v == nil {
		return
	}
	for i := range v.Object {
		if v.Object[i].Key == "x-pattern" {
			v.Object[i].Key = "pattern"
		}
		renamePattern(v.Object[i].Value)
	}
	for _, item := range v.Array {
		renamePattern(item)
	}
}

// renameMinItems renames every member x-min-items of v, at any depth,
// minItems, with the number its string holds.
func renameMinItems(v *Value) error {
	if v == nil {
		return nil
	}
	for i := range v.Object {
		m := &v.Object[i]
		if m.Key == "x-min-items" {
			n, err := strconv.ParseUint(m.Value.Str(), 10, 31)
			if err != nil {
				return fmt.Errorf("x-min-items %s is not a count: %w", m.Value.Compact(), err)
			}
			m.Key, m.Value = "minItems", &Value{Raw: json.RawMessage(strconv.FormatUint(n, 10))}
			continue
		}
		if err := renameMinItems(m.Value); err != nil {
			return err
		}
	}
	for _, item := range v.Array {
		if err := renameMinItems(item); err != nil {
			return err
		}
	}
	return nil
}

// openFreeForm gives every free-form object schema under v, at any depth,
// additionalProperties: true.
func openFreeForm(v *Value) {
	if v == nil {
		return
	}
	if v.Get("type").Str() == "object" && v.Get("properties") == nil && v.Get("additionalProperties") == nil {
		v.Set("additionalProperties", &Value{Raw: json.RawMessage("true")})
	}
	for _, m := range v.Object {
		openFreeForm(m.Value)
	}
	for _, item := range v.Array {
		openFreeForm(item)
	}
}

func (v *Value) arrayItems() []*Value {
	if v == nil {
		return nil
	}
	return v.Array
}

// definitionRef is the name of the definition schema s refers to.
func definitionRef(s *Value) (string, bool) {
	return strings.CutPrefix(s.Get("$ref").Str(), "#/definitions/")
}
