package sink

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Option is one setting a target reads from its sink's options map: its
// name and the setter that parses a value into the target's configuration.
type Option struct {
	// Name is the option's name, as the sinks: section spells it.
	Name string
	// Set parses the option's value into the configuration, or says what
	// a value of it looks like.
	Set func(v string) error
}

// SetOptions sets each of opts, in name order, with the option of known
// that has its name. An option known does not name is an error listing
// known's names, an error of a setter one naming the option and its value.
// target names the kind of sink in the error, such as "a webhook sink".
func SetOptions(target string, opts map[string]string, known []Option) error {
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := opts[k]
		i := indexOption(known, k)
		if i < 0 {
			names := make([]string, len(known))
			for j, o := range known {
				names[j] = o.Name
			}
			return fmt.Errorf("option %q: %s reads %s", k, target, strings.Join(names, ", "))
		}
		if err := known[i].Set(v); err != nil {
			return fmt.Errorf("option %s: %q: %w", k, v, err)
		}
	}
	return nil
}

func indexOption(known []Option, name string) int {
	for i, o := range known {
		if o.Name == name {
			return i
		}
	}
	return -1
}

// Text is the setter of an option whose value is its text.
func Text[T ~string](dst *T) func(string) error {
	return func(v string) error {
		*dst = T(v)
		return nil
	}
}

// Bool is the setter of an option that is true or false.
func Bool(dst *bool) func(string) error {
	return func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("want true or false")
		}
		*dst = b
		return nil
	}
}

// Count is the setter of an option that is a whole number from lo to hi.
func Count[T ~int | ~int32 | ~int64](dst *T, lo, hi int) func(string) error {
	return func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return fmt.Errorf("want a number from %d to %d", lo, hi)
		}
		*dst = T(n)
		return nil
	}
}

// Duration is the setter of an option that is a positive duration.
func Duration(dst *time.Duration) func(string) error {
	return func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return errors.New("want a positive duration such as 500ms or 30s")
		}
		*dst = d
		return nil
	}
}

// Named is the entries of m (topic -> where it goes) with a value, nil
// when none has one: the topics a target does not send to its default.
func Named(m map[string]string) map[string]string {
	var out map[string]string
	for k, v := range m {
		if v == "" {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out
}

// topicFields names TopicMap's fields, in the order errors list them.
var topicFields = []string{"stream", "subject", "table", "path"}

func (m TopicMap) field(name string) string {
	switch name {
	case "stream":
		return m.Stream
	case "subject":
		return m.Subject
	case "table":
		return m.Table
	case "path":
		return m.Path
	}
	return ""
}

// TopicsOf is, for a target that reads one field of each topic's mapping
// (field: "stream", "subject", "table" or "path"), that field of each
// topic the sink maps (topic -> value; empty: the target's default). A
// topic that sets another field is an error naming it; target names the
// kind of sink in the error, such as "a webhook sink".
func (s Spec) TopicsOf(target, field string) (map[string]string, error) {
	topics := make([]string, 0, len(s.Topics))
	for t := range s.Topics {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	others := make([]string, 0, len(topicFields)-1)
	for _, f := range topicFields {
		if f != field {
			others = append(others, f)
		}
	}
	out := make(map[string]string, len(topics))
	for _, t := range topics {
		m := s.Topics[t]
		for _, f := range others {
			if m.field(f) != "" {
				return nil, fmt.Errorf("topic %s: %s reads %s only (not %s or %s)", t, target, field,
					strings.Join(others[:len(others)-1], ", "), others[len(others)-1])
			}
		}
		out[t] = m.field(field)
	}
	return out, nil
}

// RegisterConfig registers, for each of schemes, a target whose
// configuration config makes from a spec (the kind's Check: a mistake in
// it is found before anything connects) and open opens.
func RegisterConfig[C any](config func(Spec) (C, error), open func(context.Context, C) (Target, error), schemes ...string) {
	k := Kind{
		Check: func(spec Spec) error {
			_, err := config(spec)
			return err
		},
		Open: func(ctx context.Context, spec Spec) (Target, error) {
			c, err := config(spec)
			if err != nil {
				return nil, err
			}
			return open(ctx, c)
		},
	}
	for _, s := range schemes {
		Register(s, k)
	}
}
