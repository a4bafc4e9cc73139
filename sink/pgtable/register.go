package pgtable

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/outboxd/outboxd/sink"
)

// The URL schemes of a PostgreSQL sink, registered with package sink.
func init() {
	k := sink.Kind{Check: checkSpec, Open: openSpec}
	sink.Register("postgres", k)
	sink.Register("postgresql", k)
}

// configOf is the configuration of a configured sink: its URL is the DSN,
// each topic's table its own (none: options.table), its options by name.
func configOf(spec sink.Spec) (Config, error) {
	if spec.Secret != "" {
		return Config{}, errors.New("a PostgreSQL sink signs nothing: it takes no secret")
	}
	topics := make([]string, 0, len(spec.Topics))
	for t := range spec.Topics {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	tables := map[string]string{}
	for _, t := range topics {
		m := spec.Topics[t]
		if m.Stream != "" || m.Subject != "" || m.Path != "" {
			return Config{}, fmt.Errorf("topic %s: a PostgreSQL sink reads table only (not stream, subject or path)", t)
		}
		tables[t] = m.Table
	}
	c, err := ConfigFrom(spec.Name, spec.URL.String(), tables, spec.Options)
	if err != nil {
		return Config{}, err
	}
	c.Logger = spec.Logger
	return c, nil
}

func checkSpec(spec sink.Spec) error {
	_, err := configOf(spec)
	return err
}

func openSpec(ctx context.Context, spec sink.Spec) (sink.Target, error) {
	c, err := configOf(spec)
	if err != nil {
		return nil, err
	}
	return Open(ctx, c)
}
