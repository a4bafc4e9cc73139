package pgtable

import (
	"context"
	"errors"

	"github.com/outboxd/outboxd/sink"
)

// The URL schemes of a PostgreSQL sink, registered with package sink.
func init() {
	sink.RegisterConfig(configOf, func(ctx context.Context, c Config) (sink.Target, error) {
		t, err := Open(ctx, c)
		if err != nil {
			return nil, err
		}
		return t, nil
	}, "postgres", "postgresql")
}

// configOf is the configuration of a configured sink: its URL is the DSN,
// each topic's table its own (none: options.table), its options by name.
func configOf(spec sink.Spec) (Config, error) {
	if spec.Secret != "" {
		return Config{}, errors.New("a PostgreSQL sink signs nothing: it takes no secret")
	}
	tables, err := spec.TopicsOf(target, "table")
	if err != nil {
		return Config{}, err
	}
	c, err := ConfigFrom(spec.Name, spec.URL.String(), tables, spec.Options)
	if err != nil {
		return Config{}, err
	}
	c.Logger = spec.Logger
	return c, nil
}
