package apispec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Value is a decoded JSON value that keeps its order: an object keeps its
// members in the order they came, so a document decoded and encoded again
// reads the same, and a member added goes where it is put.
type Value struct {
	// Object holds an object's members, in order (Kind '{').
	Object []Member
	// Array holds an array's items (Kind '[').
	Array []*Value
	// Raw is any other value, as JSON text.
	Raw json.RawMessage
	// Kind is '{', '[' or 0 (Raw).
	Kind byte
}

// Member is one member of an object.
type Member struct {
	Key   string
	Value *Value
}

// Decode reads one JSON document. escapeHTML is how its strings are written
// again: true as encoding/json (and swag) writes them, false as they are.
func Decode(data []byte, escapeHTML bool) (*Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec, escapeHTML)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("apispec: data after the JSON document")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, escapeHTML bool) (*Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			v := &Value{Kind: '{', Object: []Member{}}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				child, err := decodeValue(dec, escapeHTML)
				if err != nil {
					return nil, err
				}
				v.Object = append(v.Object, Member{Key: kt.(string), Value: child})
			}
			_, err := dec.Token() // '}'
			return v, err
		case '[':
			v := &Value{Kind: '[', Array: []*Value{}}
			for dec.More() {
				child, err := decodeValue(dec, escapeHTML)
				if err != nil {
					return nil, err
				}
				v.Array = append(v.Array, child)
			}
			_, err := dec.Token() // ']'
			return v, err
		}
		return nil, fmt.Errorf("apispec: unexpected %v", t)
	case string:
		return &Value{Raw: marshalString(t, escapeHTML)}, nil
	case json.Number:
		return &Value{Raw: json.RawMessage(t)}, nil
	case bool:
		if t {
			return &Value{Raw: json.RawMessage("true")}, nil
		}
		return &Value{Raw: json.RawMessage("false")}, nil
	case nil:
		return &Value{Raw: json.RawMessage("null")}, nil
	}
	return nil, fmt.Errorf("apispec: unexpected token %v", tok)
}

func marshalString(s string, escapeHTML bool) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(escapeHTML)
	_ = enc.Encode(s) // a string always encodes
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// String is a string value.
func String(s string) *Value { return &Value{Raw: marshalString(s, true)} }

// Compact is v as compact JSON text.
func (v *Value) Compact() []byte {
	var b bytes.Buffer
	v.write(&b)
	return b.Bytes()
}

// Indent is v as JSON text indented as json.MarshalIndent(v, "", indent) does.
func (v *Value) Indent(indent string) []byte {
	var b bytes.Buffer
	_ = json.Indent(&b, v.Compact(), "", indent) // Compact is valid JSON
	return b.Bytes()
}

func (v *Value) write(b *bytes.Buffer) {
	switch v.Kind {
	case '{':
		b.WriteByte('{')
		for i, m := range v.Object {
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(marshalString(m.Key, true))
			b.WriteByte(':')
			m.Value.write(b)
		}
		b.WriteByte('}')
	case '[':
		b.WriteByte('[')
		for i, item := range v.Array {
			if i > 0 {
				b.WriteByte(',')
			}
			item.write(b)
		}
		b.WriteByte(']')
	default:
		b.Write(v.Raw)
	}
}

// Get is the member key of an object, nil when v is not an object or has none.
func (v *Value) Get(key string) *Value {
	if v == nil || v.Kind != '{' {
		return nil
	}
	for _, m := range v.Object {
		if m.Key == key {
			return m.Value
		}
	}
	return nil
}

// Set replaces the member key of an object, or appends it.
func (v *Value) Set(key string, val *Value) {
	for i, m := range v.Object {
		if m.Key == key {
			v.Object[i].Value = val
			return
		}
	}
	v.Object = append(v.Object, Member{Key: key, Value: val})
}

// Str is the value of a JSON string ("" for anything else).
func (v *Value) Str() string {
	var s string
	if v == nil || v.Kind != 0 || json.Unmarshal(v.Raw, &s) != nil {
		return ""
	}
	return s
}
