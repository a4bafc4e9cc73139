package webhook

import (
	"context"
	"fmt"
	"sort"

	"github.com/outboxd/outboxd/sink"
)

// The URL schemes of a webhook sink, registered with package sink.
func init() {
	k := sink.Kind{Check: checkSpec, Open: openSpec}
	sink.Register("https", k)
	sink.Register("http", k)
}

// configOf is the configuration of a configured sink: its URL, its secret,
// each topic's path (none: the URL itself), its options by name.
func configOf(spec sink.Spec) (Config, error) {
	topics := make([]string, 0, len(spec.Topics))
	for t := range spec.Topics {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	paths := map[string]string{}
	for _, t := range topics {
		m := spec.Topics[t]
		if m.Stream != "" || m.Subject != "" || m.Table != "" {
			return Config{}, fmt.Errorf("topic %s: a webhook sink reads path only (not stream, subject or table)", t)
		}
		paths[t] = m.Path
	}
	c, err := ConfigFrom(spec.Name, spec.URL.String(), spec.Secret, paths, spec.Options)
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

func openSpec(_ context.Context, spec sink.Spec) (sink.Target, error) {
	c, err := configOf(spec)
	if err != nil {
		return nil, err
	}
	return Open(c)
}
