package server

import (
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
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

	syntax bool // the file is no YAML: nothing of it was read
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

// ConfigErrors are all the mistakes found in a configuration, each on a
// line of its own (a file's by line).
type ConfigErrors []error

// Error is one mistake a line.
func (e ConfigErrors) Error() string {
	lines := make([]string, len(e))
	for i, err := range e {
		lines[i] = oneLine(err.Error())
	}
	return strings.Join(lines, "\n")
}

// Unwrap gives errors.Is and errors.As the mistakes.
func (e ConfigErrors) Unwrap() []error { return e }

// joinConfigErrors is nil for no error, the error itself for one, and
// ConfigErrors (flattened) for more.
func joinConfigErrors(errs ...error) error {
	var all ConfigErrors
	for _, err := range errs {
		var ce ConfigErrors
		switch {
		case err == nil:
		case errors.As(err, &ce):
			all = append(all, ce...)
		default:
			all = append(all, err)
		}
	}
	switch len(all) {
	case 0:
		return nil
	case 1:
		return all[0]
	}
	return all
}

// byLine sorts the mistakes of ConfigErrors by their line in the file,
// those of no line last.
func byLine(err error) error {
	ce, ok := err.(ConfigErrors)
	if !ok {
		return err
	}
	line := func(e error) int {
		var fe *FileError
		if errors.As(e, &fe) && fe.Line > 0 {
			return fe.Line
		}
		return math.MaxInt
	}
	sorted := slices.Clone(ce)
	sort.SliceStable(sorted, func(i, j int) bool { return line(sorted[i]) < line(sorted[j]) })
	return sorted
}

// loadYAML reads the file at path into c, key by key: every key must be
// one of Config's, every value of its key's type. It records where each
// value came from in c.origins; a deprecated key is read and warned of.
// It reads on past a mistake, and returns every one (ConfigErrors), in
// the order of their lines.
func loadYAML(path string, c *Config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		line, msg := yamlLine(err.Error())
		bad, why := badIndent(b, line)
		if bad == 0 && line > 1 {
			bad, why = badIndent(b, 1) // one the parser passed over
		}
		if bad > 0 {
			line, msg = bad, why+" ("+msg+")"
		}
		return &FileError{Path: path, Line: line, Msg: msg, syntax: true}
	}
	if len(doc.Content) == 0 {
		return nil // an empty file sets nothing
	}
	d := &fileDecoder{path: path, c: c}
	d.note(d.decode(doc.Content[0], reflect.ValueOf(c).Elem(), ""))
	sort.SliceStable(d.errs, func(i, j int) bool { return d.errs[i].Line < d.errs[j].Line })
	errs := make([]error, len(d.errs))
	for i, e := range d.errs {
		errs[i] = e
	}
	return joinConfigErrors(errs...)
}

// badIndent finds, from line from (1-based) on, the first line of b whose
// indentation the YAML parser cannot place: a tab in it, or a key
// indented to no level of the keys above it, or deeper under a key that
// holds a value. yaml.v3 reports such a mistake at the line of the
// mapping it breaks, not at the line itself. It returns 0 when it finds
// none.
func badIndent(b []byte, from int) (int, string) {
	type level struct {
		indent int
		opens  bool // the line ends with ':' (or is a list item): deeper lines belong to it
	}
	var stack []level
	block := -1 // the indentation of a key whose block scalar (| or >) is being read
	for i, raw := range strings.Split(string(b), "\n") {
		n := i + 1
		text := strings.TrimRight(raw, " \r")
		trimmed := strings.TrimLeft(text, " ")
		indent := len(text) - len(trimmed)
		if trimmed == "" {
			continue
		}
		if block >= 0 {
			if indent > block {
				continue
			}
			block = -1
		}
		if strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, "---") || strings.HasPrefix(trimmed, "...") {
			continue
		}
		if strings.HasPrefix(trimmed, "\t") {
			if n >= from {
				return n, "a tab in the indentation (YAML indents with spaces)"
			}
			continue
		}
		var above []string // the levels open above the line
		for _, l := range stack {
			above = append(above, strconv.Itoa(l.indent))
		}
		popped := false
		for len(stack) > 0 && stack[len(stack)-1].indent > indent {
			stack, popped = stack[:len(stack)-1], true
		}
		if len(stack) > 0 {
			top := stack[len(stack)-1]
			switch {
			case top.indent == indent:
				stack = stack[:len(stack)-1] // a sibling: it takes the level's place
			case popped && n >= from:
				return n, fmt.Sprintf("indented by %d spaces, which matches no key above it (indented by %s)",
					indent, strings.Join(above, ", "))
			case !top.opens && n >= from:
				return n, fmt.Sprintf("indented by %d spaces, deeper than the key above it (%d), which holds a value", indent, top.indent)
			}
		}
		body := strings.TrimSpace(strings.SplitN(trimmed, " #", 2)[0])
		if item, ok := strings.CutPrefix(body, "- "); ok || body == "-" {
			stack = append(stack, level{indent: indent, opens: true})
			if item = strings.TrimLeft(item, " "); item != "" {
				stack = append(stack, level{indent: indent + len(body) - len(item), opens: strings.HasSuffix(item, ":")})
			}
			continue
		}
		opensBlock := strings.HasSuffix(body, ":")
		if strings.HasSuffix(body, "|") || strings.HasSuffix(body, ">") || strings.HasSuffix(body, "|-") || strings.HasSuffix(body, ">-") {
			block = indent
		}
		stack = append(stack, level{indent: indent, opens: opensBlock})
	}
	return 0, ""
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
	errs []*FileError // the mistakes found so far
}

func (d *fileDecoder) fail(n *yaml.Node, key, format string, args ...any) error {
	return &FileError{Path: d.path, Line: n.Line, Key: key, Msg: fmt.Sprintf(format, args...)}
}

// note keeps err, a mistake, and reads on.
func (d *fileDecoder) note(err error) {
	var fe *FileError
	switch {
	case err == nil:
	case errors.As(err, &fe):
		d.errs = append(d.errs, fe)
	default:
		d.errs = append(d.errs, &FileError{Path: d.path, Msg: err.Error()})
	}
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
			d.note(d.fail(kn, key, "a key must be a name, not %s", kindName(kn)))
			continue
		}
		if line, dup := seen[kn.Value]; dup {
			d.note(d.fail(kn, join(key, kn.Value), "given twice (first on line %d)", line))
			continue
		}
		seen[kn.Value] = kn.Line
		d.note(fn(kn.Value, kn, vn)) // a mistake in one entry: the others are read still
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
			d.note(err)
			continue
		}
		out = reflect.Append(out, e)
	}
	v.Set(out)
	return nil
}
