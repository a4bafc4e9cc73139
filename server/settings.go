package server

import (
	"encoding"
	"flag"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Setting is one configuration setting as the file, the environment and
// the command line know it. The list of settings is derived from Config's
// yaml tags and the flags bound to its fields, so a field needs nothing
// but its yaml tag and its flag to be read, documented and printed.
type Setting struct {
	// Key is the YAML key path, e.g. "relay.mode"; NAME stands for a feed's
	// name ("feeds.NAME.topic"). "" for a flag the file does not set.
	Key string
	// Flag is the flag's name without dashes, "" for a key only the file sets.
	Flag string
	// Placeholder names the flag's value in help and docs (e.g. "N", "D").
	Placeholder string
	// Env is the environment variable, "" when the environment does not set it.
	Env string
	// Default is the default value as text ("" for none).
	Default string
	// Usage says what the setting does: the flag's help text, or the
	// field's `usage` tag for a key without a flag.
	Usage string

	leaf *leaf
}

// leaf is a field of Config (or of a feed's FeedConfig) that holds a value.
type leaf struct {
	key   string       // YAML key path, NAME for map entries
	typ   reflect.Type // the field's type
	index []int        // from Config; nil under a map or a list
	usage string       // the field's `usage` tag
}

// feedsKey is the YAML key of the feeds, whose entries the per-feed flags
// (NAME=VALUE) set.
const feedsKey = "feeds"

// nameHolder stands for a map entry's name in a key path.
const nameHolder = "NAME"

// leaves lists Config's value fields in declaration order.
func leaves() []*leaf {
	var out []*leaf
	walkFields(reflect.TypeFor[Config](), "", nil, func(l *leaf) { out = append(out, l) })
	return out
}

// walkFields calls fn for every value field of struct type t, recursing
// into nested structs, maps of structs (key prefix.NAME.) and lists of
// structs (prefix[].). index is nil under a map or list.
func walkFields(t reflect.Type, prefix string, index []int, fn func(*leaf)) {
	for i := range t.NumField() {
		f := t.Field(i)
		var idx []int
		if index != nil || prefix == "" {
			idx = append(append([]int{}, index...), i)
		}
		if inline(f) {
			// An inline struct's keys are its parent's.
			walkFields(f.Type, prefix, idx, fn)
			continue
		}
		name := yamlName(f)
		if name == "" {
			continue
		}
		key := prefix + name
		ft := f.Type
		switch {
		case isValue(ft):
			fn(&leaf{key: key, typ: ft, index: idx, usage: f.Tag.Get("usage")})
		case ft.Kind() == reflect.Struct:
			walkFields(ft, key+".", idx, fn)
		case ft.Kind() == reflect.Map && structType(ft.Elem()) != nil:
			walkFields(structType(ft.Elem()), key+"."+nameHolder+".", nil, fn)
		case ft.Kind() == reflect.Slice && structType(ft.Elem()) != nil:
			walkFields(structType(ft.Elem()), key+"[].", nil, fn)
		default:
			fn(&leaf{key: key, typ: ft, index: idx, usage: f.Tag.Get("usage")})
		}
	}
}

// inline reports whether f is a struct whose keys YAML reads as its
// parent's (`yaml:",inline"`).
func inline(f reflect.StructField) bool {
	_, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return f.Type.Kind() == reflect.Struct && slices.Contains(strings.Split(opts, ","), "inline")
}

// yamlName is a field's YAML key, "" for a field the file does not set.
func yamlName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" {
		return ""
	}
	if name == "" {
		return strings.ToLower(f.Name)
	}
	return name
}

// structType is t's struct type (through a pointer), nil when t is none,
// or when it decodes itself.
func structType(t reflect.Type) reflect.Type {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || isValue(t) {
		return nil
	}
	return t
}

var (
	durationType    = reflect.TypeFor[time.Duration]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
	yamlUnmarshaler = reflect.TypeFor[yaml.Unmarshaler]()
)

// isValue reports whether t is read as one value: a scalar, a list of
// scalars, or a type that decodes itself.
func isValue(t reflect.Type) bool {
	if t == durationType || reflect.PointerTo(t).Implements(textUnmarshaler) || reflect.PointerTo(t).Implements(yamlUnmarshaler) {
		return true
	}
	switch t.Kind() {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return true
	case reflect.Slice:
		return isValue(t.Elem()) && t.Elem().Kind() != reflect.Slice
	}
	return false
}

// bindings maps each flag of fs, bound to c, to the leaf it sets: a flag
// whose value points at a field sets that field; a per-feed flag sets the
// feed's field of its key. Flags that set no field (--config, the
// command-line-only ones) are absent.
func bindings(c *Config, fs *flag.FlagSet) map[string]*leaf {
	byAddr := map[uintptr]*leaf{}
	byKey := map[string]*leaf{}
	root := reflect.ValueOf(c).Elem()
	for _, l := range leaves() {
		byKey[l.key] = l
		if l.index != nil {
			byAddr[root.FieldByIndex(l.index).Addr().Pointer()] = l
		}
	}
	out := map[string]*leaf{}
	fs.VisitAll(func(f *flag.Flag) {
		if k, ok := f.Value.(keyedFlag); ok {
			if l := byKey[k.settingKey()]; l != nil {
				out[f.Name] = l
			}
			return
		}
		if pf, ok := f.Value.(perFeed); ok {
			if l := byKey[feedsKey+"."+nameHolder+"."+pf.key]; l != nil {
				out[f.Name] = l
			}
			return
		}
		if p, ok := valuePointer(f.Value); ok {
			if l := byAddr[p]; l != nil {
				out[f.Name] = l
			}
		}
	})
	return out
}

// keyedFlag is a flag.Value that names the key it sets, for a flag whose
// value is not a pointer to its field (one that parses its own syntax).
type keyedFlag interface {
	flag.Value
	settingKey() string
}

// valuePointer is the address a flag.Value writes to: the value itself
// when it is a pointer (the flag package's own values), or the first
// pointer field of a struct value (such as list).
func valuePointer(v flag.Value) (uintptr, bool) {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer:
		return rv.Pointer(), true
	case reflect.Struct:
		for i := range rv.NumField() {
			if rv.Field(i).Kind() == reflect.Pointer {
				return rv.Field(i).Pointer(), true
			}
		}
	}
	return 0, false
}

// Settings lists every setting: each YAML key in Config's order with its
// flag, then the flags the file does not set.
func Settings() []Setting {
	c := DefaultConfig()
	var p string
	fs := flagSet(&c, &p, &givenSettings{})
	bound := bindings(&c, fs)
	flagOf := map[string]*flag.Flag{} // by key
	fs.VisitAll(func(f *flag.Flag) {
		if l := bound[f.Name]; l != nil {
			flagOf[l.key] = f
		}
	})
	root := reflect.ValueOf(&c).Elem()
	var out []Setting
	for _, l := range leaves() {
		s := Setting{Key: l.key, Usage: l.usage, leaf: l}
		if l.index != nil {
			s.Default = formatValue(root.FieldByIndex(l.index))
		}
		if f := flagOf[l.key]; f != nil {
			s.setFlag(f)
		}
		out = append(out, s)
	}
	fs.VisitAll(func(f *flag.Flag) {
		if bound[f.Name] == nil {
			s := Setting{}
			s.setFlag(f)
			out = append(out, s)
		}
	})
	return out
}

// setFlag fills the flag's name, placeholder, variable, default and usage.
func (s *Setting) setFlag(f *flag.Flag) {
	s.Placeholder, s.Usage = flag.UnquoteUsage(f)
	s.Flag = f.Name
	if s.leaf == nil || s.leaf.index == nil || s.Default == "" {
		s.Default = f.DefValue
	}
	if !cmdlineOnly[f.Name] {
		s.Env = envName(f.Name)
	}
}

// formatValue writes a value as the configuration reads it back.
func formatValue(v reflect.Value) string {
	if v.Type() == durationType {
		return shortDuration(time.Duration(v.Int()))
	}
	if m, ok := v.Interface().(encoding.TextMarshaler); ok {
		b, err := m.MarshalText()
		if err == nil {
			return string(b)
		}
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return ""
		}
		return formatValue(v.Elem())
	case reflect.Map:
		if v.Len() == 0 {
			return ""
		}
	}
	if v.Kind() == reflect.Slice {
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = formatValue(v.Index(i))
		}
		return strings.Join(parts, ",")
	}
	return fmt.Sprint(v.Interface())
}

// shortDuration is d as time.Duration.String writes it, without its zero
// minutes and seconds (24h, not 24h0m0s).
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
