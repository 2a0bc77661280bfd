package apispec

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// ApplyDir finishes the three files swag wrote into dir (swag init
// --outputTypes go,json,yaml): swagger.json, swagger.yaml and the spec
// template in docs.go, which is what the service serves. It tightens each
// (Tighten) and applies f to it. Each is written as swag writes it
// (swagger.json indented by four spaces, swagger.yaml converted from the
// JSON with sigs.k8s.io/yaml as swag does, docs.go gofmt-ed), so that only
// the rules and examples differ from swag's own output. Then it converts
// the result to OpenAPI 3: openapi.json, openapi.yaml, and openapi.go,
// which embeds them in package docs.
func ApplyDir(dir string, f *File) error {
	jsonPath := filepath.Join(dir, "swagger.json")
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		return err
	}
	spec, err := Decode(b, true)
	if err != nil {
		return fmt.Errorf("%s: %w", jsonPath, err)
	}
	if err := finish(spec, f); err != nil {
		return fmt.Errorf("%s: %w", jsonPath, err)
	}
	if err := os.WriteFile(jsonPath, spec.Indent("    "), 0o644); err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(spec.Compact())
	if err != nil {
		return fmt.Errorf("swagger.yaml: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "swagger.yaml"), y, 0o644); err != nil {
		return err
	}
	if err := writeOpenAPI3(dir, spec); err != nil {
		return err
	}
	return applyGoDoc(filepath.Join(dir, "docs.go"), f)
}

// finish is what make docs adds to swag's spec: the common responses, the
// rules, then the examples.
func finish(spec *Value, f *File) error {
	if err := ExpandCommon(spec); err != nil {
		return err
	}
	if err := Tighten(spec); err != nil {
		return err
	}
	return Apply(spec, f)
}

// schemesLine is what swag puts first into docs.go's template, where the
// JSON has a Go template action instead of a value.
const schemesLine = "\n    \"schemes\": {{ marshal .Schemes }},"

// applyGoDoc applies f to the spec template of docs.go (const docTemplate):
// JSON but for its first member, whose value is a template action, and with
// every backtick written as `+"`"+`.
func applyGoDoc(path string, f *File) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return err
	}
	expr := docTemplateExpr(file)
	if expr == nil {
		return fmt.Errorf("%s: no const docTemplate", path)
	}
	tmpl, err := stringValue(expr)
	if err != nil {
		return fmt.Errorf("%s: docTemplate: %w", path, err)
	}
	rest, ok := strings.CutPrefix(tmpl, "{"+schemesLine)
	if !ok {
		return fmt.Errorf("%s: docTemplate does not start with %q", path, "{"+schemesLine)
	}
	if f.holds("{{") {
		return errors.New("an example holds {{, which the spec template of docs.go would take for an action")
	}
	spec, err := Decode([]byte("{"+rest), true)
	if err != nil {
		return fmt.Errorf("%s: docTemplate: %w", path, err)
	}
	if err := finish(spec, f); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	out := spec.Indent("    ")
	tmpl = "{" + schemesLine + string(out[1:])
	lit := "`" + strings.ReplaceAll(tmpl, "`", "`+\"`\"+`") + "`"
	start, end := fset.Position(expr.Pos()).Offset, fset.Position(expr.End()).Offset
	code := append(append(append([]byte{}, src[:start]...), lit...), src[end:]...)
	code, err = format.Source(code)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, code, 0o644)
}

func docTemplateExpr(file *ast.File) ast.Expr {
	for _, decl := range file.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, s := range gd.Specs {
			vs := s.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if name.Name == "docTemplate" && i < len(vs.Values) {
					return vs.Values[i]
				}
			}
		}
	}
	return nil
}

// stringValue evaluates a constant expression of string literals joined by +.
func stringValue(e ast.Expr) (string, error) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", fmt.Errorf("not a string: %s", e.Value)
		}
		return strconv.Unquote(e.Value)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", fmt.Errorf("unexpected operator %s", e.Op)
		}
		x, err := stringValue(e.X)
		if err != nil {
			return "", err
		}
		y, err := stringValue(e.Y)
		return x + y, err
	case *ast.ParenExpr:
		return stringValue(e.X)
	}
	return "", fmt.Errorf("unexpected expression %T", e)
}

// holds reports whether an example of f contains s.
func (f *File) holds(s string) bool {
	for _, o := range f.Operations {
		if o.Request != nil {
			if bytes.Contains(o.Request.Body, []byte(s)) {
				return true
			}
			for _, v := range o.Request.Headers {
				if strings.Contains(v, s) {
					return true
				}
			}
		}
		for _, r := range o.Responses {
			if bytes.Contains(r.Body, []byte(s)) || strings.Contains(r.Situation, s) {
				return true
			}
		}
	}
	return false
}
