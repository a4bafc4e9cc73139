package server

import (
	"fmt"
	"os"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"
)

// FileError is a mistake in the configuration file: it names the file,
// the line and the key, and says what was expected there.
type FileError struct {
	Path string
	Line int
	Key  string // "" when the mistake is not one key's (a syntax error)
	Msg  string
}

// Error reads "--config FILE: line N: KEY: what is wrong".
func (e *FileError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "--config %s: ", e.Path)
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// loadYAML reads the file at path into c, key by key: every key must be
// one of Config's, every value of its key's type. It records where each
// value came from in c.origins; a deprecated key is read and warned of.
func loadYAML(path string, c *Config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		line, msg := yamlLine(err.Error())
		return &FileError{Path: path, Line: line, Msg: msg}
	}
	if len(doc.Content) == 0 {
		return nil // an empty file sets nothing
	}
	d := &fileDecoder{path: path, c: c}
	return d.decode(doc.Content[0], reflect.ValueOf(c).Elem(), "")
}

// yamlLine splits yaml.v3's "yaml: line N: msg" into N and msg.
func yamlLine(s string) (int, string) {
	s = strings.TrimPrefix(s, "yaml: ")
	var line int
	if _, err := fmt.Sscanf(s, "line %d:", &line); err == nil {
		_, msg, _ := strings.Cut(s, ": ")
		return line, msg
	}
	return 0, s
}

// fileDecoder walks a YAML document beside Config's fields.
type fileDecoder struct {
	path string
	c    *Config
}

func (d *fileDecoder) fail(n *yaml.Node, key, format string, args ...any) error {
	return &FileError{Path: d.path, Line: n.Line, Key: key, Msg: fmt.Sprintf(format, args...)}
}

// decode sets v, found at key (a dotted path), from n.
func (d *fileDecoder) decode(n *yaml.Node, v reflect.Value, key string) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		v = v.Elem()
	}
	t := v.Type()
	switch {
	case reflect.PointerTo(t).Implements(yamlUnmarshaler):
		if err := n.Decode(v.Addr().Interface()); err != nil {
			return d.fail(n, key, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		}
		d.c.setOrigin(key, d.origin(n))
		return nil
	case isValue(t):
		return d.value(n, v, key)
	case t.Kind() == reflect.Struct:
		return d.structFields(n, v, key)
	case t.Kind() == reflect.Map:
		return d.mapEntries(n, v, key)
	case t.Kind() == reflect.Slice:
		return d.listItems(n, v, key)
	}
	return d.fail(n, key, "cannot be set in the file")
}

func (d *fileDecoder) origin(n *yaml.Node) string { return fmt.Sprintf("%s:%d", d.path, n.Line) }

// value sets a scalar, or a list of scalars, from n.
func (d *fileDecoder) value(n *yaml.Node, v reflect.Value, key string) error {
	switch {
	case n.Kind == yaml.ScalarNode && n.Tag == "!!null":
		switch v.Kind() {
		case reflect.Slice, reflect.String:
			v.SetZero()
		default:
			return d.fail(n, key, "no value: want %s", wantOf(v.Type()))
		}
	case n.Kind == yaml.ScalarNode:
		if err := setText(v, n.Value); err != nil {
			return d.fail(n, key, "%v", err)
		}
	case n.Kind == yaml.SequenceNode && v.Kind() == reflect.Slice:
		items := make([]string, 0, len(n.Content))
		for _, it := range n.Content {
			if it.Kind != yaml.ScalarNode {
				return d.fail(it, key, "want %s, not a nested list or mapping", wantOf(v.Type()))
			}
			items = append(items, it.Value)
		}
		if err := setList(v, items); err != nil {
			return d.fail(n, key, "%v", err)
		}
	default:
		return d.fail(n, key, "want %s, not %s", wantOf(v.Type()), kindName(n))
	}
	d.c.setOrigin(key, d.origin(n))
	return nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	}
	return "a single value"
}

// pairs calls fn for each key and value of the mapping n, refusing a key
// given twice.
func (d *fileDecoder) pairs(n *yaml.Node, key string, want string, fn func(k string, kn, vn *yaml.Node) error) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return d.fail(n, key, "want %s, not %s", want, kindName(n))
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		if kn.Kind != yaml.ScalarNode {
			return d.fail(kn, key, "a key must be a name, not %s", kindName(kn))
		}
		if line, dup := seen[kn.Value]; dup {
			return d.fail(kn, join(key, kn.Value), "given twice (first on line %d)", line)
		}
		seen[kn.Value] = kn.Line
		if err := fn(kn.Value, kn, vn); err != nil {
			return err
		}
	}
	return nil
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// structFields sets a struct's fields from the mapping n; an unknown key
// is refused, naming the closest known one.
func (d *fileDecoder) structFields(n *yaml.Node, v reflect.Value, key string) error {
	fields := structKeys(v.Type(), nil, map[string][]int{})
	return d.pairs(n, key, "a mapping of keys", func(k string, kn, vn *yaml.Node) error {
		full := join(key, k)
		if i, ok := fields[k]; ok {
			return d.decode(vn, v.FieldByIndex(i), full)
		}
		if moved, ok := deprecatedKeys[full]; ok {
			d.c.warnings = append(d.c.warnings, fmt.Sprintf("%s line %d: %s is deprecated: use %s", d.path, kn.Line, full, moved))
			return d.decode(vn, fieldAt(reflect.ValueOf(d.c).Elem(), moved), moved)
		}
		known := make(map[string]bool, len(fields))
		for name := range fields {
			known[join(key, name)] = true
		}
		return d.fail(kn, "", "unknown key %s (the closest known key is %s)", full, closest(full, known))
	})
}

// structKeys adds to keys the YAML keys of struct type t's fields, with
// their indexes under index; an inline struct's keys are t's own.
func structKeys(t reflect.Type, index []int, keys map[string][]int) map[string][]int {
	for i := range t.NumField() {
		f := t.Field(i)
		idx := append(append([]int{}, index...), i)
		if inline(f) {
			structKeys(f.Type, idx, keys)
		} else if name := yamlName(f); name != "" {
			keys[name] = idx
		}
	}
	return keys
}

// fieldAt is the field at a dotted key path of struct fields.
func fieldAt(v reflect.Value, path string) reflect.Value {
	for _, name := range strings.Split(path, ".") {
		if i, ok := structKeys(v.Type(), nil, map[string][]int{})[name]; ok {
			v = v.FieldByIndex(i)
		}
	}
	return v
}

// mapEntries sets a map's entries from the mapping n; an entry present
// already is decoded onto.
func (d *fileDecoder) mapEntries(n *yaml.Node, v reflect.Value, key string) error {
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	et := v.Type().Elem()
	return d.pairs(n, key, "a mapping of names", func(k string, kn, vn *yaml.Node) error {
		e := reflect.New(et).Elem()
		if old := v.MapIndex(reflect.ValueOf(k)); old.IsValid() {
			e.Set(old)
		}
		if err := d.decode(vn, e, join(key, k)); err != nil {
			return err
		}
		v.SetMapIndex(reflect.ValueOf(k), e)
		return nil
	})
}

// listItems sets a list of mappings from the sequence n.
func (d *fileDecoder) listItems(n *yaml.Node, v reflect.Value, key string) error {
	if n.Kind != yaml.SequenceNode {
		return d.fail(n, key, "want a list, not %s", kindName(n))
	}
	out := reflect.MakeSlice(v.Type(), 0, len(n.Content))
	for i, it := range n.Content {
		e := reflect.New(v.Type().Elem()).Elem()
		if err := d.decode(it, e, fmt.Sprintf("%s[%d]", key, i)); err != nil {
			return err
		}
		out = reflect.Append(out, e)
	}
	v.Set(out)
	return nil
}
