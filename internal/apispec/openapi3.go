package apispec

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/getkin/kin-openapi/openapi2"
	"github.com/getkin/kin-openapi/openapi2conv"
	"github.com/getkin/kin-openapi/openapi3"
	"sigs.k8s.io/yaml"
)

// ToOpenAPI3 converts spec, the finished Swagger 2.0 document, to OpenAPI 3
// with kin-openapi's converter, and checks the result. The converter is a
// well-kept one (it maps x-nullable to nullable, a body parameter to a
// requestBody, and each response's examples to its content), so the two
// documents say the same.
func ToOpenAPI3(spec *Value) (*openapi3.T, error) {
	var v2 openapi2.T
	if err := json.Unmarshal(spec.Compact(), &v2); err != nil {
		return nil, fmt.Errorf("read the Swagger 2.0 document: %w", err)
	}
	v3, err := openapi2conv.ToV3(&v2)
	if err != nil {
		return nil, fmt.Errorf("convert to OpenAPI 3: %w", err)
	}
	oneMediaTypePerStatus(v3)
	parameterExamples(v3)
	if err := jsonTypes(v3); err != nil {
		return nil, err
	}
	if err := v3.WalkSchemas(typedNullable); err != nil {
		return nil, err
	}
	if err := v3.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("the OpenAPI 3 document is not valid: %w", err)
	}
	return v3, nil
}

// oneMediaTypePerStatus keeps, of a response that offers
// application/problem+json beside other media types, the ones the server
// sends with that status: problem+json alone for an error (4xx, 5xx), the
// others otherwise. Swag 2.0 has one `produces` list per operation, so the
// converter gives every response of an operation that can answer a problem
// every media type; a tool that reads the first one (Portman's contract
// tests, make fuzz-spec) then expects application/json on a 404, and a
// client generator offers a problem body on a 200. Every error answer of
// the API is a problem document (RFC 9457), every success is JSON (or the
// text of a problem page): the conformance check
// (internal/apispec/conform) holds the server to it.
func oneMediaTypePerStatus(v3 *openapi3.T) {
	for _, item := range v3.Paths.Map() {
		for _, op := range item.Operations() {
			if op.Responses == nil {
				continue
			}
			for status, r := range op.Responses.Map() {
				if r.Value == nil || r.Value.Content == nil {
					continue
				}
				c := r.Value.Content
				prob := c["application/problem+json"]
				if prob == nil || len(c) == 1 {
					continue
				}
				if status[0] != '4' && status[0] != '5' && status != "default" {
					delete(c, "application/problem+json")
					continue
				}
				// The converter writes a response's example under the
				// first media type: it moves to the one kept.
				for mt, m := range c {
					if mt != "application/problem+json" && prob.Example == nil && len(prob.Examples) == 0 {
						prob.Example, prob.Examples = m.Example, m.Examples
					}
				}
				r.Value.Content = openapi3.Content{"application/problem+json": prob}
			}
		}
	}
}

// parameterExamples makes a parameter's x-example its example: Swagger 2.0
// allows no example on a parameter that is not the body, so the 2.0 document
// says it with the extension Swagger UI reads there, and OpenAPI 3 has the
// member (where Swagger UI reads it, and fills it in on Try it out).
func parameterExamples(v3 *openapi3.T) {
	for _, item := range v3.Paths.Map() {
		for _, op := range item.Operations() {
			for _, p := range op.Parameters {
				if x, ok := p.Value.Extensions["x-example"]; ok {
					p.Value.Example = x
					delete(p.Value.Extensions, "x-example")
				}
			}
		}
	}
}

// jsonTypes writes, for every schema with the extension x-json-types, the
// JSON types it lists ("object|boolean|null") as anyOf, one branch per type.
// Swagger 2.0 has neither anyOf nor a null type, so swag cannot say that a
// workflow's schema is an object, true, false or null (on a field:
// `extensions:"x-json-types=object|boolean|null"`); the Swagger 2.0 document
// keeps the extension and the field's description. OpenAPI 3.0 has no null
// type either, and its nullable needs a type beside it, so null is said by
// the nullable of the first branch. The extension stays, for the reader.
func jsonTypes(v3 *openapi3.T) error {
	return v3.WalkSchemas(func(ptr string, ref *openapi3.SchemaRef) error {
		s := ref.Value
		list, ok := s.Extensions["x-json-types"].(string)
		if !ok {
			return nil
		}
		if s.Type != nil || len(s.AnyOf) > 0 || s.Nullable {
			return fmt.Errorf("%s: x-json-types says the types, so the schema itself has none (nor anyOf or nullable)", ptr)
		}
		nullable := false
		for _, t := range strings.Split(list, "|") {
			branch := &openapi3.Schema{Type: &openapi3.Types{t}}
			switch t {
			case openapi3.TypeNull:
				nullable = true
				continue
			case openapi3.TypeObject:
				branch.AdditionalProperties = openapi3.AdditionalProperties{Has: openapi3.Ptr(true)}
			case openapi3.TypeArray:
				branch.Items = openapi3.NewSchemaRef("", &openapi3.Schema{})
			case openapi3.TypeString, openapi3.TypeNumber, openapi3.TypeInteger, openapi3.TypeBoolean:
			default:
				return fmt.Errorf("%s: x-json-types %q: %q is not a JSON type", ptr, list, t)
			}
			s.AnyOf = append(s.AnyOf, openapi3.NewSchemaRef("", branch))
		}
		if len(s.AnyOf) == 0 {
			return fmt.Errorf("%s: x-json-types %q names no type but null", ptr, list)
		}
		s.AnyOf[0].Value.Nullable = nullable
		return nil
	})
}

// typedNullable refuses a schema that is nullable without a type: OpenAPI
// 3.0 ignores such a nullable, linters call it an error, and kin-openapi
// (whose Validate lets it pass) takes it to allow null. A member that takes
// any JSON value, null included, is an empty schema: in OpenAPI 3.0.3 a
// schema without type takes every value.
func typedNullable(ptr string, ref *openapi3.SchemaRef) error {
	if s := ref.Value; s.Nullable && (s.Type == nil || len(*s.Type) == 0) {
		return fmt.Errorf("%s: nullable without a type is not valid OpenAPI 3.0 (an empty schema already takes null; give a type, or x-json-types)", ptr)
	}
	return nil
}

// openAPI3Go embeds the OpenAPI 3 files in package docs, which serves them.
const openAPI3Go = `// Code generated by internal/apispec/apply (make docs). DO NOT EDIT.

package docs

import _ "embed"

// OpenAPI3JSON is openapi.json: the OpenAPI 3 document converted from swagger.json.
//
//go:embed openapi.json
var OpenAPI3JSON []byte

// OpenAPI3YAML is openapi.yaml, the same document in YAML.
//
//go:embed openapi.yaml
var OpenAPI3YAML []byte
`

// writeOpenAPI3 writes openapi.json, openapi.yaml and openapi.go into dir.
func writeOpenAPI3(dir string, spec *Value) error {
	v3, err := ToOpenAPI3(spec)
	if err != nil {
		return err
	}
	compact, err := json.Marshal(v3)
	if err != nil {
		return err
	}
	// Re-encoded through Value so that strings are written as swag writes
	// them, and indented as swagger.json is.
	v, err := Decode(compact, true)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "openapi.json"), append(v.Indent("    "), '\n'), 0o644); err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(bytes.TrimSpace(compact))
	if err != nil {
		return fmt.Errorf("openapi.yaml: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "openapi.yaml"), y, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "openapi.go"), []byte(openAPI3Go), 0o644)
}
