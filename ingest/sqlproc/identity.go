package sqlproc

import (
	"encoding/json"
	"fmt"
	"math"

	"gopkg.in/yaml.v3"
)

// Definition is a processor's whole definition as one canonical JSON
// object: every field of its configuration by its YAML key (its SQL text,
// its input's description, its settings), keys sorted, empty fields left
// out. The same configuration gives the same bytes, and decoding them as
// YAML (JSON is YAML) gives the configuration back (see ParseDefinition).
// Name is not part of it.
func (c Config) Definition() ([]byte, error) {
	c.Name = ""
	y, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("sqlproc %s: definition: %w", c.Name, err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(y, &m); err != nil {
		return nil, fmt.Errorf("sqlproc %s: definition: %w", c.Name, err)
	}
	b, err := json.Marshal(m) // map keys sorted
	if err != nil {
		return nil, fmt.Errorf("sqlproc %s: definition: %w", c.Name, err)
	}
	return b, nil
}

// ParseDefinition reads a Definition back into the processor named name.
func ParseDefinition(name string, def []byte) (Config, error) {
	var c Config
	if err := yaml.Unmarshal(def, &c); err != nil {
		return c, fmt.Errorf("sqlproc %s: definition: %w", name, err)
	}
	c.Name = name
	return c, nil
}

// DefinitionVersion is the version a definition declares: its "version"
// key when it has one, else the highest version of its "migrations", else
// 1 (a processor with no versions declared).
func DefinitionVersion(def []byte) int {
	var m struct {
		Version    *float64 `json:"version"`
		Migrations []struct {
			Version float64 `json:"version"`
		} `json:"migrations"`
	}
	if json.Unmarshal(def, &m) != nil {
		return 1
	}
	if m.Version != nil && *m.Version >= 1 && *m.Version <= math.MaxInt32 {
		return int(*m.Version)
	}
	v := 1
	for _, mg := range m.Migrations {
		if mg.Version <= math.MaxInt32 {
			v = max(v, int(mg.Version))
		}
	}
	return v
}
