package webhook

import (
	"context"

	"github.com/outboxd/outboxd/sink"
)

// The URL schemes of a webhook sink, registered with package sink.
func init() {
	sink.RegisterConfig(configOf, func(_ context.Context, c Config) (sink.Target, error) {
		t, err := Open(c)
		if err != nil {
			return nil, err
		}
		return t, nil
	}, "https", "http")
}

// configOf is the configuration of a configured sink: its URL, its secret,
// each topic's path (none: the URL itself), its options by name.
func configOf(spec sink.Spec) (Config, error) {
	paths, err := spec.TopicsOf(target, "path")
	if err != nil {
		return Config{}, err
	}
	c, err := ConfigFrom(spec.Name, spec.URL.String(), spec.Secret, paths, spec.Options)
	if err != nil {
		return Config{}, err
	}
	c.Logger = spec.Logger
	return c, nil
}
