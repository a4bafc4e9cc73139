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
	if len(c.ReadFrom) > 0 {
		// What the processor reads is part of what it is: each source's
		// own definition, under "readFrom" (no configuration key).
		var srcs []readFromDef
		for _, r := range c.ReadFrom {
			d, err := r.Config.Definition()
			if err != nil {
				return nil, err
			}
			srcs = append(srcs, readFromDef{Feed: r.Feed, Processor: r.Config.Name, Tables: r.Tables, Definition: d})
		}
		m[readFromKey] = srcs
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
	var rf struct {
		ReadFrom []readFromDef `json:"readFrom"`
	}
	if err := json.Unmarshal(def, &rf); err != nil {
		return c, fmt.Errorf("sqlproc %s: definition: %w", name, err)
	}
	for _, r := range rf.ReadFrom {
		src, err := ParseDefinition(r.Processor, r.Definition)
		if err != nil {
			return c, fmt.Errorf("sqlproc %s: definition: reads %s: %w", name, r.Feed, err)
		}
		c.ReadFrom = append(c.ReadFrom, ReadSource{Feed: r.Feed, Config: src, Tables: r.Tables})
	}
	return c, nil
}

// readFromKey holds a definition's ReadFrom.
const readFromKey = "readFrom"

// readFromDef is a ReadSource in a definition.
type readFromDef struct {
	Feed       string          `json:"feed"`
	Processor  string          `json:"processor"`
	Tables     []string        `json:"tables,omitempty"`
	Definition json.RawMessage `json:"definition"`
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
