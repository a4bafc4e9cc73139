package server

import (
	"encoding"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// wantOf says, for an operator, what a value of type t looks like.
func wantOf(t reflect.Type) string {
	switch {
	case t == durationType:
		return "a duration such as 500ms, 5s, 2m or 24h"
	case reflect.PointerTo(t).Implements(textUnmarshaler):
		return "a " + strings.ToLower(t.Name())
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number, 0 or more"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.String {
			return "a list of values (or one comma-separated value)"
		}
		return "a list of values (or one comma-separated value), each " + wantOf(t.Elem())
	case reflect.Map:
		return "a mapping of names to values"
	case reflect.Struct:
		return "a mapping of keys"
	}
	return "text"
}

// valueError is text that is not a value of the setting's type.
type valueError struct {
	text, want string
}

func (e *valueError) Error() string { return fmt.Sprintf("%q: want %s", e.text, e.want) }

// setText parses s into v as its type reads it: the same rules for the
// file, the environment and per-feed flags. A list takes comma-separated
// values.
func setText(v reflect.Value, s string) error {
	bad := &valueError{text: s, want: wantOf(v.Type())}
	if v.CanAddr() && v.Addr().Type().Implements(textUnmarshaler) {
		if err := v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s)); err != nil {
			return fmt.Errorf("%w: %v", bad, err)
		}
		return nil
	}
	if v.Type() == durationType {
		d, err := time.ParseDuration(s)
		if err != nil {
			return bad
		}
		v.SetInt(int64(d))
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return bad
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, v.Type().Bits())
		if err != nil {
			return bad
		}
		v.SetInt(n)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(s, 10, v.Type().Bits())
		if err != nil {
			return bad
		}
		v.SetUint(n)
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(s, v.Type().Bits())
		if err != nil {
			return bad
		}
		v.SetFloat(f)
	case reflect.Slice:
		return setList(v, strings.Split(s, ","))
	default:
		return fmt.Errorf("%q: want %s, not a single value", s, wantOf(v.Type()))
	}
	return nil
}

// setList sets the list v to items, each trimmed; empty items are dropped.
func setList(v reflect.Value, items []string) error {
	out := reflect.MakeSlice(v.Type(), 0, len(items))
	for _, it := range items {
		if it = strings.TrimSpace(it); it == "" {
			continue
		}
		e := reflect.New(v.Type().Elem()).Elem()
		if err := setText(e, it); err != nil {
			return err
		}
		out = reflect.Append(out, e)
	}
	if out.Len() == 0 {
		out = reflect.Zero(v.Type()) // an empty list is no list, as the defaults have it
	}
	v.Set(out)
	return nil
}
